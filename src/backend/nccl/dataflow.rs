//! One arena on one rank: generate, exchange into slots by source rank,
//! fold, redistribute, digest; plus the digest gather between processes.
//! Point-to-point NCCL calls only, and every wait watches NCCL's
//! asynchronous error state.

use super::{NcclBackend, RankBufs, RankCtx, RankElem, NAME};
use crate::backend::{infrastructure, BackendError, RunOptions};
use crate::experiment::{Addends, Case};
use crate::fold::{mean_scale, shard_plan, Contract, Shard};
use crate::gpu::device::row_stride_of;
use crate::gpu::error::GpuError;
use crate::gpu::kernels::FoldMode;
use crate::gpu::mem::DeviceBuffer;
use crate::gpu::{DeviceConfig, KernelVariant};
use crate::ranks::watchdog::Watchdog;
use std::sync::Arc;
use std::time::{Duration, Instant};

pub(super) struct RankOut {
    /// This rank's copy of the arena (of a reduce-scatter: its own shard).
    pub(super) digest: crate::digest::ChunkedDigest,
    /// A reduce-scatter on rank 0: the shards gathered in rank order.
    pub(super) gathered: Option<crate::digest::ChunkedDigest>,
    /// A reduce-scatter's own shard, when this rank checks its own
    /// `expect` file.
    pub(super) own_shard: Option<Vec<f32>>,
    pub(super) values: Option<Vec<f32>>,
    pub(super) generate_ms: f64,
    pub(super) reduce_ms: f64,
    /// Read-back and hashing of this rank's copy.
    pub(super) digest_ms: f64,
}

/// What one rank does for one arena.
pub(super) struct ArenaJob<'a> {
    pub(super) case: &'a Case,
    pub(super) arena: u32,
    pub(super) n: usize,
    pub(super) world: usize,
    pub(super) mode: FoldMode,
    pub(super) variant: KernelVariant,
    pub(super) cuda: &'a DeviceConfig,
    pub(super) opts: &'a RunOptions,
    /// Benchmark repetition: the arena already holds data; time the
    /// collectives only (no generation, no digest).
    pub(super) timing_only: bool,
}

/// Why one rank's part of a case stopped.
#[derive(Debug)]
pub(super) enum Fault {
    /// The arena does not fit in device memory.
    Memory(String),
    /// A driver, NVRTC or NCCL call failed in `phase`; its code decides
    /// the exit (device memory: 3, anything else: 4).
    Gpu {
        phase: &'static str,
        source: GpuError,
    },
    /// The watchdog fired, or a peer broke the communicator, in `phase`.
    Infra { phase: String, message: String },
    /// This rank's own file could not be read.
    Addends(crate::addends::AddendError),
}

/// A failure of a rank thread outside any phase (it panicked).
impl From<GpuError> for Fault {
    fn from(source: GpuError) -> Fault {
        Fault::Gpu {
            phase: "rank thread",
            source,
        }
    }
}

pub(super) fn infra(phase: &str, message: impl Into<String>) -> Fault {
    Fault::Infra {
        phase: phase.to_string(),
        message: message.into(),
    }
}

/// Maps a GPU or NCCL error of `phase` to its fault.
pub(super) fn gpu<E: Into<GpuError>>(phase: &'static str) -> impl Fn(E) -> Fault {
    move |e| Fault::Gpu {
        phase,
        source: e.into(),
    }
}

impl Fault {
    pub(super) fn into_backend(self, case: &str) -> BackendError {
        match self {
            Fault::Memory(m) => BackendError::Unavailable {
                backend: NAME,
                reason: format!("case `{case}`: {m}"),
            },
            Fault::Gpu { phase, source } => crate::backend::gpu_failed(case, phase, source),
            Fault::Infra { phase, message } => infrastructure(case, phase, message),
            Fault::Addends(source) => BackendError::Addends {
                case: case.to_string(),
                source,
            },
        }
    }
}

