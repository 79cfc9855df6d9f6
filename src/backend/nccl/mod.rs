//! The NCCL backend: the reducer's production dataflow over a live
//! communicator, one rank per GPU. NCCL only moves bytes: one group of
//! send/recv lands every rank's copy of my shard in slot = source rank
//! (my own copy too, as a send to myself), the fold kernel reduces my
//! shard, and a group of per-owner in-place broadcasts redistributes.
//!
//! Two launch modes: one process per rank (rank, world and local device
//! from the launcher's environment, the unique id and the case agreement
//! over `dist::rendezvous`), or one process with one thread and context per
//! GPU (`--gpus N`). Every blocking window runs under `dist::watchdog`.

pub mod lib;

use super::cuda::mem::{DeviceBuffer, F32};
use super::cuda::world::{row_stride, Reader};
use super::cuda::{kernels::FoldMode, libs, CudaConfig, Device, KernelVariant};
use super::{
    failed, infrastructure, Backend, BackendError, CaseRun, ReducedArena, RoundTimings, RunOptions,
};
use crate::dist::launcher::RankEnv;
use crate::dist::rendezvous::{self, Plan};
use crate::dist::watchdog::Watchdog;
use crate::experiment::Case;
use crate::fold::{mean_scale, shard_plan, Contract};
use lib::{Comm, Nccl, UniqueId, NCCL_FLOAT32, NCCL_SUM};
use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const NAME: &str = "nccl";

/// How the NCCL backend starts.
#[derive(Debug, Clone)]
pub struct NcclConfig {
    pub cuda: CudaConfig,
    /// One process, this many GPUs (one thread each); ignored when a
    /// launcher's rank variables are set.
    pub gpus: usize,
    /// Bound on rendezvous + communicator init.
    pub init_timeout: Duration,
    /// Bound on every collective window (enqueue + stream sync).
    pub timeout: Duration,
    /// What all ranks must agree on before any collective.
    pub plan: Plan,
}

/// A communicator handle that may cross threads (NCCL allows that as long
/// as one thread uses it at a time, which `RankCtx` ownership ensures).
#[derive(Clone, Copy)]
struct CommPtr(Comm);
unsafe impl Send for CommPtr {}
unsafe impl Sync for CommPtr {}

struct RankBufs {
    arena: DeviceBuffer,
    scratch: DeviceBuffer,
    ld: usize,
}

struct RankCtx {
    rank: usize,
    dev: Device,
    stream: Arc<cudarc::driver::CudaStream>,
    comm: CommPtr,
    reader: Reader,
    bufs: HashMap<usize, RankBufs>,
    gather: Option<(DeviceBuffer, DeviceBuffer)>,
}

pub struct NcclBackend {
    nccl: Arc<Nccl>,
    world: usize,
    ranks: Vec<RankCtx>,
    /// Set in one-process-per-rank mode.
    env: Option<RankEnv>,
    cfg: NcclConfig,
    version: (i32, i32, i32),
    watchdog: Watchdog,
    comms: Arc<Mutex<Vec<CommPtr>>>,
    rendezvous: String,
}

fn unavailable(reason: impl Into<String>) -> BackendError {
    BackendError::Unavailable {
        backend: NAME,
        reason: reason.into(),
    }
}

fn id_bytes(id: &UniqueId) -> Vec<u8> {
    id.internal.iter().map(|&c| c as u8).collect()
}

fn id_from(bytes: &[u8]) -> Result<UniqueId, String> {
    if bytes.len() != 128 {
        return Err(format!("unique id of {} bytes, expected 128", bytes.len()));
    }
    let mut id = UniqueId { internal: [0; 128] };
    for (d, s) in id.internal.iter_mut().zip(bytes) {
        *d = *s as std::ffi::c_char;
    }
    Ok(id)
}

