//! The single-GPU loopback world: W rank arenas on one device, exchange and
//! redistribution as device-to-device copies, the fold in between.
//!
//! For each owner o, every rank's copy of shard o goes into a stacked
//! scratch at slot = source rank, issued in the case's delivery order
//! (optionally spread over several streams so copies race); the fold then
//! writes rank o's shard, and the reduced shards are copied to every other
//! rank. Cross-stream ordering uses events only: no per-rank synchronize.

use crate::data::Distribution;
use crate::digest::{ChunkedDigest, NanPolicy};
use crate::dtype::Dtype;
use crate::fold::Shard;
use crate::gpu::device::{row_stride_of, Device, FoldArgs, LaunchTuning};
use crate::gpu::error::GpuError;
use crate::gpu::kernels::{FoldMode, KernelVariant};
use crate::gpu::mem::{copy_d2d, ArenaElem, DeviceBuffer};
use crate::gpu::readback::{ReadTimes, Reader, Section};
use crate::gpu::RankCheck;
use cudarc::driver::{sys::CUevent_flags, CudaEvent, CudaStream};
use serde::Serialize;
use std::ops::Range;
use std::sync::mpsc::Sender;
use std::sync::Arc;
use std::time::Instant;

/// Rank arenas and reusable scratch for one (W, n), holding `T`: float32,
/// or a 16-bit dtype's bits (`u16`, 2 bytes an element everywhere).
pub struct WorldBuffers<T: ArenaElem = f32> {
    pub world: usize,
    pub len: usize,
    pub ranks: Vec<DeviceBuffer<T>>,
    /// `nbuf` scratches of `world * ld` elements each.
    pub scratch: Vec<DeviceBuffer<T>>,
    /// Row stride of a scratch (elements; a multiple of 4, room for a phase).
    pub ld: usize,
}

/// Bytes [`WorldBuffers::alloc`] would take for an arena of `dtype`.
pub fn bytes_needed(world: usize, len: usize, plan: &[Shard], nbuf: usize, dtype: Dtype) -> u64 {
    let max_shard = plan.iter().map(|s| s.len).max().unwrap_or(0);
    let ld = row_stride_of(max_shard, dtype) as u64;
    let scratch = if max_shard == 0 {
        0
    } else {
        nbuf as u64 * world as u64 * ld
    };
    (world as u64 * len as u64 + scratch) * dtype.bytes() as u64
}

impl<T: ArenaElem> WorldBuffers<T> {
    /// The scratch row stride for shards of up to `max_shard` elements.
    fn stride(max_shard: usize) -> usize {
        let like = if T::BYTES == 4 {
            Dtype::F32
        } else {
            Dtype::Bf16
        };
        row_stride_of(max_shard, like)
    }

    pub fn alloc(
        dev: &Device,
        world: usize,
        len: usize,
        plan: &[Shard],
        nbuf: usize,
    ) -> Result<Self, GpuError> {
        let max_shard = plan.iter().map(|s| s.len).max().unwrap_or(0);
        let ld = Self::stride(max_shard);
        let ranks = (0..world)
            .map(|_| DeviceBuffer::alloc(&dev.ctx, len))
            .collect::<Result<Vec<_>, _>>()?;
        let scratch = if max_shard == 0 {
            Vec::new()
        } else {
            (0..nbuf)
                .map(|_| DeviceBuffer::alloc(&dev.ctx, world * ld))
                .collect::<Result<Vec<_>, _>>()?
        };
        Ok(WorldBuffers {
            world,
            len,
            ranks,
            scratch,
            ld,
        })
    }
}

/// What one round needs to know about the case.
pub struct RoundSpec<'a> {
    pub plan: &'a [Shard],
    /// Source ranks in delivery order.
    pub order: &'a [usize],
    pub mode: FoldMode,
    /// Device copy of the order or postfix program (0 for fixed order).
    pub prog: u64,
    pub prog_len: u32,
    pub scale: Option<f32>,
    pub variant: KernelVariant,
    pub tuning: LaunchTuning,
    /// The generator's (distribution, seed), or `None` when the caller
    /// has already uploaded each rank's addends (rank files).
    pub generate: Option<(Distribution, u64)>,
    pub arena: u32,
    /// The case's dtype (held in the buffers' `T`).
    pub dtype: Dtype,
    /// An all-reduce hands every reduced shard to every rank; a
    /// reduce-scatter stops after the fold (rank o keeps shard o).
    pub redistribute: bool,
}

