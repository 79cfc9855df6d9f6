//! A communicator as a value: the only place that calls NCCL with one.
//! Point-to-point and all-reduce calls take checked device views; the
//! communicator is destroyed on drop unless it was aborted (NCCL forbids
//! destroying an aborted one), and an [`AbortHandle`] lets the watchdog
//! abort it from its own thread, the one call NCCL allows from elsewhere.
//!
//! Abort, the asynchronous-error poll and destroy share one lock over the
//! communicator's life, so the watchdog can never free the communicator
//! between a poll's "still live?" and its call. A [`Comm`] is `!Sync`: its
//! enqueue calls come from the one thread that owns it.

use super::loader::{
    Nccl, NcclError, RawComm, Stream, UniqueId, NCCL_AVG, NCCL_BFLOAT16, NCCL_FLOAT16,
    NCCL_FLOAT32, NCCL_INVALID_ARGUMENT, NCCL_IN_PROGRESS, NCCL_SUM, NCCL_UINT32,
};
use crate::dtype::Dtype;
use crate::gpu::mem::{DeviceElem, DeviceView};
use cudarc::driver::{CudaContext, CudaStream};
use std::cell::Cell;
use std::ffi::c_void;
use std::marker::PhantomData;
use std::sync::{Arc, Mutex, MutexGuard};

/// Where a communicator is in its life; only `Live` may be used.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Life {
    Live,
    Aborted,
    Destroyed,
}

/// What a communicator and its abort handles share.
struct Shared {
    nccl: Arc<Nccl>,
    raw: RawComm,
    life: Mutex<Life>,
}

// SAFETY: the raw handle is used by the owning `Comm` (which is `!Sync`, so
// one thread at a time, as NCCL requires) and, under `life`'s lock, by
// `abort`, which NCCL allows from any thread.
unsafe impl Send for Shared {}
// SAFETY: as above: from other threads only `abort` runs, under the lock.
unsafe impl Sync for Shared {}

impl Shared {
    fn life(&self) -> MutexGuard<'_, Life> {
        // A panic while holding the lock leaves a valid `Life`.
        self.life.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn abort(&self) {
        let mut life = self.life();
        if *life == Life::Live {
            // SAFETY: a live communicator of this library (checked under
            // the lock that destroy and the error poll take), aborted once;
            // abort may be called at any time and unblocks its kernels.
            unsafe { (self.nccl.comm_abort)(self.raw) };
            *life = Life::Aborted;
        }
    }
}

/// One rank's communicator.
pub struct Comm {
    shared: Arc<Shared>,
    /// Current while the communicator is destroyed.
    ctx: Arc<CudaContext>,
    /// `!Sync`: NCCL wants one thread at a time on a communicator.
    _one_thread: PhantomData<Cell<()>>,
}

/// Aborts a communicator from another thread (the watchdog's).
#[derive(Clone)]
pub struct AbortHandle(Arc<Shared>);

impl AbortHandle {
    pub fn abort(&self) {
        self.0.abort();
    }
}

/// An element type with an NCCL datatype of the same size.
pub trait NcclElem: DeviceElem {
    /// `ncclDataType_t`.
    const DATATYPE: i32;
}

impl NcclElem for f32 {
    const DATATYPE: i32 = NCCL_FLOAT32;
}

impl NcclElem for u32 {
    const DATATYPE: i32 = NCCL_UINT32;
}

/// A 16-bit dtype's bits: moved (never reduced) as NCCL's 2-byte float.
impl NcclElem for u16 {
    const DATATYPE: i32 = NCCL_FLOAT16;
}

/// NCCL's datatype of `dtype`, what torch.distributed passes for a tensor
/// of it.
pub const fn wire_type(dtype: Dtype) -> i32 {
    match dtype {
        Dtype::F32 => NCCL_FLOAT32,
        Dtype::Bf16 => NCCL_BFLOAT16,
        Dtype::F16 => NCCL_FLOAT16,
    }
}

/// Elements of a view as NCCL's count and address.
fn raw<T: DeviceElem>(v: DeviceView<'_, T>) -> (*mut c_void, usize) {
    (v.ptr() as *mut c_void, v.len())
}