/// Job token and job id from the environment: our own variables first,
/// then what Slurm or torchrun give every rank alike.
fn job_identity() -> (Vec<u8>, String, &'static str) {
    let get = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
    let job = get("FOLDPRINT_JOB_ID")
        .or_else(|| get("SLURM_JOB_ID"))
        .or_else(|| get("TORCHELASTIC_RUN_ID"))
        .unwrap_or_else(|| "foldprint".into());
    match get("FOLDPRINT_JOB_TOKEN") {
        Some(t) => (t.into_bytes(), job, "FOLDPRINT_JOB_TOKEN"),
        None => (
            job.clone().into_bytes(),
            job,
            "job id (set FOLDPRINT_JOB_TOKEN for a secret token)",
        ),
    }
}

impl NcclBackend {
    pub fn new(cfg: NcclConfig) -> Result<NcclBackend, BackendError> {
        let probe = super::cuda::probe();
        if !probe.usable {
            return Err(unavailable(probe.short_reason()));
        }
        let nccl = Arc::new(Nccl::load().map_err(unavailable)?);
        let version = nccl.version().map_err(unavailable)?;
        let env =
            crate::dist::launcher::from_process_env().map_err(|e| unavailable(e.to_string()))?;
        let comms: Arc<Mutex<Vec<CommPtr>>> = Arc::new(Mutex::new(Vec::new()));
        let watchdog = {
            let (nccl, comms) = (nccl.clone(), comms.clone());
            let me = env
                .as_ref()
                .map_or("rank 0".to_string(), |e| format!("rank {}", e.rank));
            Watchdog::new(move |phase| {
                eprintln!("error: {me}: watchdog: `{phase}` did not finish in time; aborting the communicator");
                for c in comms.lock().unwrap_or_else(|p| p.into_inner()).iter() {
                    // SAFETY: abort is the one call NCCL allows from another thread.
                    unsafe { (nccl.comm_abort)(c.0) };
                }
                // If the blocked call still does not return, do not hang.
                std::thread::spawn(|| {
                    std::thread::sleep(Duration::from_secs(10));
                    eprintln!("error: watchdog: exiting after abort");
                    std::process::exit(4);
                });
            })
        };
        let mut backend = NcclBackend {
            nccl,
            world: 0,
            ranks: Vec::new(),
            env: env.clone(),
            cfg: cfg.clone(),
            version,
            watchdog,
            comms,
            rendezvous: String::new(),
        };
        match env {
            Some(e) => backend.init_process(&e)?,
            None => backend.init_threads(cfg.gpus.max(1))?,
        }
        Ok(backend)
    }

    fn open_rank(&self, rank: usize, ordinal: usize) -> Result<RankCtx, BackendError> {
        let dev = Device::open(ordinal, self.cfg.cuda.compile).map_err(unavailable)?;
        let stream = dev.new_stream().map_err(unavailable)?;
        let reader = Reader::new(&dev, self.cfg.cuda.chunk.max(1024)).map_err(unavailable)?;
        Ok(RankCtx {
            rank,
            dev,
            stream,
            comm: CommPtr(std::ptr::null_mut()),
            reader,
            bufs: HashMap::new(),
            gather: None,
        })
    }

    fn init_comm(nccl: &Nccl, ctx: &mut RankCtx, world: usize, id: UniqueId) -> Result<(), String> {
        ctx.dev
            .ctx
            .bind_to_thread()
            .map_err(super::cuda::driver_error_text)?;
        let mut comm: Comm = std::ptr::null_mut();
        // SAFETY: out-parameter; id is the job's unique id.
        nccl.check(
            unsafe { (nccl.comm_init_rank)(&mut comm, world as i32, id, ctx.rank as i32) },
            &format!("ncclCommInitRank (rank {} of {world})", ctx.rank),
        )?;
        ctx.comm = CommPtr(comm);
        Ok(())
    }

