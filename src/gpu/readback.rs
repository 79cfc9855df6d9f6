//! Reading an arena back to the host and hashing it: one host thread's
//! stream and two pinned chunks, so one chunk is copied while the other is
//! hashed, with the device saying which spans hold a NaN. Both GPU
//! backends digest their ranks' copies through this.

use super::device::Device;
use super::error::GpuError;
use super::mem::{ArenaElem, DeviceBuffer, DeviceView, PinnedBuffer};
use crate::digest::{ArenaHasher, ChunkedDigest, NanPolicy, CHUNK_ELEMS};
use crate::dtype::Dtype;
use cudarc::driver::{CudaEvent, CudaStream};
use serde::Serialize;
use std::sync::mpsc::Receiver;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A host thread's staging for read-back: its own stream and two pinned
/// chunks, so one chunk is copied while the other is hashed.
pub struct Reader {
    stream: Arc<CudaStream>,
    bufs: [PinnedBuffer; 2],
    /// Wider chunks for [`Reader::digest_sections`], made on its first use.
    wide: Option<[PinnedBuffer; 2]>,
    /// The device's NaN flags, one per `CHUNK_ELEMS` chunk (grown on demand).
    nan_flags: Option<DeviceBuffer<u32>>,
    /// Where the last [`Reader::digest`] spent its time.
    last: ReadTimes,
}

/// One read-back's time on its host thread, in ms.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct ReadTimes {
    /// Blocked on a chunk's copy to arrive.
    pub copy_wait_ms: f64,
    /// Looking for NaNs on the host (the canonical policy's check before
    /// hashing in place), in spans the device found a NaN in.
    pub nan_scan_ms: f64,
    /// The device's NaN scan of the arena, flags read back.
    pub device_nan_scan_ms: f64,
    /// SHA-256 (and chunk digests, when the host computes them), plus
    /// canonicalising a chunk that holds a NaN.
    pub hash_ms: f64,
}

impl Reader {
    pub fn new(dev: &Device, chunk: usize) -> Result<Reader, GpuError> {
        Ok(Reader {
            stream: dev.new_stream()?,
            bufs: [
                PinnedBuffer::alloc(&dev.ctx, chunk)?,
                PinnedBuffer::alloc(&dev.ctx, chunk)?,
            ],
            wide: None,
            nan_flags: None,
            last: ReadTimes::default(),
        })
    }

    /// For each `CHUNK_ELEMS` chunk of `buf`, whether it holds a NaN, found
    /// on the device (a pass at HBM speed instead of a host scan at memory
    /// speed on the one hashing thread).
    fn nan_map<T: ArenaElem>(
        &mut self,
        dev: &Device,
        buf: DeviceView<'_, T>,
    ) -> Result<Vec<bool>, GpuError> {
        let chunks = buf.len().div_ceil(CHUNK_ELEMS);
        if self.nan_flags.as_ref().is_none_or(|f| f.len() < chunks) {
            self.nan_flags = Some(DeviceBuffer::alloc(&dev.ctx, chunks)?);
        }
        let flags = self
            .nan_flags
            .as_ref()
            .ok_or_else(|| GpuError::bounds("NaN flags missing"))?;
        // SAFETY: views of this context's live buffers; the round has
        // finished writing the arena, and the flags are read only after
        // this stream synchronizes.
        unsafe {
            dev.nan_chunks(
                buf.slice(0, buf.len())?,
                CHUNK_ELEMS,
                flags.slice(0, chunks)?,
                &self.stream,
            )?
        };
        self.stream
            .synchronize()
            .map_err(|e| GpuError::driver("cuStreamSynchronize", e))?;
        let mut host = vec![0u32; chunks];
        flags.download(0, &mut host)?;
        Ok(host.iter().map(|&f| f != 0).collect())
    }

    /// The stream this reader's copies run on.
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    /// Where the last [`Reader::digest`] spent its time.
    pub fn last_times(&self) -> ReadTimes {
        self.last
    }