impl Comm {
    /// `ncclCommInitRank` for `rank` of `world` on the device of `ctx`,
    /// which is made current first. Blocks until every rank has joined.
    pub fn init(
        nccl: &Arc<Nccl>,
        ctx: &Arc<CudaContext>,
        world: usize,
        rank: usize,
        id: UniqueId,
    ) -> Result<Comm, crate::gpu::error::GpuError> {
        ctx.bind_to_thread()
            .map_err(|e| crate::gpu::error::GpuError::driver("making the context current", e))?;
        let mut raw: RawComm = std::ptr::null_mut();
        // SAFETY: out-parameter; `id` is the job's unique id.
        let r = unsafe { (nccl.comm_init_rank)(&mut raw, world as i32, id, rank as i32) };
        nccl.check(r, format!("ncclCommInitRank (rank {rank} of {world})"))?;
        Ok(Comm {
            shared: Arc::new(Shared {
                nccl: nccl.clone(),
                raw,
                life: Mutex::new(Life::Live),
            }),
            ctx: ctx.clone(),
            _one_thread: PhantomData,
        })
    }

    pub fn abort_handle(&self) -> AbortHandle {
        AbortHandle(self.shared.clone())
    }

    pub fn abort(&self) {
        self.shared.abort();
    }

    pub fn aborted(&self) -> bool {
        *self.shared.life() == Life::Aborted
    }

    fn nccl(&self) -> &Nccl {
        &self.shared.nccl
    }

    /// Run `calls` between `ncclGroupStart` and `ncclGroupEnd`; the group
    /// is ended even when a call inside it failed.
    pub fn group<E: From<NcclError>>(
        &self,
        phase: &str,
        calls: impl FnOnce(&Comm) -> Result<(), E>,
    ) -> Result<(), E> {
        // SAFETY: no arguments; pairs with the end below.
        let r = unsafe { (self.nccl().group_start)() };
        self.nccl().check(r, format!("{phase}: ncclGroupStart"))?;
        let inside = calls(self);
        // SAFETY: closes the group opened above.
        let r = unsafe { (self.nccl().group_end)() };
        inside?;
        Ok(self.nccl().check(r, format!("{phase}: ncclGroupEnd"))?)
    }

    /// Enqueue a send of `buf` to `peer` on `stream`.
    ///
    /// # Safety
    /// `buf` must belong to this rank's context and stay allocated and
    /// unwritten until `stream` has passed the send.
    pub unsafe fn send<T: NcclElem>(
        &self,
        buf: DeviceView<'_, T>,
        peer: usize,
        stream: &CudaStream,
    ) -> Result<(), NcclError> {
        let (p, n) = raw(buf);
        // SAFETY: per the contract above; `n` f32s at `p`.
        let r = unsafe {
            (self.nccl().send)(
                p,
                n,
                T::DATATYPE,
                peer as i32,
                self.shared.raw,
                stream.cu_stream() as Stream,
            )
        };
        self.nccl().check(r, format!("ncclSend to rank {peer}"))
    }

    /// Enqueue a receive from `peer` into `buf` on `stream`.
    ///
    /// # Safety
    /// `buf` must belong to this rank's context, stay allocated until
    /// `stream` has passed the receive, and not be read or written by
    /// anything else meanwhile.
    pub unsafe fn recv<T: NcclElem>(
        &self,
        buf: DeviceView<'_, T>,
        peer: usize,
        stream: &CudaStream,
    ) -> Result<(), NcclError> {
        let (p, n) = raw(buf);
        // SAFETY: per the contract above; room for `n` f32s at `p`.
        let r = unsafe {
            (self.nccl().recv)(
                p,
                n,
                T::DATATYPE,
                peer as i32,
                self.shared.raw,
                stream.cu_stream() as Stream,
            )
        };
        self.nccl().check(r, format!("ncclRecv from rank {peer}"))
    }

    /// Enqueue NCCL's own sum over `buf` in the wire dtype, in place (the
    /// negative control: its order and its roundings are NCCL's business).
    ///
    /// # Safety
    /// As for [`Comm::recv`].
    pub unsafe fn all_reduce_sum<T: NcclElem>(
        &self,
        buf: DeviceView<'_, T>,
        wire: Dtype,
        stream: &CudaStream,
    ) -> Result<(), NcclError> {
        if wire.bytes() != size_of::<T>() {
            return Err(NcclError {
                op: "ncclAllReduce".to_string().into(),
                code: NCCL_INVALID_ARGUMENT,
                text: format!("a {wire} sum over {}-byte elements", size_of::<T>()),
                detail: None,
            });
        }
        let (p, n) = raw(buf);
        // SAFETY: per the contract above; in place over `n` elements of
        // `wire`, NCCL's sum in that type.
        let r = unsafe {
            (self.nccl().all_reduce)(
                p,
                p,
                n,
                wire_type(wire),
                NCCL_SUM,
                self.shared.raw,
                stream.cu_stream() as Stream,
            )
        };
        self.nccl().check(r, "ncclAllReduce")
    }