    /// One process, one thread and context per GPU.
    fn init_threads(&mut self, gpus: usize) -> Result<(), BackendError> {
        let probe = super::cuda::probe();
        if gpus > probe.device_count {
            return Err(unavailable(format!(
                "--gpus {gpus} but the driver reports {} device(s)",
                probe.device_count
            )));
        }
        let mut ranks = (0..gpus)
            .map(|r| self.open_rank(r, r))
            .collect::<Result<Vec<_>, _>>()?;
        let id = self.unique_id()?;
        let nccl = &self.nccl;
        let _g = self
            .watchdog
            .guard("communicator init", self.cfg.init_timeout);
        let results: Vec<Result<(), String>> = std::thread::scope(|s| {
            let hs: Vec<_> = ranks
                .iter_mut()
                .map(|ctx| s.spawn(move || Self::init_comm(nccl, ctx, gpus, id)))
                .collect();
            hs.into_iter()
                .map(|h| {
                    h.join()
                        .unwrap_or_else(|_| Err("init thread panicked".into()))
                })
                .collect()
        });
        for r in results {
            r.map_err(unavailable)?;
        }
        self.comms
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .extend(ranks.iter().map(|r| r.comm));
        self.world = gpus;
        self.ranks = ranks;
        self.rendezvous = "in-process".into();
        Ok(())
    }

    /// One process per rank: rendezvous, agreement, init.
    fn init_process(&mut self, e: &RankEnv) -> Result<(), BackendError> {
        let mut ctx = self.open_rank(e.rank, e.local_rank)?;
        let deadline = Instant::now() + self.cfg.init_timeout;
        let (token, job, _) = job_identity();
        let dist_err = |err: crate::dist::DistError| match err {
            crate::dist::DistError::Disagree(m) => {
                unavailable(format!("ranks disagree on the work: {m}"))
            }
            other => unavailable(other.to_string()),
        };
        let payload = if e.rank == 0 {
            id_bytes(&self.unique_id()?)
        } else {
            Vec::new()
        };
        let id_payload = if let Ok(dir) = std::env::var("FOLDPRINT_RENDEZVOUS_DIR") {
            let dir = std::path::PathBuf::from(dir);
            self.rendezvous = format!("directory {} (job {job})", dir.display());
            if e.rank == 0 {
                rendezvous::publish_dir(&dir, &job, e.world, &self.cfg.plan, &payload, deadline)
                    .map_err(dist_err)?;
                payload
            } else {
                rendezvous::join_dir(&dir, &job, e.rank, &self.cfg.plan, deadline)
                    .map_err(dist_err)?
            }
        } else {
            let (host, port) = rendezvous_addr(e).map_err(unavailable)?;
            self.rendezvous = format!("tcp {host}:{port}");
            if e.rank == 0 {
                let listener = std::net::TcpListener::bind((host.as_str(), port))
                    .or_else(|_| std::net::TcpListener::bind(("0.0.0.0", port)))
                    .map_err(|err| {
                        unavailable(format!("rank 0 cannot listen on {host}:{port}: {err}"))
                    })?;
                rendezvous::serve(
                    &listener,
                    e.world,
                    &token,
                    &self.cfg.plan,
                    &payload,
                    deadline,
                )
                .map_err(dist_err)?;
                payload
            } else {
                let addr = std::net::ToSocketAddrs::to_socket_addrs(&(host.as_str(), port))
                    .ok()
                    .and_then(|mut a| a.next())
                    .ok_or_else(|| {
                        unavailable(format!("cannot resolve rendezvous address {host}:{port}"))
                    })?;
                rendezvous::join(addr, e.rank, &token, &self.cfg.plan, deadline)
                    .map_err(dist_err)?
            }
        };
        let id = id_from(&id_payload).map_err(unavailable)?;
        {
            let _g = self
                .watchdog
                .guard("communicator init", self.cfg.init_timeout);
            Self::init_comm(&self.nccl, &mut ctx, e.world, id).map_err(unavailable)?;
        }
        self.comms
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(ctx.comm);
        self.world = e.world;
        self.ranks = vec![ctx];
        Ok(())
    }