/// Wait until every phase's event completed, watching NCCL's asynchronous
/// error state meanwhile (as nccl-tests does). A blocking stream sync would
/// sit out the whole watchdog when a peer dies; this returns as soon as NCCL
/// notices, aborts the communicator and names the first unfinished phase.
fn await_phases(
    ctx: &mut RankCtx,
    phases: &[(cudarc::driver::CudaEvent, &str)],
    dog: &Watchdog,
) -> Result<(), Fault> {
    let mut polls = 0u32;
    loop {
        let mut pending = None;
        for (ev, name) in phases {
            match ev.try_is_complete() {
                Ok(true) => continue,
                Ok(false) => {
                    pending = Some(*name);
                    break;
                }
                Err(e) => {
                    return Err(Fault::Gpu {
                        phase: "waiting for a phase",
                        source: GpuError::driver(format!("cuEventQuery ({name})"), e),
                    })
                }
            }
        }
        let Some(phase) = pending else {
            return Ok(());
        };
        if let Some(p) = dog.fired() {
            return Err(infra(
                phase,
                format!("watchdog fired during `{p}`; communicator aborted"),
            ));
        }
        if let Some(e) = ctx.comm.async_error() {
            // Abort unblocks the kernels; the communicator is never
            // destroyed after it.
            ctx.comm.abort();
            return Err(infra(
                phase,
                format!("{e} (a peer rank died or its connection broke); communicator aborted"),
            ));
        }
        polls += 1;
        // Spin briefly for short phases, then back off to spare the CPU
        // that other ranks of an emulated world share.
        match polls {
            0..=200 => std::thread::yield_now(),
            201..=2000 => std::thread::sleep(Duration::from_micros(50)),
            _ => std::thread::sleep(Duration::from_micros(500)),
        }
    }
}

/// Run `f` on every rank of this process at once, one thread each: NCCL
/// needs all of a process's ranks inside their group calls together.
pub(super) fn on_every_rank<R: Send, T: Send, E: Send + From<GpuError>>(
    ranks: &mut [R],
    f: impl Fn(&mut R) -> Result<T, E> + Sync,
) -> Vec<Result<T, E>> {
    std::thread::scope(|s| {
        let hs: Vec<_> = ranks
            .iter_mut()
            .map(|ctx| {
                let f = &f;
                s.spawn(move || f(ctx))
            })
            .collect();
        hs.into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(E::from(GpuError::panicked("a rank thread", None))))
            })
            .collect()
    })
}

fn mark(
    stream: &cudarc::driver::CudaStream,
    phase: &'static str,
) -> Result<cudarc::driver::CudaEvent, Fault> {
    stream.record_event(None).map_err(|e| Fault::Gpu {
        phase,
        source: GpuError::driver("cuEventRecord", e),
    })
}

pub(super) fn rank_arena(
    ctx: &mut RankCtx,
    job: &ArenaJob<'_>,
    prog: u64,
    prog_len: u32,
    dog: &Watchdog,
    timeout: Duration,
) -> Result<RankOut, Fault> {
    if job.case.dtype().is_f32() {
        rank_arena_in::<f32>(ctx, job, prog, prog_len, dog, timeout)
    } else {
        rank_arena_in::<u16>(ctx, job, prog, prog_len, dog, timeout)
    }
}

