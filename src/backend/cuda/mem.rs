//! Raw device and pinned host allocations plus stream-ordered copies.
//!
//! Plain `cuMemAlloc` (context-scoped, not stream-ordered) so buffers are
//! valid on every stream of the context without cudarc's per-slice event
//! tracking; every slot is fully written before it is read, so nothing is
//! memset.

use super::driver_error_text;
use cudarc::driver::{result, sys, CudaContext, CudaStream};
use std::marker::PhantomData;
use std::sync::Arc;

pub const F32: u64 = 4;

/// A device allocation of `len` f32s, freed on drop.
pub struct DeviceBuffer {
    ptr: sys::CUdeviceptr,
    len: usize,
    ctx: Arc<CudaContext>,
}

impl DeviceBuffer {
    pub fn alloc(ctx: &Arc<CudaContext>, len: usize) -> Result<Self, String> {
        ctx.bind_to_thread().map_err(driver_error_text)?;
        let bytes = len
            .max(1)
            .checked_mul(4)
            .ok_or("allocation size overflows")?;
        // SAFETY: the context is current on this thread.
        let ptr = unsafe { result::malloc_sync(bytes) }
            .map_err(|e| format!("cuMemAlloc of {bytes} bytes: {}", driver_error_text(e)))?;
        Ok(DeviceBuffer {
            ptr,
            len,
            ctx: ctx.clone(),
        })
    }

    pub fn ptr(&self) -> sys::CUdeviceptr {
        self.ptr
    }

    /// The whole allocation as a view.
    pub fn view(&self) -> DeviceView<'_> {
        DeviceView {
            ptr: self.ptr,
            len: self.len,
            _buf: PhantomData,
        }
    }

    /// Elements `start..start + len`, checked against the allocation.
    pub fn slice(&self, start: usize, len: usize) -> Result<DeviceView<'_>, String> {
        self.view().slice(start, len)
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Blocking upload of `data` to the start of the buffer.
    pub fn upload<T: Copy>(&self, data: &[T]) -> Result<(), String> {
        if std::mem::size_of_val(data) > self.len.max(1) * 4 {
            return Err("upload larger than the buffer".into());
        }
        if data.is_empty() {
            return Ok(());
        }
        self.ctx.bind_to_thread().map_err(driver_error_text)?;
        // SAFETY: size checked above; `cuMemcpyHtoD` is synchronous.
        unsafe { result::memcpy_htod_sync(self.ptr, data) }.map_err(driver_error_text)
    }

    /// Blocking upload of `data` over elements `start..start + data.len()`.
    pub fn upload_at(&self, start: usize, data: &[f32]) -> Result<(), String> {
        let dst = self.slice(start, data.len())?;
        if data.is_empty() {
            return Ok(());
        }
        self.ctx.bind_to_thread().map_err(driver_error_text)?;
        // SAFETY: `dst` is a checked view of exactly `data.len()` f32s;
        // `cuMemcpyHtoD` is synchronous.
        unsafe { result::memcpy_htod_sync(dst.ptr(), data) }.map_err(driver_error_text)
    }

    /// Blocking download of the first `out.len()` f32s (device must be idle
    /// for this range: the caller synchronized the writers).
    pub fn download(&self, start: usize, out: &mut [f32]) -> Result<(), String> {
        if start + out.len() > self.len {
            return Err("download past the end of the buffer".into());
        }
        if out.is_empty() {
            return Ok(());
        }
        self.ctx.bind_to_thread().map_err(driver_error_text)?;
        // SAFETY: range checked above; synchronous copy.
        unsafe { result::memcpy_dtoh_sync(out, self.slice(start, out.len())?.ptr()) }
            .map_err(driver_error_text)
    }
}

/// A window of f32s inside one [`DeviceBuffer`], alive no longer than it.
/// Device address arithmetic goes through [`DeviceView::slice`], which
/// checks the bounds, so a wrong offset is an error rather than a write
/// into a neighbouring allocation.
#[derive(Debug, Clone, Copy)]
pub struct DeviceView<'a> {
    ptr: sys::CUdeviceptr,
    len: usize,
    _buf: PhantomData<&'a DeviceBuffer>,
}