    fn unique_id(&self) -> Result<UniqueId, BackendError> {
        let mut id = UniqueId { internal: [0; 128] };
        // SAFETY: out-parameter.
        self.nccl
            .check(
                unsafe { (self.nccl.get_unique_id)(&mut id) },
                "ncclGetUniqueId",
            )
            .map_err(unavailable)?;
        Ok(id)
    }

    /// The communicator's world size.
    pub fn world(&self) -> usize {
        self.world
    }

    fn process_rank(&self) -> Option<usize> {
        self.env.as_ref().map(|e| e.rank)
    }
}

/// Rank 0's rendezvous address: foldprint's variables, else torchrun's
/// MASTER_ADDR with MASTER_PORT + 1 (torchrun's own store holds MASTER_PORT).
fn rendezvous_addr(e: &RankEnv) -> Result<(String, u16), String> {
    let get = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
    if let (Some(h), Some(p)) = (get("FOLDPRINT_MASTER_ADDR"), get("FOLDPRINT_MASTER_PORT")) {
        let port = p
            .parse()
            .map_err(|_| format!("FOLDPRINT_MASTER_PORT={p:?} is not a port"))?;
        return Ok((h, port));
    }
    if let Some((h, p)) = &e.master {
        let port = p
            .checked_add(1)
            .ok_or("MASTER_PORT is 65535: set FOLDPRINT_MASTER_PORT")?;
        return Ok((h.clone(), port));
    }
    Err(format!(
        "{} gave no rendezvous address: set FOLDPRINT_MASTER_ADDR and FOLDPRINT_MASTER_PORT (rank 0's host and a free port), or FOLDPRINT_RENDEZVOUS_DIR to a directory all ranks share",
        e.source
    ))
}

struct RankOut {
    digest: crate::digest::ChunkedDigest,
    values: Option<Vec<f32>>,
    generate_ms: f64,
    reduce_ms: f64,
}

/// What one rank does for one arena.
struct ArenaJob<'a> {
    case: &'a Case,
    arena: u32,
    n: usize,
    world: usize,
    mode: FoldMode,
    variant: KernelVariant,
    cuda: &'a CudaConfig,
    opts: &'a RunOptions,
    /// Benchmark repetition: the arena already holds data; time the
    /// collectives only (no generation, no digest).
    timing_only: bool,
}

fn check_nccl(nccl: &Nccl, r: i32, what: &str) -> Result<(), String> {
    nccl.check(r, what)
}