    /// Enqueue NCCL's own reduce-scatter over `buf` (W equal shards) in the
    /// wire dtype, in place: this rank's shard `rank` of `buf` receives
    /// NCCL's sum (`mean`: `ncclAvg`, FSDP2's default op) of every rank's
    /// copy of it. Its order and roundings are NCCL's.
    ///
    /// # Safety
    /// As for [`Comm::recv`].
    pub unsafe fn reduce_scatter<T: NcclElem>(
        &self,
        buf: DeviceView<'_, T>,
        rank: usize,
        world: usize,
        wire: Dtype,
        mean: bool,
        stream: &CudaStream,
    ) -> Result<(), NcclError> {
        let invalid = |text: String| NcclError {
            op: "ncclReduceScatter".to_string().into(),
            code: NCCL_INVALID_ARGUMENT,
            text,
            detail: None,
        };
        if wire.bytes() != size_of::<T>() {
            return Err(invalid(format!(
                "a {wire} reduce-scatter over {}-byte elements",
                size_of::<T>()
            )));
        }
        if world == 0 || !buf.len().is_multiple_of(world) || rank >= world {
            return Err(invalid(format!(
                "{} elements do not split into {world} equal shards (rank {rank})",
                buf.len()
            )));
        }
        let count = buf.len() / world;
        let (p, _) = raw(buf);
        let mine = buf
            .slice(rank * count, count)
            .map_err(|e| invalid(e.to_string()))?;
        let (q, _) = raw(mine);
        let op = if mean { NCCL_AVG } else { NCCL_SUM };
        // SAFETY: per the contract above; `buf` holds `world * count`
        // elements of `wire` and the receive is its own shard, NCCL's
        // in-place form (recvbuff = sendbuff + rank * recvcount).
        let r = unsafe {
            (self.nccl().reduce_scatter)(
                p,
                q,
                count,
                wire_type(wire),
                op,
                self.shared.raw,
                stream.cu_stream() as Stream,
            )
        };
        self.nccl().check(r, "ncclReduceScatter")
    }

    /// The communicator's asynchronous error, if it has one (a peer died,
    /// a connection broke), with NCCL's last words on it.
    pub fn async_error(&self) -> Option<NcclError> {
        // Held across both calls, so an abort cannot free the communicator
        // in between; neither call blocks.
        let life = self.shared.life();
        if *life != Life::Live {
            return None;
        }
        let mut state = 0;
        // SAFETY: out-parameter on a live communicator (checked under the lock).
        let r = unsafe { (self.nccl().comm_get_async_error)(self.shared.raw, &mut state) };
        let bad = if r != 0 { r } else { state };
        if bad == 0 || bad == NCCL_IN_PROGRESS {
            return None;
        }
        let mut e = self
            .nccl()
            .check(bad, "NCCL reported an asynchronous error")
            .err()?;
        // SAFETY: still live: the lock is held.
        e.detail = unsafe { self.nccl().last_error(self.shared.raw) };
        drop(life);
        Some(e)
    }
}

impl Drop for Comm {
    fn drop(&mut self) {
        // Never destroy a communicator after an abort. The lock is not held
        // across the destroy, which may wait on the peers: a watchdog abort
        // must still get through. Marking it destroyed first makes a later
        // abort a no-op instead of a use after free.
        {
            let mut life = self.shared.life();
            if *life != Life::Live || self.ctx.bind_to_thread().is_err() {
                return;
            }
            *life = Life::Destroyed;
        }
        // SAFETY: a communicator that was live a moment ago and that nobody
        // else may now abort or poll; destroyed once, its context current.
        unsafe { (self.nccl().comm_destroy)(self.shared.raw) };
    }
}

// `Comm` must stay `!Sync`: if it became `Sync`, both impls below would
// apply, the type parameter could not be inferred, and this would not
// compile (tried: with `PhantomData<Arc<()>>` in place of the `Cell`).
trait AmbiguousIfSync<A> {
    fn check() {}
}
impl<T: ?Sized> AmbiguousIfSync<()> for T {}
impl<T: ?Sized + Sync> AmbiguousIfSync<u8> for T {}
const _: fn() = || <Comm as AmbiguousIfSync<_>>::check();