impl<'a> DeviceView<'a> {
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
    pub fn slice(self, start: usize, len: usize) -> Result<DeviceView<'a>, String> {
        match start.checked_add(len) {
            Some(end) if end <= self.len => Ok(DeviceView {
                ptr: self.ptr + start as u64 * F32,
                len,
                _buf: PhantomData,
            }),
            _ => Err(format!(
                "device range {start}..{} outside a buffer of {} f32s",
                start as u128 + len as u128,
                self.len
            )),
        }
    }
}

impl Drop for DeviceBuffer {
    fn drop(&mut self) {
        // A failed free leaks device memory; nothing else to do in drop.
        if self.ctx.bind_to_thread().is_ok() {
            // SAFETY: allocated by cuMemAlloc in this context, freed once.
            let _ = unsafe { result::free_sync(self.ptr) };
        }
    }
}

/// Page-locked host memory for async device-to-host copies.
pub struct PinnedBuffer {
    ptr: *mut f32,
    len: usize,
    ctx: Arc<CudaContext>,
}

// SAFETY: plain host memory; access is coordinated by the owner.
unsafe impl Send for PinnedBuffer {}

impl PinnedBuffer {
    pub fn alloc(ctx: &Arc<CudaContext>, len: usize) -> Result<Self, String> {
        ctx.bind_to_thread().map_err(driver_error_text)?;
        let bytes = len.max(1) * 4;
        // SAFETY: context current; flags 0 = portable-less default pinning.
        let ptr = unsafe { result::malloc_host(bytes, 0) }
            .map_err(|e| format!("cuMemHostAlloc of {bytes} bytes: {}", driver_error_text(e)))?;
        Ok(PinnedBuffer {
            ptr: ptr.cast(),
            len,
            ctx: ctx.clone(),
        })
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Enqueue a copy of `src` into the buffer's start.
    ///
    /// # Safety
    /// `src` must stay allocated and unwritten until the stream has passed
    /// this copy, and the buffer must not be read before then.
    pub unsafe fn fill_async(
        &mut self,
        src: DeviceView<'_>,
        stream: &CudaStream,
    ) -> Result<(), String> {
        let count = src.len();
        if count > self.len {
            return Err("pinned copy larger than the buffer".into());
        }
        if count == 0 {
            return Ok(());
        }
        // SAFETY: per the contract above; the pinned region holds `count`.
        let r = unsafe {
            sys::cuMemcpyDtoHAsync_v2(self.ptr.cast(), src.ptr(), count * 4, stream.cu_stream())
        };
        r.result().map_err(driver_error_text)
    }

    /// The first `count` values (only after the filling copy completed).
    pub fn values(&self, count: usize) -> &[f32] {
        let count = count.min(self.len);
        // SAFETY: `ptr` holds `len` f32s for the buffer's lifetime.
        unsafe { std::slice::from_raw_parts(self.ptr, count) }
    }
}

impl Drop for PinnedBuffer {
    fn drop(&mut self) {
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
pub unsafe fn copy_d2d(
    dst: DeviceView<'_>,
    src: DeviceView<'_>,
    stream: &CudaStream,
) -> Result<(), String> {
    if dst.len() != src.len() {
        return Err(format!(
            "device-to-device copy of {} f32s into {}",
            src.len(),
            dst.len()
        ));
    }
    if src.is_empty() {
        return Ok(());
    }
    // SAFETY: per the contract above; lengths checked equal.
    unsafe { result::memcpy_dtod_async(dst.ptr(), src.ptr(), src.len() * 4, stream.cu_stream()) }
        .map_err(|e| format!("device-to-device copy: {}", driver_error_text(e)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn view(ptr: u64, len: usize) -> DeviceView<'static> {
        DeviceView {
            ptr,
            len,
            _buf: PhantomData,
        }
    }

    #[test]
    fn slices_are_checked_against_the_view() {
        let v = view(0x1000, 10);
        let s = v.slice(2, 8).unwrap();
        assert_eq!((s.ptr(), s.len()), (0x1000 + 8, 8));
        let t = s.slice(8, 0).unwrap();
        assert_eq!((t.ptr(), t.len()), (0x1000 + 40, 0));
        // One past the end, and offsets that overflow, are refused.
        assert!(v.slice(2, 9).is_err());
        assert!(s.slice(1, 8).is_err());
        let e = v.slice(usize::MAX, 2).unwrap_err();
        assert!(e.contains("outside a buffer of 10"), "{e}");
    }
}