fn rank_arena(
    nccl: &Nccl,
    ctx: &mut RankCtx,
    job: &ArenaJob<'_>,
    prog: u64,
    prog_len: u32,
    dog: &Watchdog,
    timeout: Duration,
) -> Result<RankOut, String> {
    let dev = &ctx.dev;
    dev.ctx
        .bind_to_thread()
        .map_err(super::cuda::driver_error_text)?;
    let (n, world, me) = (job.n, job.world, ctx.rank);
    let plan = shard_plan(n, world).ok_or("world = 0")?;
    let my = plan[me];
    let max_shard = plan.iter().map(|s| s.len).max().unwrap_or(0);
    if let std::collections::hash_map::Entry::Vacant(slot) = ctx.bufs.entry(n) {
        let ld = row_stride(max_shard);
        let need = (n as u64 + (world * ld + 4) as u64) * F32;
        let (free, _) = dev.memory()?;
        if need > free {
            return Err(format!("needs {need} bytes of device memory, {free} free"));
        }
        let arena = DeviceBuffer::alloc(&dev.ctx, n.max(1))?;
        let scratch = DeviceBuffer::alloc(&dev.ctx, (world * ld + 4).max(1))?;
        slot.insert(RankBufs { arena, scratch, ld });
    }
    let b = &ctx.bufs[&n];
    let stream = &ctx.stream;
    let cu = stream.cu_stream() as lib::Stream;
    let t0 = Instant::now();
    // SAFETY: the arena holds n f32s of this context.
    if !job.timing_only {
        unsafe {
            dev.generate(
                b.arena.ptr(),
                n as u64,
                0,
                job.case.distribution,
                job.case.seed,
                me as u32,
                job.arena,
                stream,
            )?
        };
    }
    stream
        .synchronize()
        .map_err(super::cuda::driver_error_text)?;
    let generate_ms = t0.elapsed().as_secs_f64() * 1e3;

    let t1 = Instant::now();
    {
        let _g = dog.guard(
            &format!("case `{}` arena {} on rank {me}", job.case.id, job.arena),
            timeout,
        );
        let at = |i: usize| (b.arena.ptr() + i as u64 * F32) as *mut c_void;
        if job.case.contract == Contract::NcclAllreduce {
            // The negative control: NCCL's own sum, in place.
            // SAFETY: n f32s, in place, this rank's stream.
            check_nccl(
                nccl,
                unsafe {
                    (nccl.all_reduce)(at(0), at(0), n, NCCL_FLOAT32, NCCL_SUM, ctx.comm.0, cu)
                },
                "ncclAllReduce",
            )?;
        } else if n > 0 {
            let out = b.arena.ptr() + my.start as u64 * F32;
            let phase = ((out & 15) / F32) as usize;
            let base = b.scratch.ptr() + phase as u64 * F32;
            let slot = |src: usize| (base + (src * b.ld) as u64 * F32) as *mut c_void;
            // Exchange: my copy of shard p to owner p; every rank's copy of
            // my shard into slot = source (mine included, sent to myself).
            // SAFETY: every range lies inside the arena or the scratch.
            unsafe {
                check_nccl(nccl, (nccl.group_start)(), "ncclGroupStart")?;
                for &p in &job.case.order.sequence(world) {
                    if plan[p].len > 0 {
                        check_nccl(
                            nccl,
                            (nccl.send)(
                                at(plan[p].start),
                                plan[p].len,
                                NCCL_FLOAT32,
                                p as i32,
                                ctx.comm.0,
                                cu,
                            ),
                            "ncclSend",
                        )?;
                    }
                    if my.len > 0 {
                        check_nccl(
                            nccl,
                            (nccl.recv)(slot(p), my.len, NCCL_FLOAT32, p as i32, ctx.comm.0, cu),
                            "ncclRecv",
                        )?;
                    }
                }
                check_nccl(nccl, (nccl.group_end)(), "ncclGroupEnd (exchange)")?;
            }
            let args = super::cuda::device::FoldArgs {
                out,
                stacked: base,
                ld: b.ld as u64,
                len: my.len as u64,
                world: world as u32,
                prog,
                prog_len,
                scale: job.case.mean.then(|| mean_scale(world)),
            };
            // SAFETY: `out` is my shard, `base` its slots at the same phase.
            unsafe { dev.fold(job.variant, job.mode, &args, &job.cuda.tuning, stream)? };
            // Redistribute: every owner's reduced shard, in place, to all.
            // SAFETY: each shard lies inside the arena.
            unsafe {
                check_nccl(nccl, (nccl.group_start)(), "ncclGroupStart")?;
                for (o, s) in plan.iter().enumerate() {
                    if s.len > 0 {
                        check_nccl(
                            nccl,
                            (nccl.broadcast)(
                                at(s.start),
                                at(s.start),
                                s.len,
                                NCCL_FLOAT32,
                                o as i32,
                                ctx.comm.0,
                                cu,
                            ),
                            "ncclBroadcast",
                        )?;
                    }
                }
                check_nccl(nccl, (nccl.group_end)(), "ncclGroupEnd (redistribute)")?;
            }
        }
        stream.synchronize().map_err(|e| {
            format!(
                "stream sync after the collectives: {}",
                super::cuda::driver_error_text(e)
            )
        })?;
        if let Some(phase) = dog.fired() {
            return Err(format!(
                "watchdog fired during `{phase}`; communicator aborted"
            ));
        }
    }
    let reduce_ms = t1.elapsed().as_secs_f64() * 1e3;
    let keep = job.opts.keep_values && me == 0;
    // An empty arena still owns a one-element allocation: hash nothing.
    let (digest, values) = if job.timing_only {
        (Default::default(), None)
    } else if n == 0 {
        let d = crate::digest::digest_chunked(&[], job.opts.nan_policy);
        (d, keep.then(Vec::new))
    } else {
        ctx.reader
            .digest(dev, &b.arena, job.opts.nan_policy, keep, me == 0)?
    };
    Ok(RankOut {
        digest,
        values,
        generate_ms,
        reduce_ms,
    })
}

