//! Raw device and pinned host allocations plus stream-ordered copies.
//!
//! Plain `cuMemAlloc` (context-scoped, not stream-ordered) so buffers are
//! valid on every stream of the context without cudarc's per-slice event
//! tracking; every slot is fully written before it is read, so nothing is
//! memset. Buffers are typed by their element ([`DeviceElem`]): flags and
//! digest words are `u32`, arenas `f32`, and nothing travels as another
//! type's bits.

use super::error::GpuError;
use crate::digest::ArenaHasher;
use crate::dtype::Dtype;
use cudarc::driver::{result, sys, CudaContext, CudaEvent, CudaStream};
use std::marker::PhantomData;
use std::sync::Arc;

/// Bytes of one arena element.
pub const F32: u64 = 4;

/// An element type that may cross between host and device as raw bytes.
///
/// # Safety
/// Implementors are plain data: `Copy`, no padding, no pointers, and every
/// bit pattern of their size is a valid value (a device write of any bits
/// may be read back as one).
pub unsafe trait DeviceElem: Copy + Default + Send + Sync + 'static {}

// SAFETY: primitive numbers: no padding, every bit pattern valid.
unsafe impl DeviceElem for f32 {}
// SAFETY: as above.
unsafe impl DeviceElem for u32 {}
// SAFETY: as above.
unsafe impl DeviceElem for u64 {}
// SAFETY: as above (a 16-bit dtype's bits).
unsafe impl DeviceElem for u16 {}

/// How an arena's elements sit in device memory: `f32` for float32 arenas,
/// `u16` (the dtype's bits) for bf16 and f16.
pub trait ArenaElem: DeviceElem {
    /// Bytes of one element.
    const BYTES: u64;
    /// Whether arenas of `dtype` are held in this type.
    fn holds(dtype: Dtype) -> bool;
    /// Hash values read back (`nan_free`: the device found no NaN there).
    fn hash(h: &mut ArenaHasher, vals: &[Self], nan_free: bool);
    /// Append the float32 carriers of `vals` (the host's form of an arena).
    fn carry(vals: &[Self], dtype: Dtype, out: &mut Vec<f32>);
    /// The device form of float32 carriers of `dtype` values (exact).
    fn from_carriers(vals: &[f32], dtype: Dtype) -> Vec<Self>;
}

impl ArenaElem for f32 {
    const BYTES: u64 = F32;
    fn holds(dtype: Dtype) -> bool {
        dtype.is_f32()
    }
    fn hash(h: &mut ArenaHasher, vals: &[f32], nan_free: bool) {
        if nan_free {
            h.update_nan_free(vals);
        } else {
            h.update(vals);
        }
    }
    fn carry(vals: &[f32], _: Dtype, out: &mut Vec<f32>) {
        out.extend_from_slice(vals);
    }
    fn from_carriers(vals: &[f32], _: Dtype) -> Vec<f32> {
        vals.to_vec()
    }
}

impl ArenaElem for u16 {
    const BYTES: u64 = 2;
    fn holds(dtype: Dtype) -> bool {
        !dtype.is_f32()
    }
    fn hash(h: &mut ArenaHasher, vals: &[u16], _: bool) {
        h.update_bits16(vals);
    }
    fn carry(vals: &[u16], dtype: Dtype, out: &mut Vec<f32>) {
        out.extend(vals.iter().map(|&b| dtype.widen(u32::from(b))));
    }
    fn from_carriers(vals: &[f32], dtype: Dtype) -> Vec<u16> {
        vals.iter().map(|&v| dtype.narrow(v) as u16).collect()
    }
}

fn bytes_of<T>(len: usize) -> Result<usize, GpuError> {
    len.max(1)
        .checked_mul(std::mem::size_of::<T>())
        .ok_or_else(|| GpuError::bounds(format!("an allocation of {len} elements overflows")))
}

fn bind(ctx: &CudaContext) -> Result<(), GpuError> {
    ctx.bind_to_thread()
        .map_err(|e| GpuError::driver("making the context current", e))
}

/// A device allocation of `len` elements, freed on drop.
pub struct DeviceBuffer<T: DeviceElem = f32> {
    ptr: sys::CUdeviceptr,
    len: usize,
    ctx: Arc<CudaContext>,
    _elem: PhantomData<T>,
}