/// [`rank_arena`] with the arena held as `T` (the case's dtype's width):
/// every byte the exchange and redistribution move is the dtype's.
fn rank_arena_in<T: RankElem>(
    ctx: &mut RankCtx,
    job: &ArenaJob<'_>,
    prog: u64,
    prog_len: u32,
    dog: &Watchdog,
    timeout: Duration,
) -> Result<RankOut, Fault> {
    ctx.dev.bind().map_err(gpu("binding the context"))?;
    let (n, world, me) = (job.n, job.world, ctx.rank);
    let dtype = job.case.dtype();
    let plan = shard_plan(n, world).ok_or_else(|| infra("plan", "world = 0"))?;
    let my = plan[me];
    let max_shard = plan.iter().map(|s| s.len).max().unwrap_or(0);
    // Buffers of the other width for this length are given back first.
    if ctx.bufs.get(&n).is_some_and(|b| T::unwrap(b).is_none()) {
        ctx.bufs.remove(&n);
    }
    if let std::collections::hash_map::Entry::Vacant(slot) = ctx.bufs.entry(n) {
        let ld = row_stride_of(max_shard, dtype);
        let need = (n as u64 + (world * ld + 8) as u64) * T::BYTES;
        let (free, _) = ctx.dev.memory().map_err(gpu("memory query"))?;
        if need > free {
            return Err(Fault::Memory(format!(
                "needs {need} bytes of device memory on rank {me}, {free} free"
            )));
        }
        let alloc = gpu("allocating the arena");
        let arena = DeviceBuffer::<T>::alloc(&ctx.dev.ctx, n.max(1)).map_err(&alloc)?;
        let scratch =
            DeviceBuffer::<T>::alloc(&ctx.dev.ctx, (world * ld + 8).max(1)).map_err(&alloc)?;
        slot.insert(T::wrap(Arc::new(RankBufs { arena, scratch, ld })));
    }
    let bufs: Arc<RankBufs<T>> =
        T::unwrap(&ctx.bufs[&n]).ok_or_else(|| infra("arena", "buffers of another dtype"))?;
    let (arena, ld) = (bufs.arena.slice(0, n).map_err(gpu("arena"))?, bufs.ld);
    let stream = ctx.stream.clone();
    let scatter = !job.case.collective().is_all_reduce();
    let t0 = Instant::now();
    if !job.timing_only {
        match job.case.addends() {
            Addends::Generated { seed, distribution } => {
                // SAFETY: `arena` is a view of n elements of the dtype.
                unsafe {
                    ctx.dev
                        .generate(
                            arena.ptr(),
                            n as u64,
                            0,
                            *distribution,
                            *seed,
                            me as u32,
                            job.arena,
                            dtype,
                            &stream,
                        )
                        .map_err(gpu("generate"))?
                };
            }
            // This rank's own file, as in the job that wrote it.
            Addends::Files(f) => {
                let mut host = vec![0f32; n];
                f.read(me, job.arena as usize, &mut host)
                    .map_err(Fault::Addends)?;
                bufs.arena
                    .upload(&T::from_carriers(&host, dtype))
                    .map_err(gpu("uploading the rank file"))?;
            }
        }
    }
    stream
        .synchronize()
        .map_err(|e| GpuError::driver("cuStreamSynchronize", e))
        .map_err(gpu("generate"))?;
    let generate_ms = t0.elapsed().as_secs_f64() * 1e3;

    let t1 = Instant::now();
    {
        let _g = dog.guard(
            &format!("case `{}` arena {} on rank {me}", job.case.id(), job.arena),
            timeout,
        );
        let comm = &ctx.comm;
        let at = |s: &Shard| arena.slice(s.start, s.len);
        let mut phases = Vec::new();
        if job.case.contract() == Contract::NcclAllreduce && scatter {
            // NCCL's own reduce-scatter (the backend skipped an arena W does
            // not divide): its shard r is the plan's shard r, in place.
            if (my.start, my.len) != (me * (n / world), n / world) {
                return Err(infra(
                    "nccl-reducescatter",
                    format!("NCCL's shard {me} of {n} elements over W = {world} is not the plan's"),
                ));
            }
            if n > 0 {
                // SAFETY: the arena of this rank's context; the stream is
                // waited for before the arena is read or reused.
                unsafe { comm.reduce_scatter(arena, me, world, dtype, job.case.mean(), &stream) }
                    .map_err(gpu("nccl-reducescatter"))?;
                phases.push((mark(&stream, "nccl-reducescatter")?, "nccl-reducescatter"));
            }
        } else if job.case.contract() == Contract::NcclAllreduce {
            // The negative control: NCCL's own sum, in place, in the wire
            // dtype (a bf16 case: ncclBfloat16, as torch.distributed runs it).
            // SAFETY: the arena of this rank's context; the stream is waited
            // for before the arena is read or reused.
            unsafe { comm.all_reduce_sum(arena, dtype, &stream) }.map_err(gpu("nccl-allreduce"))?;
            phases.push((mark(&stream, "nccl-allreduce")?, "nccl-allreduce"));
        } else if n > 0 {
            let out = arena.slice(my.start, my.len).map_err(gpu("exchange"))?;
            let phase = ((out.ptr() & 15) / T::BYTES) as usize;
            // The W slots of my shard, row `src` at `src * ld`.
            let slots = bufs
                .scratch
                .slice(phase, (world - 1) * ld + my.len)
                .map_err(gpu("exchange"))?;
            let slot = |src: usize| slots.slice(src * ld, my.len);
            // Exchange: my copy of shard p to owner p; every rank's copy of
            // my shard into slot = source (mine included, sent to myself).
            let exchange = comm.group("exchange", |c| -> Result<(), GpuError> {
                for &p in &job.case.order().sequence(world) {
                    if plan[p].len > 0 {
                        let shard = at(&plan[p])?;
                        // SAFETY: a checked view of this rank's arena, only
                        // read; the stream is waited for before it changes.
                        unsafe { c.send(shard, p, &stream)? };
                    }
                    if my.len > 0 {
                        let into = slot(p)?;
                        // SAFETY: a checked view of one scratch slot, written
                        // by this receive alone and read by the fold after it
                        // on the same stream.
                        unsafe { c.recv(into, p, &stream)? };
                    }
                }
                Ok(())
            });
            exchange.map_err(gpu("exchange"))?;
            phases.push((mark(&stream, "exchange")?, "exchange"));
            let args = crate::gpu::device::FoldArgs {
                out: out.ptr(),
                stacked: slots.ptr(),
                ld: ld as u64,
                len: my.len as u64,
                world: world as u32,
                prog,
                prog_len,
                scale: job.case.mean().then(|| mean_scale(world)),
                dtype,
            };
            // SAFETY: `out` is my shard, `slots` its W rows at the same phase.
            unsafe {
                ctx.dev
                    .fold(job.variant, job.mode, &args, &job.cuda.tuning, &stream)
                    .map_err(gpu("fold"))?
            };
            phases.push((mark(&stream, "fold")?, "fold"));
            // A reduce-scatter ends with the fold: rank o keeps shard o.
            if !scatter {
                // Redistribute: my reduced shard to every other rank, every
                // other owner's shard into its place in my arena. Point-to-point
                // only, so no NCCL_ALGO setting can refuse or reroute it.
                let redistribution = comm.group("redistribution", |c| -> Result<(), GpuError> {
                    for (o, s) in plan.iter().enumerate() {
                        if o == me {
                            continue;
                        }
                        if s.len > 0 {
                            let into = at(s)?;
                            // SAFETY: owner o's shard of my arena, written by this
                            // receive alone (no other call touches it); the stream
                            // is waited for below.
                            unsafe { c.recv(into, o, &stream)? };
                        }
                        if my.len > 0 {
                            let mine = at(&my)?;
                            // SAFETY: my reduced shard, only read, not
                            // overlapping any receive; waited for below.
                            unsafe { c.send(mine, o, &stream)? };
                        }
                    }
                    Ok(())
                });
                redistribution.map_err(gpu("redistribution"))?;
                phases.push((mark(&stream, "redistribution")?, "redistribution"));
            }
        }
        await_phases(ctx, &phases, dog)?;
    }
    if scatter {
        return finish_scatter(ctx, job, &bufs, &plan, generate_ms, t1, dog, timeout);
    }
    let reduce_ms = t1.elapsed().as_secs_f64() * 1e3;
    let keep = job.opts.keep_values && me == 0;
    let t2 = Instant::now();
    // An empty arena still owns a one-element allocation: hash nothing.
    let (digest, values) = if job.timing_only {
        (Default::default(), None)
    } else if n == 0 {
        let d = crate::digest::digest_chunked(&[], job.opts.nan_policy);
        (d, keep.then(Vec::new))
    } else {
        ctx.reader
            .digest(
                &ctx.dev,
                &bufs.arena,
                dtype,
                job.opts.nan_policy,
                keep,
                me == 0,
            )
            .map_err(gpu("digest"))?
    };
    Ok(RankOut {
        digest,
        gathered: None,
        own_shard: None,
        values,
        generate_ms,
        reduce_ms,
        digest_ms: t2.elapsed().as_secs_f64() * 1e3,
    })
}