impl NcclBackend {
    /// Every rank's digest, in rank order: collected from threads, or moved
    /// between processes with an all-gather of the 32 digest bytes.
    fn gather(&mut self, mine: &[String]) -> Result<Vec<String>, String> {
        if self.env.is_none() {
            return Ok(mine.to_vec());
        }
        let ctx = &mut self.ranks[0];
        ctx.dev
            .ctx
            .bind_to_thread()
            .map_err(super::cuda::driver_error_text)?;
        if ctx.gather.is_none() {
            ctx.gather = Some((
                DeviceBuffer::alloc(&ctx.dev.ctx, 8)?,
                DeviceBuffer::alloc(&ctx.dev.ctx, 8 * self.world)?,
            ));
        }
        let (send, recv) = ctx.gather.as_ref().ok_or("gather buffers")?;
        let bytes = hex::decode(&mine[0]).map_err(|e| e.to_string())?;
        let words: Vec<u32> = bytes
            .chunks_exact(4)
            .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        send.upload(&words)?;
        {
            let _g = self.watchdog.guard("digest all-gather", self.cfg.timeout);
            // SAFETY: 8 words in, 8 x world words out; pure byte movement.
            self.nccl.check(
                unsafe {
                    (self.nccl.all_gather)(
                        send.ptr() as *const c_void,
                        recv.ptr() as *mut c_void,
                        8,
                        NCCL_FLOAT32,
                        ctx.comm.0,
                        ctx.stream.cu_stream() as lib::Stream,
                    )
                },
                "ncclAllGather (digests)",
            )?;
            ctx.stream
                .synchronize()
                .map_err(super::cuda::driver_error_text)?;
        }
        let mut all = vec![0f32; 8 * self.world];
        recv.download(0, &mut all)?;
        Ok(all
            .chunks_exact(8)
            .map(|w| {
                hex::encode(
                    w.iter()
                        .flat_map(|v| v.to_bits().to_le_bytes())
                        .collect::<Vec<u8>>(),
                )
            })
            .collect())
    }
}

/// One size of the NCCL benchmark (nccl-tests conventions).
#[derive(Debug, Clone, serde::Serialize)]
pub struct NcclBenchRow {
    pub bytes: u64,
    pub world: usize,
    /// Median milliseconds of one fixed-order reduction (exchange, fold,
    /// redistribution) and of one in-place ncclAllReduce, same buffers.
    pub fixed_ms: f64,
    pub allreduce_ms: f64,
    /// algbw = bytes / time; busbw = algbw x 2(W-1)/W, in GB/s.
    pub fixed_algbw: f64,
    pub fixed_busbw: f64,
    pub allreduce_algbw: f64,
    pub allreduce_busbw: f64,
}