    /// Hash `buf`, an arena of `dtype`, under `policy` (with chunk digests
    /// when `chunked`); also return its values (as float32 carriers) when
    /// `keep`.
    pub fn digest<T: ArenaElem>(
        &mut self,
        dev: &Device,
        buf: &DeviceBuffer<T>,
        dtype: Dtype,
        policy: NanPolicy,
        keep: bool,
        chunked: bool,
    ) -> Result<(ChunkedDigest, Option<Vec<f32>>), GpuError> {
        self.digest_view(dev, buf.view(), dtype, policy, keep, chunked)
    }

    /// [`Reader::digest`] of a window of a buffer (a reduce-scatter's
    /// shard, hashed where it lies).
    pub fn digest_view<T: ArenaElem>(
        &mut self,
        dev: &Device,
        buf: DeviceView<'_, T>,
        dtype: Dtype,
        policy: NanPolicy,
        keep: bool,
        chunked: bool,
    ) -> Result<(ChunkedDigest, Option<Vec<f32>>), GpuError> {
        let mut out = Hashing::new::<T>(buf.len(), dtype, policy, keep, chunked)?;
        let fed = self.feed(dev, buf, &mut out);
        self.last = out.times();
        fed?;
        Ok(out.finish())
    }

    /// [`Reader::digest`] of an arena still being reduced: `sections` says,
    /// in order, up to which element the arena is final once its event has
    /// completed; each section is read back and hashed while the next ones
    /// are still being folded.
    #[allow(clippy::too_many_arguments)]
    pub fn digest_sections<T: ArenaElem>(
        &mut self,
        dev: &Device,
        buf: &DeviceBuffer<T>,
        dtype: Dtype,
        policy: NanPolicy,
        keep: bool,
        chunked: bool,
        sections: &Receiver<Section>,
    ) -> Result<(ChunkedDigest, Option<Vec<f32>>), GpuError> {
        let n = buf.len();
        let mut out = Hashing::new::<T>(n, dtype, policy, keep, chunked)?;
        let mut done = 0;
        // While the round goes on, another thread pins the files' bytes,
        // and each of this thread's driver calls can wait behind one of
        // those pins: with chunks of SECTION_CHUNK, a section needs a
        // few calls instead of dozens, and the hash seldom waits.
        let wide = match self.wide.take() {
            Some(w) => w,
            None => [
                PinnedBuffer::alloc(&dev.ctx, SECTION_CHUNK)?,
                PinnedBuffer::alloc(&dev.ctx, SECTION_CHUNK)?,
            ],
        };
        let narrow = std::mem::replace(&mut self.bufs, wide);
        let fed = (|| {
            dev.bind()?;
            while done < n {
                let Section { end, ready } = sections.recv().map_err(|_| {
                    GpuError::bounds(format!(
                        "the round stopped with {done} of {n} elements reduced"
                    ))
                })?;
                if end <= done || end > n {
                    return Err(GpuError::bounds(format!(
                        "section ending at {end} after {done} of {n}"
                    )));
                }
                let t = Instant::now();
                ready
                    .synchronize()
                    .map_err(|e| GpuError::driver("cuEventSynchronize", e))?;
                out.spent.waited += t.elapsed();
                self.feed(dev, buf.slice(done, end - done)?, &mut out)?;
                done = end;
            }
            Ok(())
        })();
        self.wide = Some(std::mem::replace(&mut self.bufs, narrow));
        self.last = out.times();
        fed?;
        Ok(out.finish())
    }