/// A reduce-scatter's end on one rank, once the timed collective is done:
/// hash my own shard where it lies, then (outside the timing) send it to
/// rank 0, which receives every shard into its place in its arena and
/// hashes the gathered arena whole and per chunk. Point-to-point only.
#[allow(clippy::too_many_arguments)]
fn finish_scatter<T: RankElem>(
    ctx: &mut RankCtx,
    job: &ArenaJob<'_>,
    bufs: &RankBufs<T>,
    plan: &[Shard],
    generate_ms: f64,
    t1: Instant,
    dog: &Watchdog,
    timeout: Duration,
) -> Result<RankOut, Fault> {
    let reduce_ms = t1.elapsed().as_secs_f64() * 1e3;
    let (n, world, me) = (job.n, job.world, ctx.rank);
    if job.timing_only {
        return Ok(RankOut {
            digest: Default::default(),
            gathered: None,
            own_shard: None,
            values: None,
            generate_ms,
            reduce_ms,
            digest_ms: 0.0,
        });
    }
    let (dtype, policy) = (job.case.dtype(), job.opts.nan_policy);
    let t2 = Instant::now();
    let my = plan[me];
    let arena = bufs.arena.slice(0, n).map_err(gpu("shard gather"))?;
    let keep_own = job.case.expect_own().is_some();
    let (digest, own_shard) = if my.len == 0 {
        (
            crate::digest::digest_chunked(&[], policy),
            keep_own.then(Vec::new),
        )
    } else {
        let view = arena.slice(my.start, my.len).map_err(gpu("digest"))?;
        ctx.reader
            .digest_view(&ctx.dev, view, dtype, policy, keep_own, false)
            .map_err(gpu("digest"))?
    };
    if world > 1 && n > 0 {
        let phase = "shard gather";
        let _g = dog.guard(
            &format!(
                "case `{}` arena {} shard gather on rank {me}",
                job.case.id(),
                job.arena
            ),
            timeout,
        );
        let stream = ctx.stream.clone();
        let calls = ctx.comm.group(phase, |c| -> Result<(), GpuError> {
            if me == 0 {
                for (r, s) in plan.iter().enumerate().skip(1).filter(|(_, s)| s.len > 0) {
                    let into = arena.slice(s.start, s.len)?;
                    // SAFETY: rank r's shard of my arena, written by this
                    // receive alone; the stream is waited for below.
                    unsafe { c.recv(into, r, &stream)? };
                }
            } else if my.len > 0 {
                let mine = arena.slice(my.start, my.len)?;
                // SAFETY: my reduced shard, only read; waited for below.
                unsafe { c.send(mine, 0, &stream)? };
            }
            Ok(())
        });
        calls.map_err(gpu(phase))?;
        let ev = mark(&stream, phase)?;
        await_phases(ctx, &[(ev, phase)], dog)?;
    }
    let keep = job.opts.keep_values && me == 0;
    let (gathered, values) = if me != 0 {
        (None, None)
    } else if n == 0 {
        (
            Some(crate::digest::digest_chunked(&[], policy)),
            keep.then(Vec::new),
        )
    } else {
        let (d, v) = ctx
            .reader
            .digest_view(&ctx.dev, arena, dtype, policy, keep, true)
            .map_err(gpu("digest"))?;
        (Some(d), v)
    };
    Ok(RankOut {
        digest,
        gathered,
        own_shard,
        values,
        generate_ms,
        reduce_ms,
        digest_ms: t2.elapsed().as_secs_f64() * 1e3,
    })
}