fn ev(stream: &CudaStream, timed: bool) -> Result<CudaEvent, GpuError> {
    let flags = if timed {
        Some(CUevent_flags::CU_EVENT_DEFAULT)
    } else {
        None
    };
    stream
        .record_event(flags)
        .map_err(|e| GpuError::driver("cuEventRecord", e))
}

fn wait(stream: &CudaStream, e: &CudaEvent) -> Result<(), GpuError> {
    stream
        .wait(e)
        .map_err(|e| GpuError::driver("cuStreamWaitEvent", e))
}

/// Generate (unless uploaded), exchange, fold and redistribute one arena. Returns the
/// device-measured (generate, reduce) milliseconds; on return every rank
/// holds the reduced arena and the device is idle for these buffers.
pub fn run_round<T: ArenaElem>(
    dev: &Device,
    main: &Arc<CudaStream>,
    copy: &[Arc<CudaStream>],
    bufs: &WorldBuffers<T>,
    spec: &RoundSpec<'_>,
) -> Result<(f64, f64), GpuError> {
    if !T::holds(spec.dtype) {
        return Err(GpuError::bounds(format!(
            "a {} round on {}-byte arenas",
            spec.dtype,
            T::BYTES
        )));
    }
    dev.bind()?;
    let n = bufs.len;
    let t0 = ev(main, true)?;
    if let Some((distribution, seed)) = spec.generate {
        for (r, arena) in bufs.ranks.iter().enumerate() {
            // SAFETY: each rank arena holds `n` elements of the dtype.
            unsafe {
                dev.generate(
                    arena.ptr(),
                    n as u64,
                    0,
                    distribution,
                    seed,
                    r as u32,
                    spec.arena,
                    spec.dtype,
                    main,
                )?;
            }
        }
    }
    let t1 = ev(main, true)?;
    let result = exchange_fold_redistribute(dev, main, copy, bufs, spec, &t1);
    // Drain before returning on every path: copies in flight reference
    // buffers the caller may free next.
    let synced = main
        .synchronize()
        .map_err(|e| GpuError::driver("synchronizing the round", e));
    for s in copy {
        let _ = s.synchronize();
    }
    let t2 = result?;
    synced?;
    let gen_ms = t0
        .elapsed_ms(&t1)
        .map_err(|e| GpuError::driver("cuEventElapsedTime", e))? as f64;
    let reduce_ms = t1
        .elapsed_ms(&t2)
        .map_err(|e| GpuError::driver("cuEventElapsedTime", e))? as f64;
    Ok((gen_ms, reduce_ms))
}

fn exchange_fold_redistribute<T: ArenaElem>(
    dev: &Device,
    main: &Arc<CudaStream>,
    copy: &[Arc<CudaStream>],
    bufs: &WorldBuffers<T>,
    spec: &RoundSpec<'_>,
    generated: &CudaEvent,
) -> Result<CudaEvent, GpuError> {
    let mut folds = ShardFolds::new(dev, main, copy, bufs, spec);
    let all = 0..spec.plan.len();
    folds.fold(all.clone(), generated)?;
    if spec.redistribute {
        folds.redistribute(all)?;
    }
    ev(main, true)
}