    /// Read `buf` back and hash it into `out`, after what it already holds.
    fn feed<T: ArenaElem>(
        &mut self,
        dev: &Device,
        buf: DeviceView<'_, T>,
        out: &mut Hashing,
    ) -> Result<(), GpuError> {
        dev.bind()?;
        let n = buf.len();
        let dtype = out.dtype;
        // The pinned chunks hold as many bytes whatever the element.
        let chunk = (self.bufs[0].len() * 4 / T::BYTES as usize).max(1);
        let chunks = n.div_ceil(chunk);
        let count = |k: usize| chunk.min(n - k * chunk);
        // Under the canonical policy the host would scan every span for
        // NaNs before hashing it in place; the device says which spans can
        // skip that.
        let scanned = Instant::now();
        // The device scan reads 16 bytes at a time from the view's start: a
        // window that does not start on 16 bytes (a shard) is scanned on the
        // host instead.
        let nan_map = match out.policy {
            NanPolicy::Canonical if n > 0 && T::BYTES == 4 && buf.ptr().is_multiple_of(16) => {
                Some(self.nan_map(dev, buf)?)
            }
            _ => None,
        };
        out.spent.device_scan += scanned.elapsed();
        let has_nan = |k: usize| {
            let (lo, hi) = (k * chunk, k * chunk + count(k));
            nan_map
                .as_ref()
                .is_none_or(|m| m[lo / CHUNK_ELEMS..hi.div_ceil(CHUNK_ELEMS)].contains(&true))
        };
        let result = (|| -> Result<(), GpuError> {
            for k in 0..chunks.min(2) {
                self.issue(buf, k, chunk, count(k))?;
            }
            for k in 0..chunks {
                let t = Instant::now();
                // Waits for this slot's copy: the buffer will not lend out
                // memory a copy is still writing.
                let vals = self.bufs[k % 2].values::<T>(count(k))?;
                out.spent.waited += t.elapsed();
                let t = Instant::now();
                T::hash(&mut out.hasher, vals, !has_nan(k));
                out.spent.hashing += t.elapsed();
                if let Some(v) = out.kept.as_mut() {
                    T::carry(vals, dtype, v);
                }
                if k + 2 < chunks {
                    self.issue(buf, k + 2, chunk, count(k + 2))?;
                }
            }
            Ok(())
        })();
        // Never leave a copy into our pinned memory in flight.
        let synced = self
            .stream
            .synchronize()
            .map_err(|e| GpuError::driver("cuStreamSynchronize", e));
        result?;
        synced
    }

    /// Start the copy of chunk `k` into its slot.
    fn issue<T: ArenaElem>(
        &mut self,
        buf: DeviceView<'_, T>,
        k: usize,
        chunk: usize,
        count: usize,
    ) -> Result<(), GpuError> {
        let src = buf.slice(k * chunk, count)?;
        // SAFETY: the round has finished writing `buf`, which outlives the
        // copy (the stream is synchronized before `digest` returns).
        unsafe { self.bufs[k % 2].fill_async(src, &self.stream) }
    }
}

/// Float32 elements (8 MiB) per pinned chunk when an arena is read back
/// section by section during its round.
const SECTION_CHUNK: usize = 1 << 21;

/// Up to which element an arena being reduced is final, once `ready`
/// has completed (see [`Reader::digest_sections`]).
pub struct Section {
    pub end: usize,
    pub ready: CudaEvent,
}

/// One digest under way: the hasher, the kept values, where the time went.
struct Hashing {
    hasher: ArenaHasher,
    kept: Option<Vec<f32>>,
    dtype: Dtype,
    policy: NanPolicy,
    spent: Spent,
}

#[derive(Default)]
struct Spent {
    waited: Duration,
    hashing: Duration,
    device_scan: Duration,
}

impl Hashing {
    fn new<T: ArenaElem>(
        n: usize,
        dtype: Dtype,
        policy: NanPolicy,
        keep: bool,
        chunked: bool,
    ) -> Result<Self, GpuError> {
        if !T::holds(dtype) {
            return Err(GpuError::bounds(format!(
                "a {dtype} arena read back as {}-byte elements",
                T::BYTES
            )));
        }
        Ok(Hashing {
            hasher: if chunked {
                ArenaHasher::with_chunks_of(dtype, policy)
            } else {
                ArenaHasher::of(dtype, policy)
            },
            kept: keep.then(|| Vec::with_capacity(n)),
            dtype,
            policy,
            spent: Spent::default(),
        })
    }

    fn times(&self) -> ReadTimes {
        let scan = self.hasher.scan_time();
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        ReadTimes {
            copy_wait_ms: ms(self.spent.waited),
            nan_scan_ms: ms(scan),
            device_nan_scan_ms: ms(self.spent.device_scan),
            hash_ms: ms(self.spent.hashing.saturating_sub(scan)),
        }
    }

    fn finish(self) -> (ChunkedDigest, Option<Vec<f32>>) {
        (self.hasher.finish_chunked(), self.kept)
    }
}