impl NcclBackend {
    /// Time the fixed-order reduction next to ncclAllReduce on the same
    /// buffers for each arena length in `sizes` (elements).
    pub fn bench(
        &mut self,
        sizes: &[usize],
        iters: usize,
    ) -> Result<Vec<NcclBenchRow>, BackendError> {
        let mut rows = Vec::new();
        for &n in sizes {
            let mut case = Case {
                experiment: "bench".into(),
                id: format!("bench-{n}"),
                world: self.world,
                arenas: vec![n],
                order: crate::experiment::DeliveryOrder::Ascending,
                seed: 1,
                distribution: crate::data::Distribution::MixedMagnitude,
                contract: Contract::FixedOrder,
                mean: false,
                rounds: 1,
            };
            let mut median =
                |case: &Case, timing_only: bool, reps: usize| -> Result<f64, BackendError> {
                    let mut times = Vec::with_capacity(reps);
                    for _ in 0..reps {
                        let job = ArenaJob {
                            case,
                            arena: 0,
                            n,
                            world: self.world,
                            mode: FoldMode::Fixed,
                            variant: self.cfg.cuda.variant,
                            cuda: &self.cfg.cuda,
                            opts: &RunOptions::default(),
                            timing_only,
                        };
                        let (nccl, dog, timeout) = (&self.nccl, &self.watchdog, self.cfg.timeout);
                        let outs: Vec<Result<RankOut, String>> = std::thread::scope(|s| {
                            let hs: Vec<_> = self
                                .ranks
                                .iter_mut()
                                .map(|ctx| {
                                    let job = &job;
                                    s.spawn(move || rank_arena(nccl, ctx, job, 0, 0, dog, timeout))
                                })
                                .collect();
                            hs.into_iter()
                                .map(|h| {
                                    h.join()
                                        .unwrap_or_else(|_| Err("rank thread panicked".into()))
                                })
                                .collect()
                        });
                        let mut worst = 0f64;
                        for o in outs {
                            worst = worst.max(o.map_err(|e| failed(&case.id, e))?.reduce_ms);
                        }
                        times.push(worst);
                    }
                    times.sort_by(f64::total_cmp);
                    Ok(times[times.len() / 2])
                };
            // Warm up (and fill the arena) once, then time.
            median(&case, false, 1)?;
            let fixed_ms = median(&case, true, iters)?;
            case.contract = Contract::NcclAllreduce;
            median(&case, true, 2)?;
            let allreduce_ms = median(&case, true, iters)?;
            let bytes = n as u64 * 4;
            let w = self.world as f64;
            let factor = 2.0 * (w - 1.0) / w;
            let bw = |ms: f64| bytes as f64 / (ms * 1e-3) / 1e9;
            rows.push(NcclBenchRow {
                bytes,
                world: self.world,
                fixed_ms,
                allreduce_ms,
                fixed_algbw: bw(fixed_ms),
                fixed_busbw: bw(fixed_ms) * factor,
                allreduce_algbw: bw(allreduce_ms),
                allreduce_busbw: bw(allreduce_ms) * factor,
            });
        }
        Ok(rows)
    }
}