/// A round whose addends arrive a stage at a time (rank files):
/// `upload(first, len)` puts elements `first .. first + len` of every
/// rank's arena in place on `main`. Each shard is exchanged, folded and
/// redistributed as soon as all of its elements are in, and `sections`
/// hears how far the arena is final, so its digest can read it back while
/// later stages still arrive. Returns the device milliseconds of the folds
/// and redistributions; on return the device is idle for these buffers.
#[allow(clippy::too_many_arguments)]
pub fn run_round_staged<T, E, U>(
    dev: &Device,
    main: &Arc<CudaStream>,
    copy: &[Arc<CudaStream>],
    bufs: &WorldBuffers<T>,
    spec: &RoundSpec<'_>,
    stage: usize,
    mut upload: U,
    sections: &Sender<Section>,
) -> Result<f64, E>
where
    T: ArenaElem,
    E: From<GpuError>,
    U: FnMut(usize, usize) -> Result<(), E>,
{
    if !T::holds(spec.dtype) || spec.generate.is_some() || stage == 0 {
        return Err(
            GpuError::bounds("a staged round takes uploaded addends of the arenas' dtype").into(),
        );
    }
    dev.bind()?;
    let n = bufs.len;
    let mut folds = ShardFolds::new(dev, main, copy, bufs, spec);
    let mut timed = Vec::new();
    let (mut next, mut sent) = (0, 0);
    let result = (|| -> Result<(), E> {
        for first in (0..n).step_by(stage) {
            let upto = first + stage.min(n - first);
            upload(first, upto - first)?;
            let from = next;
            while spec.plan.get(next).is_some_and(|s| s.start + s.len <= upto) {
                next += 1;
            }
            if next == from {
                continue;
            }
            let began = ev(main, true)?;
            folds.fold(from..next, &began)?;
            if spec.redistribute {
                folds.redistribute(from..next)?;
            }
            timed.push((began, ev(main, true)?));
            let end = spec.plan[next - 1].start + spec.plan[next - 1].len;
            if end > sent {
                let ready = ev(main, false)?;
                // A digest that stopped listening failed on its own; the
                // round still ends and drains.
                let _ = sections.send(Section { end, ready });
                sent = end;
            }
        }
        Ok(())
    })();
    let synced = main
        .synchronize()
        .map_err(|e| GpuError::driver("synchronizing the round", e));
    for s in copy {
        let _ = s.synchronize();
    }
    result?;
    synced?;
    let mut ms = 0.0;
    for (a, b) in &timed {
        ms += a
            .elapsed_ms(b)
            .map_err(|e| GpuError::driver("cuEventElapsedTime", e))? as f64;
    }
    Ok(ms)
}

/// The exchange, fold and redistribution of shards, asked for in order
/// (all at once, or a few at a time as their addends arrive), with what
/// reusing the scratch buffers needs to remember between calls.
struct ShardFolds<'r, 's, T: ArenaElem> {
    dev: &'r Device,
    main: &'r Arc<CudaStream>,
    copy: &'r [Arc<CudaStream>],
    bufs: &'r WorldBuffers<T>,
    spec: &'r RoundSpec<'s>,
    racing: bool,
    /// Per scratch buffer, the fold that last read it.
    last_fold: Vec<Option<CudaEvent>>,
    used: usize,
}

impl<'r, 's, T: ArenaElem> ShardFolds<'r, 's, T> {
    fn new(
        dev: &'r Device,
        main: &'r Arc<CudaStream>,
        copy: &'r [Arc<CudaStream>],
        bufs: &'r WorldBuffers<T>,
        spec: &'r RoundSpec<'s>,
    ) -> Self {
        let nbuf = bufs.scratch.len().max(1);
        ShardFolds {
            dev,
            main,
            copy,
            bufs,
            spec,
            racing: copy.len() >= 2,
            last_fold: (0..nbuf).map(|_| None).collect(),
            used: 0,
        }
    }

    /// Exchange and fold shards `which`, whose addends are in place once
    /// `ready` (recorded on `main`) has completed.
    fn fold(&mut self, which: Range<usize>, ready: &CudaEvent) -> Result<(), GpuError> {
        let (bufs, spec, main, copy) = (self.bufs, self.spec, self.main, self.copy);
        let world = bufs.world;
        if self.racing {
            for s in copy {
                wait(s, ready)?;
            }
        }
        for o in which {
            let shard = spec.plan[o];
            if shard.len == 0 {
                continue;
            }
            let b = self.used % self.last_fold.len();
            self.used += 1;
            let scratch = bufs
                .scratch
                .get(b)
                .ok_or_else(|| GpuError::bounds("scratch missing for a non-empty shard"))?;
            let out = bufs.ranks[o].slice(shard.start, shard.len)?;
            // Rows start at the same 16-byte phase as the owner's shard, so the
            // fast kernel can use float4 on both sides.
            let phase = ((out.ptr() & 15) / T::BYTES) as usize;
            // The W slots, row `src` at `src * ld`: the fold reads all of it.
            let slots = scratch.slice(phase, (world - 1) * bufs.ld + shard.len)?;
            let row = |src: usize| slots.slice(src * bufs.ld, shard.len);
            let theirs = |src: usize| bufs.ranks[src].slice(shard.start, shard.len);
            if self.racing {
                if let Some(e) = &self.last_fold[b] {
                    for s in copy {
                        wait(s, e)?;
                    }
                }
                for (k, &src) in spec.order.iter().enumerate() {
                    let s = &copy[k % copy.len()];
                    // SAFETY: views of this context's live buffers; scratch
                    // buffer `b` is reused only after the fold that read it.
                    unsafe { copy_d2d(row(src)?, theirs(src)?, s)? };
                }
                for s in copy {
                    wait(main, &ev(s, false)?)?;
                }
            } else {
                for &src in spec.order {
                    // SAFETY: as above; one stream orders scratch reuse.
                    unsafe { copy_d2d(row(src)?, theirs(src)?, main)? };
                }
            }
            let args = FoldArgs {
                out: out.ptr(),
                stacked: slots.ptr(),
                ld: bufs.ld as u64,
                len: shard.len as u64,
                world: world as u32,
                prog: spec.prog,
                prog_len: spec.prog_len,
                scale: spec.scale,
                dtype: spec.dtype,
            };
            // SAFETY: `out` (the owner's shard) and `slots` (W rows of ld, the
            // last `len` long) are checked views of this context's buffers.
            unsafe {
                self.dev
                    .fold(spec.variant, spec.mode, &args, &spec.tuning, main)?
            };
            if self.racing {
                self.last_fold[b] = Some(ev(main, false)?);
            }
        }
        Ok(())
    }

