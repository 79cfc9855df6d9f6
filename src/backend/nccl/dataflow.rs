//! One arena on one rank: generate, exchange into slots by source rank,
//! fold, redistribute, digest; plus the digest gather between processes.
//! Point-to-point NCCL calls only, and every wait watches NCCL's
//! asynchronous error state.

use super::loader::{self, Nccl, NCCL_FLOAT32, NCCL_SUM};
use super::{NcclBackend, RankBufs, RankCtx, NAME};
use crate::backend::cuda::kernels::FoldMode;
use crate::backend::cuda::mem::DeviceView;
use crate::backend::cuda::mem::{DeviceBuffer, F32};
use crate::backend::cuda::world::row_stride;
use crate::backend::cuda::{CudaConfig, KernelVariant};
use crate::backend::{infrastructure, BackendError, RunOptions};
use crate::experiment::Case;
use crate::fold::{mean_scale, shard_plan, Contract, Shard};
use crate::ranks::watchdog::Watchdog;
use std::ffi::c_void;
use std::sync::Arc;
use std::time::{Duration, Instant};

pub(super) struct RankOut {
    pub(super) digest: crate::digest::ChunkedDigest,
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
    pub(super) cuda: &'a CudaConfig,
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
    /// NCCL, the driver or the watchdog failed in `phase`.
    Infra { phase: String, message: String },
}

impl From<String> for Fault {
    fn from(message: String) -> Fault {
        Fault::Infra {
            phase: "cuda".into(),
            message,
        }
    }
}

pub(super) fn infra(phase: &str, message: impl Into<String>) -> Fault {
    Fault::Infra {
        phase: phase.to_string(),
        message: message.into(),
    }
}

impl Fault {
    pub(super) fn into_backend(self, case: &str) -> BackendError {
        match self {
            Fault::Memory(m) => BackendError::Unavailable {
                backend: NAME,
                reason: format!("case `{case}`: {m}"),
            },
            Fault::Infra { phase, message } => infrastructure(case, phase, message),
        }
    }
}

fn check_nccl(nccl: &Nccl, r: i32, phase: &str, what: &str) -> Result<(), Fault> {
    nccl.check(r, what).map_err(|m| infra(phase, m))
}

/// Wait until every phase's event completed, watching NCCL's asynchronous
/// error state meanwhile (as nccl-tests does). A blocking stream sync would
/// sit out the whole watchdog when a peer dies; this returns as soon as NCCL
/// notices, aborts the communicator and names the first unfinished phase.
fn await_phases(
    nccl: &Nccl,
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
                Err(e) => return Err(infra(name, crate::backend::cuda::driver_error_text(e))),
            }
        }
        let Some(phase) = pending else {
            return Ok(());
        };
        if let Some(p) = dog.fired() {
            ctx.aborted = true;
            return Err(infra(
                phase,
                format!("watchdog fired during `{p}`; communicator aborted"),
            ));
        }
        let mut state = 0;
        // SAFETY: out-parameter on a live communicator.
        let r = unsafe { (nccl.comm_get_async_error)(ctx.comm.0, &mut state) };
        let bad = if r != 0 { r } else { state };
        if bad != 0 && bad != loader::NCCL_IN_PROGRESS {
            let what = nccl
                .check(bad, "NCCL reported an asynchronous error")
                .err()
                .unwrap_or_default();
            // SAFETY: our live communicator, aborted only below.
            let detail = unsafe { nccl.last_error(ctx.comm.0) };
            // SAFETY: abort is allowed at any time and unblocks the kernels.
            unsafe { (nccl.comm_abort)(ctx.comm.0) };
            ctx.aborted = true;
            return Err(infra(
                phase,
                match detail {
                    Some(d) => format!("{what}: {d} (a peer rank died or its connection broke); communicator aborted"),
                    None => format!("{what} (a peer rank died or its connection broke); communicator aborted"),
                },
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
pub(super) fn on_every_rank<T: Send, E: Send + From<String>>(
    ranks: &mut [RankCtx],
    f: impl Fn(&mut RankCtx) -> Result<T, E> + Sync,
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
                    .unwrap_or_else(|_| Err(E::from("a rank thread panicked".to_string())))
            })
            .collect()
    })
}

fn mark(
    stream: &cudarc::driver::CudaStream,
    phase: &str,
) -> Result<cudarc::driver::CudaEvent, Fault> {
    stream
        .record_event(None)
        .map_err(|e| infra(phase, crate::backend::cuda::driver_error_text(e)))
}