impl Backend for NcclBackend {
    fn name(&self) -> &'static str {
        NAME
    }

    fn environment(&self) -> serde_json::Value {
        let (token_source, job) = {
            let (_, job, src) = job_identity();
            (src, job)
        };
        serde_json::json!({
            "kind": "nccl",
            "world": self.world,
            "launch": match &self.env {
                Some(e) => serde_json::json!({"mode": "process-per-rank", "launcher": e.source, "rank": e.rank, "local_rank": e.local_rank}),
                None => serde_json::json!({"mode": "thread-per-gpu", "gpus": self.world}),
            },
            "rendezvous": self.rendezvous,
            "job": job,
            "token_source": token_source,
            "nccl": {
                "version": format!("{}.{}.{}", self.version.0, self.version.1, self.version.2),
                "opened": self.nccl.opened,
            },
            "timeouts_s": {"init": self.cfg.init_timeout.as_secs_f64(), "collective": self.cfg.timeout.as_secs_f64()},
            "devices": self.ranks.iter().map(|r| r.dev.environment()).collect::<Vec<_>>(),
            "libraries": libs::loaded_libraries(),
            "env": libs::relevant_env(),
        })
    }

    fn skip_reason(&self, case: &Case) -> Option<String> {
        if case.world != self.world {
            return Some(format!(
                "W = {} but the NCCL world has {} rank(s)",
                case.world, self.world
            ));
        }
        if case.contract == Contract::NcclAllreduce && case.mean {
            return Some("nccl-allreduce has no mean variant".into());
        }
        None
    }

    fn is_reporting_rank(&self) -> bool {
        self.process_rank().unwrap_or(0) == 0
    }

    fn run_case(&mut self, case: &Case, opts: &RunOptions) -> Result<CaseRun, BackendError> {
        if let Some(why) = self.skip_reason(case) {
            return Err(failed(&case.id, why));
        }
        // NCCL's own sum needs no fold program.
        let (mode, prog) = if case.contract == Contract::NcclAllreduce {
            (FoldMode::Fixed, Vec::new())
        } else {
            super::cuda::contract_program(case)?
        };
        super::repeat_rounds(case.rounds, || {
            let start = Instant::now();
            let mut t = RoundTimings::default();
            let mut arenas = Vec::new();
            for (a, &n) in case.arenas.iter().enumerate() {
                let job = ArenaJob {
                    case,
                    arena: a as u32,
                    n,
                    world: self.world,
                    mode,
                    variant: self.cfg.cuda.variant,
                    cuda: &self.cfg.cuda,
                    opts,
                    timing_only: false,
                };
                let (nccl, dog, timeout) = (&self.nccl, &self.watchdog, self.cfg.timeout);
                let outs: Vec<Result<RankOut, String>> = std::thread::scope(|s| {
                    let hs: Vec<_> = self
                        .ranks
                        .iter_mut()
                        .map(|ctx| {
                            let job = &job;
                            let prog = &prog;
                            s.spawn(move || -> Result<RankOut, String> {
                                ctx.dev
                                    .ctx
                                    .bind_to_thread()
                                    .map_err(super::cuda::driver_error_text)?;
                                let buf = if prog.is_empty() {
                                    None
                                } else {
                                    let b = DeviceBuffer::alloc(&ctx.dev.ctx, prog.len())?;
                                    b.upload(prog)?;
                                    Some(b)
                                };
                                rank_arena(
                                    nccl,
                                    ctx,
                                    job,
                                    buf.as_ref().map_or(0, |b| b.ptr()),
                                    prog.len() as u32,
                                    dog,
                                    timeout,
                                )
                            })
                        })
                        .collect();
                    hs.into_iter()
                        .map(|h| {
                            h.join()
                                .unwrap_or_else(|_| Err("rank thread panicked".into()))
                        })
                        .collect()
                });
                let mut chunks = Vec::new();
                let mut mine = Vec::new();
                let mut values = None;
                for o in outs {
                    let o = o.map_err(|e| infrastructure(&case.id, "nccl rank", e))?;
                    t.generate_ms = t.generate_ms.max(o.generate_ms);
                    t.reduce_ms = t.reduce_ms.max(o.reduce_ms);
                    if chunks.is_empty() {
                        chunks = o.digest.chunks;
                    }
                    mine.push(o.digest.sha256);
                    if o.values.is_some() {
                        values = o.values;
                    }
                }
                let d = Instant::now();
                let rank_digests = self.gather(&mine).map_err(|e| failed(&case.id, e))?;
                t.digest_ms += d.elapsed().as_secs_f64() * 1e3;
                arenas.push(ReducedArena {
                    len: n,
                    rank_digests,
                    chunks,
                    values,
                });
            }
            t.total_ms = start.elapsed().as_secs_f64() * 1e3;
            Ok((arenas, t))
        })
    }
}

impl Drop for NcclBackend {
    fn drop(&mut self) {
        // Never destroy a communicator after an abort.
        if self.watchdog.fired().is_some() {
            return;
        }
        for r in &self.ranks {
            if !r.comm.0.is_null() && r.dev.ctx.bind_to_thread().is_ok() {
                // SAFETY: a live communicator, destroyed once.
                unsafe { (self.nccl.comm_destroy)(r.comm.0) };
            }
        }
    }
}