    /// Every owner's reduced shard of `which` to every other rank; `main`
    /// waits for the copies.
    fn redistribute(&mut self, which: Range<usize>) -> Result<(), GpuError> {
        let (bufs, main, copy) = (self.bufs, self.main, self.copy);
        let folded = ev(main, false)?;
        let movers: Vec<&Arc<CudaStream>> = if self.racing {
            for s in copy {
                wait(s, &folded)?;
            }
            copy.iter().collect()
        } else {
            vec![main]
        };
        let mut k = 0usize;
        for o in which {
            let shard = self.spec.plan[o];
            if shard.len == 0 {
                continue;
            }
            for (r, dst) in bufs.ranks.iter().enumerate() {
                if r == o {
                    continue;
                }
                let s = movers[k % movers.len()];
                k += 1;
                let to = dst.slice(shard.start, shard.len)?;
                let from = bufs.ranks[o].slice(shard.start, shard.len)?;
                // SAFETY: same shard range in two distinct rank arenas; the
                // owner's shard was folded on `main`, which every mover waited for.
                unsafe { copy_d2d(to, from, s)? };
            }
        }
        if self.racing {
            for s in copy {
                wait(main, &ev(s, false)?)?;
            }
        }
        Ok(())
    }
}

/// A reduce-scatter's shards gathered in rank order into rank 0's arena:
/// rank r's shard r copied over rank 0's shard r (r >= 1), after the
/// round and outside its timing (no redistribution happens in the
/// collective itself; this is how the report reads the shards).
pub fn gather_shards<T: ArenaElem>(
    main: &CudaStream,
    bufs: &WorldBuffers<T>,
    plan: &[Shard],
) -> Result<(), GpuError> {
    for (r, shard) in plan.iter().enumerate().skip(1) {
        if shard.len == 0 {
            continue;
        }
        let to = bufs.ranks[0].slice(shard.start, shard.len)?;
        let from = bufs.ranks[r].slice(shard.start, shard.len)?;
        // SAFETY: the same shard range in two distinct rank arenas of this
        // context; the round has finished (run_round returns idle).
        unsafe { copy_d2d(to, from, main)? };
    }
    main.synchronize()
        .map_err(|e| GpuError::driver("synchronizing the shard gather", e))
}

/// Each rank's own shard hashed where it lies, rank order (an empty shard
/// hashes to the digest of no bytes).
pub fn shard_digests<T: ArenaElem>(
    dev: &Device,
    reader: &mut Reader,
    bufs: &WorldBuffers<T>,
    plan: &[Shard],
    dtype: Dtype,
    policy: NanPolicy,
) -> Result<Vec<crate::digest::Sha256>, GpuError> {
    plan.iter()
        .enumerate()
        .map(|(r, s)| {
            if s.len == 0 {
                return Ok(crate::digest::digest_arena_as(&[], dtype, policy));
            }
            let view = bufs.ranks[r].slice(s.start, s.len)?;
            Ok(reader
                .digest_view(dev, view, dtype, policy, false, false)?
                .0
                .sha256)
        })
        .collect()
}

