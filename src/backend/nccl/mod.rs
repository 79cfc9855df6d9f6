//! The NCCL backend: the reducer's production dataflow over a live
//! communicator, one rank per GPU (or per emulated host). NCCL only moves
//! bytes, and only with point-to-point calls: one group of send/recv lands
//! every rank's copy of my shard in slot = source rank (my own copy too, as
//! a send to myself), the fold kernel reduces my shard, and a second group
//! of send/recv hands every owner's reduced shard to every rank. No
//! collective algorithm is involved, so NCCL_ALGO / NCCL_PROTO can neither
//! veto nor change the fixed-order path; only the `nccl-allreduce` control
//! uses a collective.
//!
//! Every wait polls the stream and `ncclCommGetAsyncError` together, so a
//! dead peer or a broken socket ends the case within milliseconds as an
//! infrastructure failure, naming the phase, instead of sitting out the
//! watchdog.
//!
//! Two launch modes: one process per rank (rank, world and local device
//! from the launcher's environment, the unique id and the case agreement
//! over `ranks::rendezvous`), or one process with one thread and context per
//! GPU (`--gpus N`). Every blocking window runs under `ranks::watchdog`.

pub mod bench;
mod dataflow;
pub mod facts;
pub mod loader;

use super::cuda::mem::DeviceBuffer;
use super::cuda::world::Reader;
use super::cuda::{kernels::FoldMode, mapped, CudaConfig, Device};
use super::{failed, Backend, BackendError, CaseRun, ReducedArena, RoundTimings, RunOptions};
use crate::experiment::Case;
use crate::fold::Contract;
use crate::ranks::discover::RankEnv;
use crate::ranks::rendezvous::{self, Plan};
use crate::ranks::watchdog::Watchdog;
use dataflow::{on_every_rank, rank_arena, ArenaJob};
use loader::{Comm, Nccl, UniqueId};
use std::collections::HashMap;
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
// SAFETY: NCCL lets a communicator move between threads when one thread at
// a time uses it; the owning `RankCtx` is the only user. (Not `Sync`.)
unsafe impl Send for CommPtr {}

struct RankBufs {
    arena: DeviceBuffer,
    scratch: DeviceBuffer,
    ld: usize,
}

struct RankCtx {
    rank: usize,
    /// Set once this rank aborted its communicator: never destroy it then.
    aborted: bool,
    dev: Device,
    stream: Arc<cudarc::driver::CudaStream>,
    comm: CommPtr,
    reader: Reader,
    /// Per arena length; shared so a dataflow can hold views while it
    /// lends the rank context to the waits.
    bufs: HashMap<usize, Arc<RankBufs>>,
    gather: Option<Arc<(DeviceBuffer, DeviceBuffer)>>,
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

impl NcclBackend {
    pub fn new(cfg: NcclConfig) -> Result<NcclBackend, BackendError> {
        let probe = super::cuda::probe();
        if !probe.usable {
            return Err(unavailable(probe.short_reason()));
        }
        let nccl = Arc::new(Nccl::load().map_err(unavailable)?);
        let version = nccl.version().map_err(unavailable)?;
        let env =
            crate::ranks::discover::from_process_env().map_err(|e| unavailable(e.to_string()))?;
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
            aborted: false,
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
        let r = unsafe { (nccl.comm_init_rank)(&mut comm, world as i32, id, ctx.rank as i32) };
        nccl.check(
            r,
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
                "--gpus {gpus} but the driver reports {} device(s). One process cannot emulate \
                 hosts (NCCL reads its host id once per process): to run {gpus} ranks on fewer \
                 GPUs use `foldprint launch -n {gpus} --emulate-hosts -- ... --backend nccl`",
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
        let results = on_every_rank(&mut ranks, |ctx| Self::init_comm(nccl, ctx, gpus, id));
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
        let payload = if e.rank == 0 {
            id_bytes(&self.unique_id()?)
        } else {
            Vec::new()
        };
        let (id_payload, how) = rendezvous::exchange(e, &self.cfg.plan, &payload, deadline)
            .map_err(|err| unavailable(err.to_string()))?;
        self.rendezvous = how;
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
        // SAFETY: out-parameter of 128 bytes.
        let r = unsafe { (self.nccl.get_unique_id)(&mut id) };
        self.nccl.check(r, "ncclGetUniqueId").map_err(unavailable)?;
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

impl Backend for NcclBackend {
    fn name(&self) -> &'static str {
        NAME
    }

    fn environment(&self) -> serde_json::Value {
        let (token_source, job) = {
            let (_, job, src) = crate::ranks::job::identity();
            (src, job)
        };
        let own = serde_json::json!({
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
            "dataflow": "exchange, redistribution and digest gather are ncclSend/ncclRecv only: NCCL_ALGO and NCCL_PROTO select nothing on the fixed-order path",
            "rank_check": "every rank reads back and hashes its own copy on its host; the 32-byte digests are gathered to rank 0",
            "emulated_hosts": facts::emulated_hosts(),
            "transport": facts::transport_from_log(),
            "timeouts_s": {"init": self.cfg.init_timeout.as_secs_f64(), "collective": self.cfg.timeout.as_secs_f64()},
            "devices": self.ranks.iter().map(|r| r.dev.environment()).collect::<Vec<_>>(),
        });
        let own = match own {
            serde_json::Value::Object(map) => map,
            _ => serde_json::Map::new(),
        };
        let mut env = crate::environment::BackendEnvironment::new("nccl", own);
        env.libraries = Some(mapped::loaded_libraries());
        env.env = Some(mapped::relevant_env());
        env.to_value()
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
                let outs = on_every_rank(&mut self.ranks, |ctx| {
                    ctx.dev
                        .ctx
                        .bind_to_thread()
                        .map_err(super::cuda::driver_error_text)?;
                    // Each rank's own copy of the fold program, in its context.
                    let buf = if prog.is_empty() {
                        None
                    } else {
                        let b = DeviceBuffer::alloc(&ctx.dev.ctx, prog.len())?;
                        b.upload(&prog)?;
                        Some(b)
                    };
                    rank_arena(
                        nccl,
                        ctx,
                        &job,
                        buf.as_ref().map_or(0, |b| b.ptr()),
                        prog.len() as u32,
                        dog,
                        timeout,
                    )
                });
                let mut chunks = Vec::new();
                let mut mine = Vec::new();
                // Digest time: the slowest rank's hashing, then the gather.
                let mut ranks_digest_ms = 0f64;
                let mut values = None;
                for o in outs {
                    let o = o.map_err(|e| e.into_backend(&case.id))?;
                    t.generate_ms = t.generate_ms.max(o.generate_ms);
                    t.reduce_ms = t.reduce_ms.max(o.reduce_ms);
                    ranks_digest_ms = ranks_digest_ms.max(o.digest_ms);
                    if chunks.is_empty() {
                        chunks = o.digest.chunks;
                    }
                    mine.push(o.digest.sha256);
                    if o.values.is_some() {
                        values = o.values;
                    }
                }
                let d = Instant::now();
                let rank_digests = self.gather(&mine).map_err(|e| e.into_backend(&case.id))?;
                t.digest_ms += ranks_digest_ms + d.elapsed().as_secs_f64() * 1e3;
                arenas.push(ReducedArena {
                    len: n,
                    rank_digests,
                    chunks,
                    values,
                    // Each rank hashed its own copy; chunk lists stay local.
                    differing: Vec::new(),
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
        if self.watchdog.fired().is_some() || self.ranks.iter().any(|r| r.aborted) {
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
