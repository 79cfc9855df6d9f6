//! A communicator as a value: the only place that calls NCCL with one.
//! Point-to-point and all-reduce calls take checked device views; the
//! communicator is destroyed on drop unless it was aborted (NCCL forbids
//! destroying an aborted one), and an [`AbortHandle`] lets the watchdog
//! abort it from its own thread, the one call NCCL allows from elsewhere.

use super::loader::{
    Nccl, NcclError, RawComm, Stream, UniqueId, NCCL_FLOAT32, NCCL_IN_PROGRESS, NCCL_SUM,
    NCCL_UINT32,
};
use crate::gpu::mem::{DeviceElem, DeviceView};
use cudarc::driver::{CudaContext, CudaStream};
use std::ffi::c_void;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// What a communicator and its abort handles share.
struct Shared {
    nccl: Arc<Nccl>,
    raw: RawComm,
    aborted: AtomicBool,
}

// SAFETY: the raw handle is only used by the owning `Comm` (one thread at a
// time, as NCCL requires) and by `abort`, which NCCL allows from any thread.
unsafe impl Send for Shared {}
// SAFETY: as above: shared access is limited to `abort` and the flag.
unsafe impl Sync for Shared {}

impl Shared {
    fn abort(&self) {
        if !self.aborted.swap(true, Ordering::SeqCst) {
            // SAFETY: a live communicator of this library, aborted once;
            // abort may be called at any time and unblocks its kernels.
            unsafe { (self.nccl.comm_abort)(self.raw) };
        }
    }
}

/// One rank's communicator.
pub struct Comm {
    shared: Arc<Shared>,
    /// Current while the communicator is destroyed.
    ctx: Arc<CudaContext>,
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
                aborted: AtomicBool::new(false),
            }),
            ctx: ctx.clone(),
        })
    }

    pub fn abort_handle(&self) -> AbortHandle {
        AbortHandle(self.shared.clone())
    }

    pub fn abort(&self) {
        self.shared.abort();
    }

    pub fn aborted(&self) -> bool {
        self.shared.aborted.load(Ordering::SeqCst)
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

    /// Enqueue NCCL's own float sum over `buf`, in place (the negative
    /// control: its order is NCCL's business).
    ///
    /// # Safety
    /// As for [`Comm::recv`].
    pub unsafe fn all_reduce_sum(
        &self,
        buf: DeviceView<'_, f32>,
        stream: &CudaStream,
    ) -> Result<(), NcclError> {
        let (p, n) = raw(buf);
        // SAFETY: per the contract above; in place over `n` f32s.
        let r = unsafe {
            (self.nccl().all_reduce)(
                p,
                p,
                n,
                NCCL_FLOAT32,
                NCCL_SUM,
                self.shared.raw,
                stream.cu_stream() as Stream,
            )
        };
        self.nccl().check(r, "ncclAllReduce")
    }

    /// The communicator's asynchronous error, if it has one (a peer died,
    /// a connection broke), with NCCL's last words on it.
    pub fn async_error(&self) -> Option<NcclError> {
        if self.aborted() {
            return None;
        }
        let mut state = 0;
        // SAFETY: out-parameter on a live, not aborted communicator.
        let r = unsafe { (self.nccl().comm_get_async_error)(self.shared.raw, &mut state) };
        let bad = if r != 0 { r } else { state };
        if bad == 0 || bad == NCCL_IN_PROGRESS {
            return None;
        }
        let mut e = self
            .nccl()
            .check(bad, "NCCL reported an asynchronous error")
            .err()?;
        // SAFETY: our live communicator, not aborted (checked above).
        e.detail = unsafe { self.nccl().last_error(self.shared.raw) };
        Some(e)
    }
}

impl Drop for Comm {
    fn drop(&mut self) {
        // Never destroy a communicator after an abort.
        if self.aborted() || self.ctx.bind_to_thread().is_err() {
            return;
        }
        // SAFETY: a live communicator, destroyed once, its context current.
        unsafe { (self.nccl().comm_destroy)(self.shared.raw) };
    }
}