/// Where one arena's digest time went, in ms (`bench` prints it).
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct DigestProfile {
    /// The device compare of ranks 1..W-1 with rank 0, flags read back.
    pub rank_diff_ms: f64,
    /// The slowest host thread's read-back.
    pub read: ReadTimes,
    /// Waiting for the device chunk digests once the host was done.
    pub device_chunks_wait_ms: f64,
}

/// Every rank's digest, rank 0's chunk digests, rank 0's values if kept,
/// and for each rank whose copy differs from rank 0's, the differing chunks.
pub struct RankDigests {
    pub digests: Vec<crate::digest::Sha256>,
    pub chunks: Vec<crate::digest::Sha256>,
    pub values: Option<Vec<f32>>,
    pub differing: Vec<(usize, Vec<usize>)>,
    pub profile: DigestProfile,
}

/// For each rank r >= 1, the chunks (of `chunk` elements) of its arena
/// whose bits differ from rank 0's, compared on the device.
pub fn differing_chunks<T: ArenaElem>(
    dev: &Device,
    stream: &CudaStream,
    bufs: &WorldBuffers<T>,
    chunk: usize,
) -> Result<Vec<Vec<usize>>, GpuError> {
    let (n, world) = (bufs.len, bufs.world);
    let chunks = n.div_ceil(chunk);
    if world < 2 || chunks == 0 {
        return Ok(vec![Vec::new(); world.saturating_sub(1)]);
    }
    dev.bind()?;
    let flags = DeviceBuffer::<u32>::alloc(&dev.ctx, (world - 1) * chunks)?;
    let reference = bufs.ranks[0].slice(0, n)?;
    for r in 1..world {
        let other = bufs.ranks[r].slice(0, n)?;
        let mine = flags.slice((r - 1) * chunks, chunks)?;
        // SAFETY: views of this context's buffers; the round has finished
        // writing the arenas (run_round returns with the device idle) and
        // `flags` is read only after the stream synchronizes below.
        unsafe { dev.rank_diff(reference, other, chunk, mine, stream)? };
    }
    stream
        .synchronize()
        .map_err(|e| GpuError::driver("cuStreamSynchronize", e))?;
    let host = flags.to_host()?;
    Ok(host
        .chunks(chunks)
        .map(|row| {
            row.iter()
                .enumerate()
                .filter(|(_, &f)| f != 0)
                .map(|(c, _)| c)
                .collect()
        })
        .collect())
}

/// The device's part of an all-reduce's digests: which ranks' copies
/// differ from rank 0's (under [`RankCheck::Device`]) and rank 0's chunk
/// digests (when [`host_chunks`] says the device makes them). Started
/// once the round has written the arenas, so that they run while the host
/// still hashes rank 0.
pub struct DeviceChecks {
    check: RankCheck,
    differing: Vec<(usize, Vec<usize>)>,
    rank_diff_ms: f64,
    chunks: Option<DeviceChunks>,
}

impl DeviceChecks {
    /// The comparison runs on `stream` and is waited for; the chunk
    /// digests go on their own stream until [`digest_ranks`] takes them.
    pub fn start<T: ArenaElem>(
        dev: &Device,
        stream: &CudaStream,
        bufs: &WorldBuffers<T>,
        policy: NanPolicy,
        check: RankCheck,
    ) -> Result<Self, GpuError> {
        let compared = Instant::now();
        let differing = match check {
            RankCheck::Host => Vec::new(),
            RankCheck::Device => differing_chunks(dev, stream, bufs, crate::digest::CHUNK_ELEMS)?
                .into_iter()
                .enumerate()
                .filter(|(_, c)| !c.is_empty())
                .map(|(r, c)| (r + 1, c))
                .collect(),
        };
        let rank_diff_ms = compared.elapsed().as_secs_f64() * 1e3;
        // Under the device check rank 0's chunk digests come from the GPU,
        // in parallel with the host's sequential SHA-256 of the whole arena
        // (a 16-bit arena's are the host's).
        let chunks = if host_chunks::<T>(check, bufs.len) {
            None
        } else {
            Some(DeviceChunks::start(dev, &bufs.ranks[0], policy)?)
        };
        Ok(DeviceChecks {
            check,
            differing,
            rank_diff_ms,
            chunks,
        })
    }
}

/// Rank 0's chunk digests computed on the device, started on their own
/// stream so they run while the host hashes the arena stream.
struct DeviceChunks {
    stream: Arc<CudaStream>,
    out: DeviceBuffer<u32>,
}