impl<T: DeviceElem> DeviceBuffer<T> {
    pub fn alloc(ctx: &Arc<CudaContext>, len: usize) -> Result<Self, GpuError> {
        bind(ctx)?;
        let bytes = bytes_of::<T>(len)?;
        // SAFETY: the context is current on this thread.
        let ptr = unsafe { result::malloc_sync(bytes) }
            .map_err(|e| GpuError::driver(format!("cuMemAlloc of {bytes} bytes"), e))?;
        Ok(DeviceBuffer {
            ptr,
            len,
            ctx: ctx.clone(),
            _elem: PhantomData,
        })
    }

    pub fn ptr(&self) -> sys::CUdeviceptr {
        self.ptr
    }

    /// The whole allocation as a view.
    pub fn view(&self) -> DeviceView<'_, T> {
        DeviceView {
            ptr: self.ptr,
            len: self.len,
            _buf: PhantomData,
        }
    }

    /// Elements `start..start + len`, checked against the allocation.
    pub fn slice(&self, start: usize, len: usize) -> Result<DeviceView<'_, T>, GpuError> {
        self.view().slice(start, len)
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Blocking upload of `data` to the start of the buffer.
    pub fn upload(&self, data: &[T]) -> Result<(), GpuError> {
        self.upload_at(0, data)
    }

    /// Blocking upload of `data` over elements `start..start + data.len()`.
    pub fn upload_at(&self, start: usize, data: &[T]) -> Result<(), GpuError> {
        let dst = self.slice(start, data.len())?;
        if data.is_empty() {
            return Ok(());
        }
        bind(&self.ctx)?;
        // SAFETY: `dst` is a checked view of exactly `data.len()` elements.
        unsafe { result::memcpy_htod_sync(dst.ptr(), data) }
            .map_err(|e| GpuError::driver("cuMemcpyHtoD", e))?;
        // From pageable memory `cuMemcpyHtoD` returns once the data is
        // staged, before the DMA into `dst` is done, and our streams do not
        // wait for the legacy stream it ran on: a kernel launched next
        // could read the old bytes. Wait for that stream here.
        // SAFETY: the null stream of the current context.
        unsafe { result::stream::synchronize(std::ptr::null_mut()) }
            .map_err(|e| GpuError::driver("cuStreamSynchronize after cuMemcpyHtoD", e))
    }

    /// Blocking download of elements `start..start + out.len()` (the
    /// device must be idle for this range: the caller synchronized the
    /// writers).
    pub fn download(&self, start: usize, out: &mut [T]) -> Result<(), GpuError> {
        let src = self.slice(start, out.len())?;
        if out.is_empty() {
            return Ok(());
        }
        bind(&self.ctx)?;
        // SAFETY: `src` is a checked view of exactly `out.len()` elements;
        // synchronous copy.
        unsafe { result::memcpy_dtoh_sync(out, src.ptr()) }
            .map_err(|e| GpuError::driver("cuMemcpyDtoH", e))
    }

    /// The whole buffer read back (blocking, as [`DeviceBuffer::download`]).
    pub fn to_host(&self) -> Result<Vec<T>, GpuError> {
        let mut out = vec![T::default(); self.len];
        self.download(0, &mut out)?;
        Ok(out)
    }
}

/// A window of elements inside one [`DeviceBuffer`], alive no longer than
/// it. Device address arithmetic goes through [`DeviceView::slice`], which
/// checks the bounds, so a wrong offset is an error rather than a write
/// into a neighbouring allocation.
#[derive(Debug)]
pub struct DeviceView<'a, T: DeviceElem = f32> {
    ptr: sys::CUdeviceptr,
    len: usize,
    _buf: PhantomData<&'a DeviceBuffer<T>>,
}

impl<T: DeviceElem> Clone for DeviceView<'_, T> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<T: DeviceElem> Copy for DeviceView<'_, T> {}

impl<'a, T: DeviceElem> DeviceView<'a, T> {
    pub fn ptr(self) -> sys::CUdeviceptr {
        self.ptr
    }

    pub fn len(self) -> usize {
        self.len
    }

    pub fn is_empty(self) -> bool {
        self.len == 0
    }

    /// Elements `start..start + len` of this view.
    pub fn slice(self, start: usize, len: usize) -> Result<DeviceView<'a, T>, GpuError> {
        match start.checked_add(len) {
            Some(end) if end <= self.len => Ok(DeviceView {
                ptr: self.ptr + (start * std::mem::size_of::<T>()) as u64,
                len,
                _buf: PhantomData,
            }),
            _ => Err(GpuError::bounds(format!(
                "device range {start}..{} outside a buffer of {} elements",
                start as u128 + len as u128,
                self.len
            ))),
        }
    }
}