pub(super) fn rank_arena(
    nccl: &Nccl,
    ctx: &mut RankCtx,
    job: &ArenaJob<'_>,
    prog: u64,
    prog_len: u32,
    dog: &Watchdog,
    timeout: Duration,
) -> Result<RankOut, Fault> {
    ctx.dev
        .ctx
        .bind_to_thread()
        .map_err(crate::backend::cuda::driver_error_text)?;
    let (n, world, me) = (job.n, job.world, ctx.rank);
    let plan = shard_plan(n, world).ok_or_else(|| infra("plan", "world = 0"))?;
    let my = plan[me];
    let max_shard = plan.iter().map(|s| s.len).max().unwrap_or(0);
    if let std::collections::hash_map::Entry::Vacant(slot) = ctx.bufs.entry(n) {
        let ld = row_stride(max_shard);
        let need = (n as u64 + (world * ld + 4) as u64) * F32;
        let (free, _) = ctx.dev.memory()?;
        if need > free {
            return Err(Fault::Memory(format!(
                "needs {need} bytes of device memory on rank {me}, {free} free"
            )));
        }
        let arena = DeviceBuffer::alloc(&ctx.dev.ctx, n.max(1))?;
        let scratch = DeviceBuffer::alloc(&ctx.dev.ctx, (world * ld + 4).max(1))?;
        slot.insert(Arc::new(RankBufs { arena, scratch, ld }));
    }
    let bufs = ctx.bufs[&n].clone();
    let (arena, ld) = (bufs.arena.slice(0, n)?, bufs.ld);
    let stream = ctx.stream.clone();
    let cu = stream.cu_stream() as loader::Stream;
    let comm = ctx.comm.0;
    let t0 = Instant::now();
    if !job.timing_only {
        // SAFETY: `arena` is a view of n f32s of this context.
        unsafe {
            ctx.dev.generate(
                arena.ptr(),
                n as u64,
                0,
                job.case.distribution,
                job.case.seed,
                me as u32,
                job.arena,
                &stream,
            )?
        };
    }
    stream
        .synchronize()
        .map_err(|e| infra("generate", crate::backend::cuda::driver_error_text(e)))?;
    let generate_ms = t0.elapsed().as_secs_f64() * 1e3;

    let t1 = Instant::now();
    {
        let _g = dog.guard(
            &format!("case `{}` arena {} on rank {me}", job.case.id, job.arena),
            timeout,
        );
        // NCCL takes raw addresses: every one comes from a checked view.
        let raw = |v: DeviceView<'_>| v.ptr() as *mut c_void;
        let at = |s: &Shard| arena.slice(s.start, s.len).map(raw);
        let mut phases = Vec::new();
        if job.case.contract == Contract::NcclAllreduce {
            // The negative control: NCCL's own sum, in place.
            let a = raw(arena);
            // SAFETY: n f32s of a checked view, in place, this rank's stream.
            let r = unsafe { (nccl.all_reduce)(a, a, n, NCCL_FLOAT32, NCCL_SUM, comm, cu) };
            check_nccl(nccl, r, "nccl-allreduce", "ncclAllReduce")?;
            phases.push((mark(&stream, "nccl-allreduce")?, "nccl-allreduce"));
        } else if n > 0 {
            let out = arena.slice(my.start, my.len)?;
            let phase = ((out.ptr() & 15) / F32) as usize;
            // The W slots of my shard, row `src` at `src * ld`.
            let slots = bufs.scratch.slice(phase, (world - 1) * ld + my.len)?;
            let slot = |src: usize| slots.slice(src * ld, my.len).map(raw);
            // Exchange: my copy of shard p to owner p; every rank's copy of
            // my shard into slot = source (mine included, sent to myself).
            // SAFETY: every address is a checked view of the arena or the
            // scratch; sends read arena shards, receives write slots.
            unsafe {
                check_nccl(nccl, (nccl.group_start)(), "exchange", "ncclGroupStart")?;
                for &p in &job.case.order.sequence(world) {
                    if plan[p].len > 0 {
                        check_nccl(
                            nccl,
                            (nccl.send)(
                                at(&plan[p])?,
                                plan[p].len,
                                NCCL_FLOAT32,
                                p as i32,
                                comm,
                                cu,
                            ),
                            "exchange",
                            "ncclSend",
                        )?;
                    }
                    if my.len > 0 {
                        check_nccl(
                            nccl,
                            (nccl.recv)(slot(p)?, my.len, NCCL_FLOAT32, p as i32, comm, cu),
                            "exchange",
                            "ncclRecv",
                        )?;
                    }
                }
                check_nccl(nccl, (nccl.group_end)(), "exchange", "ncclGroupEnd")?;
            }
            phases.push((mark(&stream, "exchange")?, "exchange"));
            let args = crate::backend::cuda::device::FoldArgs {
                out: out.ptr(),
                stacked: slots.ptr(),
                ld: ld as u64,
                len: my.len as u64,
                world: world as u32,
                prog,
                prog_len,
                scale: job.case.mean.then(|| mean_scale(world)),
            };
            // SAFETY: `out` is my shard, `slots` its W rows at the same phase.
            unsafe {
                ctx.dev
                    .fold(job.variant, job.mode, &args, &job.cuda.tuning, &stream)
                    .map_err(|m| infra("fold", m))?
            };
            phases.push((mark(&stream, "fold")?, "fold"));
            // Redistribute: my reduced shard to every other rank, every
            // other owner's shard into its place in my arena. Point-to-point
            // only, so no NCCL_ALGO setting can refuse or reroute it.
            // SAFETY: each shard lies inside the arena; sends read my shard,
            // receives write the others', which do not overlap it.
            unsafe {
                check_nccl(
                    nccl,
                    (nccl.group_start)(),
                    "redistribution",
                    "ncclGroupStart",
                )?;
                for (o, s) in plan.iter().enumerate() {
                    if o == me {
                        continue;
                    }
                    if s.len > 0 {
                        check_nccl(
                            nccl,
                            (nccl.recv)(at(s)?, s.len, NCCL_FLOAT32, o as i32, comm, cu),
                            "redistribution",
                            "ncclRecv",
                        )?;
                    }
                    if my.len > 0 {
                        check_nccl(
                            nccl,
                            (nccl.send)(at(&my)?, my.len, NCCL_FLOAT32, o as i32, comm, cu),
                            "redistribution",
                            "ncclSend",
                        )?;
                    }
                }
                check_nccl(nccl, (nccl.group_end)(), "redistribution", "ncclGroupEnd")?;
            }
            phases.push((mark(&stream, "redistribution")?, "redistribution"));
        }
        await_phases(nccl, ctx, &phases, dog)?;
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
            .digest(&ctx.dev, &bufs.arena, job.opts.nan_policy, keep, me == 0)
            .map_err(|m| infra("digest", m))?
    };
    Ok(RankOut {
        digest,
        values,
        generate_ms,
        reduce_ms,
        digest_ms: t2.elapsed().as_secs_f64() * 1e3,
    })
}