impl DeviceChunks {
    fn start<T: ArenaElem>(
        dev: &Device,
        arena: &DeviceBuffer<T>,
        policy: NanPolicy,
    ) -> Result<Self, GpuError> {
        let n = arena.len();
        let chunks = n.div_ceil(crate::digest::CHUNK_ELEMS);
        let stream = dev.new_stream()?;
        let out = DeviceBuffer::<u32>::alloc(&dev.ctx, 8 * chunks)?;
        // SAFETY: views of this context's live buffers; the round has
        // finished writing the arena, and `out` is read after `finish`
        // synchronizes this stream.
        unsafe {
            dev.chunk_sha256(
                arena.slice(0, n)?,
                crate::digest::CHUNK_ELEMS,
                policy,
                out.view(),
                &stream,
            )?
        };
        Ok(DeviceChunks { stream, out })
    }

    /// The digests, chunk order.
    fn finish(self) -> Result<Vec<crate::digest::Sha256>, GpuError> {
        self.stream
            .synchronize()
            .map_err(|e| GpuError::driver("cuStreamSynchronize", e))?;
        let words = self.out.to_host()?;
        Ok(words
            .chunks_exact(8)
            .map(|d| {
                let mut bytes = [0u8; 32];
                for (out, w) in bytes.chunks_exact_mut(4).zip(d) {
                    out.copy_from_slice(&w.to_be_bytes());
                }
                crate::digest::Sha256::from_bytes(bytes)
            })
            .collect())
    }
}

/// (rank, digest, kept values, read-back times).
type RankDigest = (usize, ChunkedDigest, Option<Vec<f32>>, ReadTimes);

/// One rank's digest made apart: (digest, kept values, read-back times).
pub type HashedRank = (ChunkedDigest, Option<Vec<f32>>, ReadTimes);

/// Whether rank 0's chunk digests are the host's (made while hashing its
/// arena) rather than the device's: always under the host check, and for
/// 16-bit arenas.
pub fn host_chunks<T: ArenaElem>(check: RankCheck, n: usize) -> bool {
    !(check == RankCheck::Device && n > 0 && T::BYTES == 4)
}