impl NcclBackend {
    /// Every rank's digest, in rank order: collected from threads, or moved
    /// between processes with an all-gather of the 32 digest bytes.
    pub(super) fn gather(
        &mut self,
        mine: &[crate::digest::Sha256],
    ) -> Result<Vec<crate::digest::Sha256>, Fault> {
        if self.world.env().is_none() {
            return Ok(mine.to_vec());
        }
        let words: Vec<u32> = mine[0]
            .as_bytes()
            .chunks_exact(4)
            .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        let all = self.all_gather("digest gather", &words)?;
        Ok(all
            .iter()
            .map(|w| {
                let mut bytes = [0u8; 32];
                for (out, v) in bytes.chunks_exact_mut(4).zip(w) {
                    out.copy_from_slice(&v.to_le_bytes());
                }
                crate::digest::Sha256::from_bytes(bytes)
            })
            .collect())
    }

    /// Every rank's `mine` (the same length on every rank), in rank order,
    /// between the processes of the communicator: point-to-point like the
    /// reduction itself (no collective for NCCL_ALGO to veto).
    pub(super) fn all_gather(
        &mut self,
        phase: &'static str,
        mine: &[u32],
    ) -> Result<Vec<Vec<u32>>, Fault> {
        let world = self.world.size();
        let (dog, timeout) = (&self.watchdog, self.cfg.timeout);
        let per_rank = self.world.env().is_some();
        let Some(ctx) = self.ranks.first_mut().filter(|_| per_rank) else {
            return Err(infra(phase, "an all-gather needs one process per rank"));
        };
        let k = mine.len();
        let failed = gpu(phase);
        ctx.dev.bind().map_err(&failed)?;
        let send = DeviceBuffer::<u32>::alloc(&ctx.dev.ctx, k.max(1)).map_err(&failed)?;
        let recv = DeviceBuffer::<u32>::alloc(&ctx.dev.ctx, (k * world).max(1)).map_err(&failed)?;
        send.upload(mine).map_err(&failed)?;
        let me = ctx.rank;
        let stream = ctx.stream.clone();
        if k > 0 {
            let _g = dog.guard(phase, timeout);
            let out = send.slice(0, k).map_err(&failed)?;
            let calls = ctx.comm.group(phase, |c| -> Result<(), GpuError> {
                for p in (0..world).filter(|&p| p != me) {
                    let slot = recv.slice(k * p, k)?;
                    // SAFETY: k words out of `send`, k into slot p; both
                    // buffers outlive the wait below.
                    unsafe {
                        c.send(out, p, &stream)?;
                        c.recv(slot, p, &stream)?;
                    }
                }
                Ok(())
            });
            calls.map_err(&failed)?;
            let ev = mark(&stream, phase)?;
            await_phases(ctx, &[(ev, phase)], dog)?;
        }
        let all = recv.to_host().map_err(&failed)?;
        Ok((0..world)
            .map(|p| {
                if p == me {
                    mine.to_vec()
                } else {
                    all[k * p..k * (p + 1)].to_vec()
                }
            })
            .collect())
    }
}
