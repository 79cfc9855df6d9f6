//! Host bytes the device copies from where they lie: a file's bytes as
//! they are read, pinned in place (`cuMemHostRegister`) a piece at a time,
//! so an upload is the copy engine's work alone, with no copy through a
//! staging buffer on the host's cores.

use super::error::GpuError;
use super::mem::{DeviceElem, DeviceView};
use cudarc::driver::{sys, CudaContext, CudaEvent, CudaStream};
use std::sync::Arc;

/// What a pinned piece's start and end are aligned to: a page on every
/// host the driver supports (4 KiB and 64 KiB pages), so pieces pinned one
/// after another never share a page.
pub const PIN_ALIGN: usize = 64 << 10;

/// A prefix of one run of host bytes, pinned as it grows.
///
/// Every piece is unpinned on drop, after the last copy from the bytes has
/// passed; the value borrows the bytes, so they cannot be freed before.
pub struct PinnedInPlace<'a> {
    bytes: &'a [u8],
    /// Bytes `0 .. pinned` are pinned, in `pieces` (each one's start and
    /// end). The driver copies from one piece at a time: a copy from two
    /// is refused.
    pinned: usize,
    pieces: Vec<(usize, usize)>,
    /// Whether pieces are pinned for reading only (unpinning them costs
    /// half as much), which not every device supports.
    read_only: bool,
    /// Recorded after the last enqueued copy; `None` once waited for.
    pending: Option<CudaEvent>,
    ctx: Arc<CudaContext>,
}

impl<'a> PinnedInPlace<'a> {
    /// Nothing pinned yet.
    pub fn new(ctx: &Arc<CudaContext>) -> Self {
        PinnedInPlace {
            bytes: &[],
            pinned: 0,
            pieces: Vec::new(),
            read_only: true,
            pending: None,
            ctx: ctx.clone(),
        }
    }

    /// Bytes pinned, from the start.
    pub fn pinned(&self) -> usize {
        self.pinned
    }

    /// Pin `bytes` through `end` rounded down to [`PIN_ALIGN`]: `bytes` is
    /// the run as far as it is known now, the same start every call, at
    /// least as long as before, and starting on a page.
    pub fn pin_through(&mut self, bytes: &'a [u8], end: usize) -> Result<(), GpuError> {
        if !(bytes.as_ptr() as usize).is_multiple_of(PIN_ALIGN) {
            return Err(GpuError::bounds(
                "bytes to pin in place do not start on a page".to_string(),
            ));
        }
        if (!self.bytes.is_empty() && bytes.as_ptr() != self.bytes.as_ptr())
            || bytes.len() < self.bytes.len()
        {
            return Err(GpuError::bounds(
                "bytes to pin in place moved or shrank".to_string(),
            ));
        }
        self.bytes = bytes;
        let end = (end.min(bytes.len()) / PIN_ALIGN) * PIN_ALIGN;
        if end <= self.pinned {
            return Ok(());
        }
        let len = end - self.pinned;
        // The piece's start, in bytes the borrow covers.
        let at = bytes[self.pinned..end].as_ptr().cast_mut().cast();
        self.ctx
            .bind_to_thread()
            .map_err(|e| GpuError::driver("binding the context", e))?;
        let register = |flags| {
            // SAFETY: `at .. at + len` lies in `bytes`, starts and ends on a
            // page, and overlaps no piece pinned before. The pages stay
            // mapped while the borrow lives, and the drop unpins them.
            unsafe { sys::cuMemHostRegister_v2(at, len, flags) }.result()
        };
        if self.read_only {
            // CU_MEMHOSTREGISTER_READ_ONLY: the device only reads them.
            self.read_only = register(0x08).is_ok();
        }
        if !self.read_only {
            register(0)
                .map_err(|e| GpuError::driver(format!("cuMemHostRegister of {len} bytes"), e))?;
        }
        self.pieces.push((self.pinned, end));
        self.pinned = end;
        Ok(())
    }

    /// Enqueue a copy of pinned bytes `at .. at + dst.len() * size_of::<T>()`
    /// into `dst` on `stream`.
    ///
    /// # Safety
    /// `dst` must belong to the stream's context, stay allocated until the
    /// stream has passed this copy, and not be used by another stream
    /// meanwhile.
    pub unsafe fn upload_async<T: DeviceElem>(
        &mut self,
        at: usize,
        dst: DeviceView<'_, T>,
        stream: &CudaStream,
    ) -> Result<(), GpuError> {
        let len = dst.len() * size_of::<T>();
        if len > 0 && at.checked_add(len).is_none_or(|end| end > self.pinned) {
            return Err(GpuError::bounds(format!(
                "an upload of bytes {at}.. (+{len}) of which {} are pinned",
                self.pinned
            )));
        }
        if len == 0 {
            return Ok(());
        }
        let end = at + len;
        for &(from, to) in self.pieces.iter().filter(|&&(f, t)| f < end && t > at) {
            let (a, b) = (from.max(at), to.min(end));
            // SAFETY: the source lies in one piece of pinned bytes the
            // borrow keeps alive and nobody writes; `dst` per the contract
            // above, `a - at .. b - at` inside it.
            unsafe {
                sys::cuMemcpyHtoDAsync_v2(
                    dst.ptr() + (a - at) as u64,
                    self.bytes[a..b].as_ptr().cast(),
                    b - a,
                    stream.cu_stream(),
                )
            }
            .result()
            .map_err(|e| GpuError::driver("cuMemcpyHtoDAsync from pinned file bytes", e))?;
        }
        let done = stream
            .record_event(None)
            .map_err(|e| GpuError::driver("recording a pinned copy's event", e))?;
        self.pending = Some(done);
        Ok(())
    }
}

impl Drop for PinnedInPlace<'_> {
    fn drop(&mut self) {
        // Unpin only after the last copy has read the bytes; if the wait
        // fails the context is broken, and unpinning is what is left.
        if let Some(done) = self.pending.take() {
            let _ = done.synchronize();
        }
        if self.pieces.is_empty() || self.ctx.bind_to_thread().is_err() {
            return;
        }
        for (from, _) in self.pieces.drain(..) {
            let at = self.bytes[from..].as_ptr().cast_mut().cast();
            // SAFETY: a piece this value pinned, unpinned once.
            let _ = unsafe { sys::cuMemHostUnregister(at) };
        }
    }
}