/// Digest the ranks' arenas with up to `readers.len()` host threads:
/// every rank under [`RankCheck::Host`]; under [`RankCheck::Device`] rank
/// 0 and the ranks whose copy differs, the others taking rank 0's digest.
///
/// `rank0`, when given, is rank 0's digest already made while the round
/// ran ([`Reader::digest_sections`]), with chunk digests when
/// [`host_chunks`] says the host makes them; `started`, the device's
/// checks started meanwhile (else they start here).
#[allow(clippy::too_many_arguments)]
pub fn digest_ranks<T: ArenaElem>(
    dev: &Device,
    readers: &mut [Reader],
    bufs: &WorldBuffers<T>,
    dtype: Dtype,
    policy: NanPolicy,
    keep: bool,
    check: RankCheck,
    rank0: Option<HashedRank>,
    started: Option<DeviceChecks>,
) -> Result<RankDigests, GpuError> {
    let world = bufs.ranks.len();
    if readers.is_empty() {
        return Err(GpuError::bounds("no read-back workers"));
    }
    let mut profile = DigestProfile::default();
    let checks = match started {
        Some(c) if c.check == check => c,
        Some(_) => {
            return Err(GpuError::bounds(
                "the device's checks were started under the other rank check",
            ))
        }
        None => DeviceChecks::start(dev, readers[0].stream(), bufs, policy, check)?,
    };
    let mut differing = checks.differing;
    profile.rank_diff_ms = checks.rank_diff_ms;
    let hashed: Vec<usize> = match check {
        RankCheck::Host => (0..world).collect(),
        RankCheck::Device => std::iter::once(0)
            .chain(differing.iter().map(|(r, _)| *r))
            .collect(),
    };
    let hashed: Vec<usize> = hashed
        .into_iter()
        .filter(|&r| r != 0 || rank0.is_none())
        .collect();
    let chunked_on_host = host_chunks::<T>(check, bufs.len);
    let device_chunks = checks.chunks;
    let mut digests: Vec<Option<crate::digest::Sha256>> = vec![None; world];
    let mut chunks = Vec::new();
    let mut values = None;
    if let Some((d, v, times)) = rank0 {
        profile.read = times;
        chunks = d.chunks;
        digests[0] = Some(d.sha256);
        values = v;
    }
    let workers = readers.len().min(hashed.len()).max(1);
    let outcome: Result<(), GpuError> = std::thread::scope(|scope| {
        let handles: Vec<_> = readers
            .iter_mut()
            .take(workers)
            .enumerate()
            .map(|(t, reader)| {
                let ranks = &bufs.ranks;
                let mine: Vec<usize> = hashed.iter().copied().skip(t).step_by(workers).collect();
                scope.spawn(move || -> Result<Vec<RankDigest>, GpuError> {
                    let mut out = Vec::new();
                    for r in mine {
                        let (d, v) = reader.digest(
                            dev,
                            &ranks[r],
                            dtype,
                            policy,
                            keep && r == 0,
                            r == 0 && chunked_on_host,
                        )?;
                        out.push((r, d, v, reader.last_times()));
                    }
                    Ok(out)
                })
            })
            .collect();
        for h in handles {
            let part = h
                .join()
                .map_err(|_| GpuError::panicked("a read-back thread", None))??;
            for (r, d, v, times) in part {
                let slowest = &mut profile.read;
                slowest.copy_wait_ms = slowest.copy_wait_ms.max(times.copy_wait_ms);
                slowest.nan_scan_ms = slowest.nan_scan_ms.max(times.nan_scan_ms);
                slowest.device_nan_scan_ms =
                    slowest.device_nan_scan_ms.max(times.device_nan_scan_ms);
                slowest.hash_ms = slowest.hash_ms.max(times.hash_ms);
                if r == 0 {
                    chunks = d.chunks;
                }
                digests[r] = Some(d.sha256);
                if v.is_some() {
                    values = v;
                }
            }
        }
        Ok(())
    });
    outcome?;
    if let Some(d) = device_chunks {
        let t = Instant::now();
        chunks = d.finish()?;
        profile.device_chunks_wait_ms = t.elapsed().as_secs_f64() * 1e3;
    }
    // Ranks found bit-identical to rank 0 on the device share its digest.
    let first = digests[0];
    let digests = digests
        .into_iter()
        .map(|d| {
            d.or(first)
                .ok_or_else(|| GpuError::bounds("a rank was not digested"))
        })
        .collect::<Result<Vec<_>, _>>()?;
    // A copy flagged for bits the NaN policy merges hashes equal: like the
    // host check, report only differences the digests see.
    differing.retain(|(r, _)| digests[*r] != digests[0]);
    if check == RankCheck::Host {
        // Rare path: name the chunks of a differing copy by hashing it again
        // per chunk (differences in hashed bytes, after the NaN policy).
        for r in (1..world).filter(|&r| digests[r] != digests[0]) {
            let (d, _) = readers[0].digest(dev, &bufs.ranks[r], dtype, policy, false, true)?;
            let c: Vec<usize> = (0..d.chunks.len().max(chunks.len()))
                .filter(|&k| d.chunks.get(k) != chunks.get(k))
                .collect();
            differing.push((r, c));
        }
    }
    Ok(RankDigests {
        digests,
        chunks,
        values,
        differing,
        profile,
    })
}

/// One (W, n)'s buffers in either element width.
pub enum AnyWorld {
    F32(WorldBuffers<f32>),
    Half(WorldBuffers<u16>),
}

/// The element types a world is kept in, and how each sits in [`AnyWorld`].
pub trait WorldElem: ArenaElem {
    fn wrap(w: WorldBuffers<Self>) -> AnyWorld;
    fn unwrap(w: &AnyWorld) -> Option<&WorldBuffers<Self>>;
}

impl WorldElem for f32 {
    fn wrap(w: WorldBuffers<f32>) -> AnyWorld {
        AnyWorld::F32(w)
    }
    fn unwrap(w: &AnyWorld) -> Option<&WorldBuffers<f32>> {
        match w {
            AnyWorld::F32(b) => Some(b),
            AnyWorld::Half(_) => None,
        }
    }
}

impl WorldElem for u16 {
    fn wrap(w: WorldBuffers<u16>) -> AnyWorld {
        AnyWorld::Half(w)
    }
    fn unwrap(w: &AnyWorld) -> Option<&WorldBuffers<u16>> {
        match w {
            AnyWorld::Half(b) => Some(b),
            AnyWorld::F32(_) => None,
        }
    }
}