impl NcclBackend {
    /// Every rank's digest, in rank order: collected from threads, or moved
    /// between processes with an all-gather of the 32 digest bytes.
    pub(super) fn gather(&mut self, mine: &[String]) -> Result<Vec<String>, Fault> {
        let world = self.world;
        let (nccl, dog, timeout) = (&self.nccl, &self.watchdog, self.cfg.timeout);
        let Some(ctx) = self.ranks.first_mut().filter(|_| self.env.is_some()) else {
            return Ok(mine.to_vec());
        };
        ctx.dev
            .ctx
            .bind_to_thread()
            .map_err(crate::backend::cuda::driver_error_text)?;
        if ctx.gather.is_none() {
            ctx.gather = Some(Arc::new((
                DeviceBuffer::alloc(&ctx.dev.ctx, 8)?,
                DeviceBuffer::alloc(&ctx.dev.ctx, 8 * world)?,
            )));
        }
        let gather = match ctx.gather.clone() {
            Some(g) => g,
            None => return Err(infra("digest gather", "no gather buffers")),
        };
        let (send, recv) = (gather.0.slice(0, 8)?, gather.1.slice(0, 8 * world)?);
        let bytes = hex::decode(&mine[0]).map_err(|e| infra("digest gather", e.to_string()))?;
        let words: Vec<f32> = bytes
            .chunks_exact(4)
            .map(|c| f32::from_bits(u32::from_le_bytes([c[0], c[1], c[2], c[3]])))
            .collect();
        gather.0.upload(&words)?;
        let (me, comm) = (ctx.rank, ctx.comm.0);
        let stream = ctx.stream.clone();
        let cu = stream.cu_stream() as loader::Stream;
        {
            let _g = dog.guard("digest gather", timeout);
            // 32 bytes to and from every peer, point-to-point like the
            // reduction itself (no collective for NCCL_ALGO to veto).
            // SAFETY: 8 words out of `send`, 8 into slot p of `recv`.
            unsafe {
                check_nccl(
                    nccl,
                    (nccl.group_start)(),
                    "digest gather",
                    "ncclGroupStart",
                )?;
                for p in (0..world).filter(|&p| p != me) {
                    let slot = recv.slice(8 * p, 8)?.ptr() as *mut c_void;
                    check_nccl(
                        nccl,
                        (nccl.send)(
                            send.ptr() as *const c_void,
                            8,
                            NCCL_FLOAT32,
                            p as i32,
                            comm,
                            cu,
                        ),
                        "digest gather",
                        "ncclSend",
                    )?;
                    check_nccl(
                        nccl,
                        (nccl.recv)(slot, 8, NCCL_FLOAT32, p as i32, comm, cu),
                        "digest gather",
                        "ncclRecv",
                    )?;
                }
                check_nccl(nccl, (nccl.group_end)(), "digest gather", "ncclGroupEnd")?;
            }
            let ev = mark(&stream, "digest gather")?;
            await_phases(nccl, ctx, &[(ev, "digest gather")], dog)?;
        }
        let mut all = vec![0f32; 8 * world];
        gather.1.download(0, &mut all)?;
        Ok(all
            .chunks_exact(8)
            .enumerate()
            .map(|(p, w)| {
                if p == me {
                    return mine[0].clone();
                }
                hex::encode(
                    w.iter()
                        .flat_map(|v| v.to_bits().to_le_bytes())
                        .collect::<Vec<u8>>(),
                )
            })
            .collect())
    }
}