impl<T: DeviceElem> Drop for DeviceBuffer<T> {
    fn drop(&mut self) {
        // A failed free leaks device memory; nothing else to do in drop.
        if self.ctx.bind_to_thread().is_ok() {
            // SAFETY: allocated by cuMemAlloc in this context, freed once.
            let _ = unsafe { result::free_sync(self.ptr) };
        }
    }
}

/// Page-locked host memory that asynchronous device-to-host copies fill,
/// or that asynchronous host-to-device copies send from.
///
/// The buffer remembers the event that marks the end of its last copy
/// either way: [`PinnedBuffer::values`] and [`PinnedBuffer::values_mut`]
/// wait for it before lending the memory out, and so does a new copy and
/// the drop. Safe code therefore cannot read
/// (or free) host memory a copy is still writing; that holds even if a
/// caller forgets about the buffer, because the event is inside it.
pub struct PinnedBuffer {
    ptr: *mut f32,
    len: usize,
    /// Recorded after the last enqueued fill; `None` once waited for.
    pending: Option<CudaEvent>,
    ctx: Arc<CudaContext>,
}

// SAFETY: plain host memory owned by this value; every access goes through
// `&mut self` after the pending copy completed.
unsafe impl Send for PinnedBuffer {}

impl PinnedBuffer {
    pub fn alloc(ctx: &Arc<CudaContext>, len: usize) -> Result<Self, GpuError> {
        bind(ctx)?;
        let bytes = bytes_of::<f32>(len)?;
        // SAFETY: context current; flags 0 = the default pinning.
        let ptr = unsafe { result::malloc_host(bytes, 0) }
            .map_err(|e| GpuError::driver(format!("cuMemHostAlloc of {bytes} bytes"), e))?;
        Ok(PinnedBuffer {
            ptr: ptr.cast(),
            len,
            pending: None,
            ctx: ctx.clone(),
        })
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Block until the last fill has landed.
    fn settle(&mut self) -> Result<(), GpuError> {
        if let Some(done) = self.pending.take() {
            done.synchronize()
                .map_err(|e| GpuError::driver("waiting for a pinned copy", e))?;
        }
        Ok(())
    }

    /// Enqueue a copy of `src` into the buffer's start on `stream`. An
    /// earlier fill is waited for first, so two copies never race over
    /// the same host memory.
    ///
    /// # Safety
    /// `src` must stay allocated and unwritten until the stream has passed
    /// this copy. (Reading the buffer early is not possible: see
    /// [`PinnedBuffer::values`].)
    pub unsafe fn fill_async<T: DeviceElem>(
        &mut self,
        src: DeviceView<'_, T>,
        stream: &CudaStream,
    ) -> Result<(), GpuError> {
        self.settle()?;
        let count = src.len();
        if count > self.capacity::<T>() {
            return Err(GpuError::bounds(format!(
                "a pinned copy of {count} elements into a buffer of {}",
                self.len
            )));
        }
        if count == 0 {
            return Ok(());
        }
        // SAFETY: per the contract above; the pinned region holds `count`
        // elements and no earlier copy into it is in flight (settled above).
        let r = unsafe {
            sys::cuMemcpyDtoHAsync_v2(
                self.ptr.cast(),
                src.ptr(),
                count * size_of::<T>(),
                stream.cu_stream(),
            )
        };
        r.result()
            .map_err(|e| GpuError::driver("cuMemcpyDtoHAsync", e))?;
        let done = stream
            .record_event(None)
            .map_err(|e| GpuError::driver("recording a pinned copy's event", e))?;
        self.pending = Some(done);
        Ok(())
    }

    /// The first `count` values to write, once the last copy has completed
    /// (this waits for it), e.g. to fill before [`PinnedBuffer::upload_async`].
    pub fn values_mut<T: DeviceElem>(&mut self, count: usize) -> Result<&mut [T], GpuError> {
        self.settle()?;
        let count = count.min(self.capacity::<T>());
        // SAFETY: as in `values`; the borrow is unique through `&mut self`.
        Ok(unsafe { std::slice::from_raw_parts_mut(self.ptr.cast::<T>(), count) })
    }

    /// How many `T` the buffer holds (its length counts f32s).
    fn capacity<T: DeviceElem>(&self) -> usize {
        self.len * 4 / size_of::<T>()
    }

    /// Enqueue a copy of the buffer's first `dst.len()` values into `dst`
    /// on `stream`; the host memory is not lent out again until the copy
    /// has passed.
    ///
    /// # Safety
    /// `dst` must belong to the stream's context, stay allocated until the
    /// stream has passed this copy, and not be used by another stream
    /// meanwhile.
    pub unsafe fn upload_async<T: DeviceElem>(
        &mut self,
        dst: DeviceView<'_, T>,
        stream: &CudaStream,
    ) -> Result<(), GpuError> {
        self.settle()?;
        let count = dst.len();
        if count > self.capacity::<T>() {
            return Err(GpuError::bounds(format!(
                "a pinned upload of {count} elements from a buffer of {}",
                self.len
            )));
        }
        if count == 0 {
            return Ok(());
        }
        // SAFETY: per the contract above; the pinned region holds `count`
        // elements and nothing writes it until `pending` has passed.
        let r = unsafe {
            sys::cuMemcpyHtoDAsync_v2(
                dst.ptr(),
                self.ptr.cast(),
                count * size_of::<T>(),
                stream.cu_stream(),
            )
        };
        r.result()
            .map_err(|e| GpuError::driver("cuMemcpyHtoDAsync", e))?;
        let done = stream
            .record_event(None)
            .map_err(|e| GpuError::driver("recording a pinned copy's event", e))?;
        self.pending = Some(done);
        Ok(())
    }

    /// The first `count` values, once the last fill has completed (this
    /// waits for it).
    pub fn values<T: DeviceElem>(&mut self, count: usize) -> Result<&[T], GpuError> {
        self.settle()?;
        let count = count.min(self.capacity::<T>());
        // SAFETY: `ptr` holds `len` f32s (as many bytes as `capacity` Ts,
        // page-aligned) for the buffer's lifetime, and no copy into it is
        // in flight (settled above; a new one needs `&mut self`, which the
        // returned borrow excludes). Every bit pattern is a valid T.
        Ok(unsafe { std::slice::from_raw_parts(self.ptr.cast::<T>(), count) })
    }
}

impl Drop for PinnedBuffer {
    fn drop(&mut self) {
        // Never free memory a copy is still writing; if the wait fails the
        // context is broken, and freeing is what is left to try.
        let _ = self.settle();
        if self.ctx.bind_to_thread().is_ok() {
            // SAFETY: allocated by cuMemHostAlloc, freed once.
            let _ = unsafe { result::free_host(self.ptr.cast()) };
        }
    }
}

/// Enqueue a device-to-device copy of `src` into `dst` (equal lengths).
///
/// # Safety
/// Both views must belong to the stream's context, stay allocated until the
/// stream has passed the copy, not overlap, and not be written by another
/// stream meanwhile. (Bounds are the views' business.)
pub unsafe fn copy_d2d<T: DeviceElem>(
    dst: DeviceView<'_, T>,
    src: DeviceView<'_, T>,
    stream: &CudaStream,
) -> Result<(), GpuError> {
    if dst.len() != src.len() {
        return Err(GpuError::bounds(format!(
            "a device-to-device copy of {} elements into {}",
            src.len(),
            dst.len()
        )));
    }
    if src.is_empty() {
        return Ok(());
    }
    let bytes = src.len() * std::mem::size_of::<T>();
    // SAFETY: per the contract above; lengths checked equal.
    unsafe { result::memcpy_dtod_async(dst.ptr(), src.ptr(), bytes, stream.cu_stream()) }
        .map_err(|e| GpuError::driver("device-to-device copy", e))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn view<T: DeviceElem>(ptr: u64, len: usize) -> DeviceView<'static, T> {
        DeviceView {
            ptr,
            len,
            _buf: PhantomData,
        }
    }

    #[test]
    fn slices_are_checked_against_the_view() {
        let v = view::<f32>(0x1000, 10);
        let s = v.slice(2, 8).unwrap();
        assert_eq!((s.ptr(), s.len()), (0x1000 + 8, 8));
        let t = s.slice(8, 0).unwrap();
        assert_eq!((t.ptr(), t.len()), (0x1000 + 40, 0));
        // One past the end, and offsets that overflow, are refused.
        assert!(v.slice(2, 9).is_err());
        assert!(s.slice(1, 8).is_err());
        let e = v.slice(usize::MAX, 2).unwrap_err();
        assert!(e.to_string().contains("outside a buffer of 10"), "{e}");
        assert_eq!(
            e.fault(),
            crate::gpu::error::GpuFault::Broken,
            "a host-side range mistake is no missing resource"
        );
    }

    #[test]
    fn offsets_scale_with_the_element_size() {
        assert_eq!(view::<u64>(0x1000, 4).slice(3, 1).unwrap().ptr(), 0x1018);
        assert_eq!(view::<u32>(0x1000, 4).slice(3, 1).unwrap().ptr(), 0x100c);
        assert!(bytes_of::<u64>(usize::MAX / 4).is_err());
    }
}
