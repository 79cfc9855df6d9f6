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
//! Every wait polls the stream and `ncclCommGetAsyncError` together (at
//! most 0.5 ms apart), so a dead peer or a broken socket ends the case as
//! an infrastructure failure, naming the phase, as soon as NCCL reports
//! it, instead of sitting out the watchdog.
//!
//! Two launch modes, as the run's `ranks::world::World` says: one process
//! per rank (the world places this rank on its device and meets the others,
//! carrying rank 0's unique id), or one process with one thread and context
//! per GPU (`--gpus N`). Every blocking window runs under `ranks::watchdog`.

pub mod bench;
mod comm;
mod dataflow;
pub mod facts;
pub mod loader;

use super::{unsupported, Backend, BackendError, CaseRun, ReducedArena, RoundTimings, RunOptions};
use crate::experiment::Case;
use crate::fold::Contract;
use crate::gpu::kernels::FoldMode;
use crate::gpu::mem::{ArenaElem, DeviceBuffer};
use crate::gpu::readback::Reader;
use crate::gpu::{mapped, Device, DeviceConfig};
use crate::ranks::placement;
use crate::ranks::watchdog::Watchdog;
use crate::ranks::world::World;
use comm::{AbortHandle, Comm};
use dataflow::{on_every_rank, rank_arena, ArenaJob};
use loader::{Nccl, UniqueId};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const NAME: &str = "nccl";

/// How the NCCL backend starts; where its ranks are, and the bound on
/// their start, are its [`World`]'s.
#[derive(Debug, Clone)]
pub struct NcclConfig {
    pub cuda: DeviceConfig,
    /// Bound on every collective window (enqueue + stream sync).
    pub timeout: Duration,
}

struct RankBufs<T: ArenaElem = f32> {
    arena: DeviceBuffer<T>,
    scratch: DeviceBuffer<T>,
    ld: usize,
}

/// One length's buffers in the case's element width.
enum AnyRankBufs {
    F32(Arc<RankBufs<f32>>),
    Half(Arc<RankBufs<u16>>),
}

/// The element types a rank's arena is kept in.
trait RankElem: ArenaElem + comm::NcclElem {
    fn wrap(b: Arc<RankBufs<Self>>) -> AnyRankBufs;
    fn unwrap(b: &AnyRankBufs) -> Option<Arc<RankBufs<Self>>>;
}

impl RankElem for f32 {
    fn wrap(b: Arc<RankBufs<f32>>) -> AnyRankBufs {
        AnyRankBufs::F32(b)
    }
    fn unwrap(b: &AnyRankBufs) -> Option<Arc<RankBufs<f32>>> {
        match b {
            AnyRankBufs::F32(b) => Some(b.clone()),
            AnyRankBufs::Half(_) => None,
        }
    }
}

impl RankElem for u16 {
    fn wrap(b: Arc<RankBufs<u16>>) -> AnyRankBufs {
        AnyRankBufs::Half(b)
    }
    fn unwrap(b: &AnyRankBufs) -> Option<Arc<RankBufs<u16>>> {
        match b {
            AnyRankBufs::Half(b) => Some(b.clone()),
            AnyRankBufs::F32(_) => None,
        }
    }
}

/// One rank's device before it has a communicator.
struct OpenedRank {
    rank: usize,
    dev: Device,
    stream: Arc<cudarc::driver::CudaStream>,
    reader: Reader,
}

struct RankCtx {
    rank: usize,
    dev: Device,
    stream: Arc<cudarc::driver::CudaStream>,
    comm: Comm,
    reader: Reader,
    /// Per arena length; shared so a dataflow can hold views while it
    /// lends the rank context to the waits.
    bufs: HashMap<usize, AnyRankBufs>,
}

impl RankCtx {
    fn new(opened: OpenedRank, comm: Comm) -> RankCtx {
        RankCtx {
            rank: opened.rank,
            dev: opened.dev,
            stream: opened.stream,
            comm,
            reader: opened.reader,
            bufs: HashMap::new(),
        }
    }
}

pub struct NcclBackend {
    nccl: Arc<Nccl>,
    /// The world as it was placed and met (its launch mode, the members as
    /// they presented themselves on rank 0).
    world: World,
    ranks: Vec<RankCtx>,
    cfg: NcclConfig,
    version: (i32, i32, i32),
    watchdog: Watchdog,
    comms: Arc<Mutex<Vec<AbortHandle>>>,
    /// NCCL's log, when this process routed it (see `facts::OwnLog`).
    log: Option<facts::OwnLog>,
    /// This process's rank's own shard of each arena of the current round
    /// (a reduce-scatter that checks each rank's own `expect` file).
    own_shards: Vec<Vec<f32>>,
}

fn unavailable(reason: impl std::fmt::Display) -> BackendError {
    BackendError::Unavailable {
        backend: NAME,
        reason: reason.to_string(),
    }
}

fn id_bytes(id: &UniqueId) -> Vec<u8> {
    id.internal.iter().map(|&c| c as u8).collect()
}

fn id_from(bytes: &[u8]) -> Result<UniqueId, BackendError> {
    if bytes.len() != 128 {
        return Err(unavailable(format!(
            "the rendezvous gave a unique id of {} bytes, expected 128",
            bytes.len()
        )));
    }
    let mut id = UniqueId { internal: [0; 128] };
    for (d, s) in id.internal.iter_mut().zip(bytes) {
        *d = *s as std::ffi::c_char;
    }
    Ok(id)
}

impl NcclBackend {
    /// Start on `world`: a world of one process per rank is placed and
    /// met here, between the GPU steps that need it.
    pub fn new(cfg: NcclConfig, world: &mut World) -> Result<NcclBackend, BackendError> {
        let probe = crate::gpu::probe();
        if !probe.usable {
            return Err(unavailable(probe.short_reason()));
        }
        // Before NCCL is loaded: it reads its log settings once.
        let log = facts::OwnLog::start();
        let nccl = Arc::new(Nccl::load().map_err(unavailable)?);
        let version = nccl.version().map_err(unavailable)?;
        let comms: Arc<Mutex<Vec<AbortHandle>>> = Arc::new(Mutex::new(Vec::new()));
        let watchdog = {
            let comms = comms.clone();
            let me = format!("rank {}", world.rank().unwrap_or(0));
            Watchdog::new(move |phase| {
                eprintln!("error: {me}: watchdog: `{phase}` did not finish in time; aborting the communicator");
                // If the blocked call still does not return, or an abort
                // itself waits (on a communicator's lock), do not hang.
                std::thread::spawn(|| {
                    std::thread::sleep(Duration::from_secs(10));
                    eprintln!("error: watchdog: exiting after abort");
                    std::process::exit(4);
                });
                for c in comms.lock().unwrap_or_else(|p| p.into_inner()).iter() {
                    c.abort();
                }
            })
        };
        let mut backend = NcclBackend {
            nccl,
            world: world.clone(),
            ranks: Vec::new(),
            cfg,
            version,
            watchdog,
            comms,
            log,
            own_shards: Vec::new(),
        };
        let started = if world.env().is_some() {
            backend.init_process(world)
        } else {
            backend.init_threads(world.size())
        };
        if started.is_err() {
            // NCCL's own account of the failure went to its routed log.
            for w in backend.log.iter().flat_map(facts::OwnLog::warnings) {
                eprintln!("{w}");
            }
        }
        started.map(|()| backend)
    }

    fn open_rank(&self, rank: usize, ordinal: usize) -> Result<OpenedRank, BackendError> {
        let dev = Device::open(ordinal, self.cfg.cuda.compile).map_err(unavailable)?;
        let stream = dev.new_stream().map_err(unavailable)?;
        let reader = Reader::new(&dev, self.cfg.cuda.chunk.max(1024)).map_err(unavailable)?;
        Ok(OpenedRank {
            rank,
            dev,
            stream,
            reader,
        })
    }

    /// One process, one thread and context per GPU.
    fn init_threads(&mut self, gpus: usize) -> Result<(), BackendError> {
        let probe = crate::gpu::probe();
        if gpus > probe.device_count {
            return Err(unavailable(format!(
                "--gpus {gpus} but the driver reports {} device(s). One process cannot emulate \
                 hosts (NCCL reads its host id once per process): to run {gpus} ranks on fewer \
                 GPUs use `foldprint launch -n {gpus} --emulate-hosts -- ... --backend nccl`",
                probe.device_count
            )));
        }
        let mut opened = (0..gpus)
            .map(|r| self.open_rank(r, r))
            .collect::<Result<Vec<_>, _>>()?;
        let id = self.unique_id()?;
        let nccl = &self.nccl;
        let _g = self
            .watchdog
            .guard("communicator init", self.world.init_timeout());
        let results = on_every_rank(&mut opened, |o| {
            Comm::init(nccl, &o.dev.ctx, gpus, o.rank, id)
        });
        let comms = results
            .into_iter()
            .collect::<Result<Vec<_>, _>>()
            .map_err(unavailable)?;
        self.comms
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .extend(comms.iter().map(Comm::abort_handle));
        let ranks: Vec<RankCtx> = opened
            .into_iter()
            .zip(comms)
            .map(|(o, c)| RankCtx::new(o, c))
            .collect();
        self.ranks = ranks;
        Ok(())
    }

    /// One process per rank: placement, rendezvous, agreement, init.
    fn init_process(&mut self, world: &mut World) -> Result<(), BackendError> {
        let (rank, size) = (world.rank().unwrap_or(0), world.size());
        let devices = crate::gpu::probe().device_count;
        let place = world.place(devices)?;
        // Before NCCL's first call (it reads NCCL_HOSTID once) and before
        // any device is opened.
        placement::export(&place);
        let opened = self.open_rank(rank, place.device)?;
        let deadline = Instant::now() + world.init_timeout();
        let payload = if rank == 0 {
            id_bytes(&self.unique_id()?)
        } else {
            Vec::new()
        };
        world.meet(&payload, deadline)?;
        self.world = world.clone();
        let id = id_from(world.payload())?;
        let comm = {
            let _g = self
                .watchdog
                .guard("communicator init", world.init_timeout());
            Comm::init(&self.nccl, &opened.dev.ctx, size, rank, id).map_err(unavailable)?
        };
        self.comms
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(comm.abort_handle());
        self.ranks = vec![RankCtx::new(opened, comm)];
        Ok(())
    }

    fn unique_id(&self) -> Result<UniqueId, BackendError> {
        self.nccl.unique_id().map_err(unavailable)
    }

    /// The world this backend started on, as it was placed and met.
    pub fn world(&self) -> &World {
        &self.world
    }

    fn process_rank(&self) -> Option<usize> {
        self.world.rank()
    }
}

impl Backend for NcclBackend {
    fn name(&self) -> &'static str {
        NAME
    }

    fn measures_sensitivity(&self, case: &Case) -> bool {
        // As `run_case` does: each rank holds only its own file.
        case.files().is_some() && self.world.env().is_some()
    }

    fn environment(&self) -> crate::environment::BackendEnvironment {
        let (token_source, job) = {
            let (_, job, src) = crate::ranks::job::identity();
            (src, job)
        };
        let own = serde_json::json!({
            "world": self.world.size(),
            "launch": match self.world.env() {
                Some(e) => serde_json::json!({
                    "mode": "process-per-rank",
                    "launcher": e.source,
                    "rank": e.rank,
                    "local_rank": e.local_rank,
                    "variables": e.variables.iter().cloned().collect::<std::collections::BTreeMap<_, _>>(),
                    "other_launchers": e.others_json(),
                }),
                None => serde_json::json!({"mode": "thread-per-gpu", "gpus": self.world.size()}),
            },
            "rendezvous": self.world.how(),
            "members": (!self.world.members().is_empty()).then_some(self.world.members()),
            "job": job,
            "token_source": token_source,
            "nccl": {
                "version": format!("{}.{}.{}", self.version.0, self.version.1, self.version.2),
                "opened": self.nccl.opened,
            },
            "dataflow": "exchange, redistribution, a reduce-scatter's shard gather and the digest gather are ncclSend/ncclRecv only: NCCL_ALGO and NCCL_PROTO select nothing on the fixed-order path",
            "rank_check": "every rank reads back and hashes its own copy on its host; the 32-byte digests are gathered to rank 0",
            "emulated_hosts": facts::emulated_hosts(),
            "transport": facts::transport_from_log(),
            "timeouts_s": {"init": self.world.init_timeout().as_secs_f64(), "collective": self.cfg.timeout.as_secs_f64()},
            "devices": self.ranks.iter().map(|r| r.dev.environment()).collect::<Vec<_>>(),
        });
        let own = match own {
            serde_json::Value::Object(map) => map,
            _ => serde_json::Map::new(),
        };
        let mut env = crate::environment::BackendEnvironment::new("nccl", own);
        env.libraries = Some(mapped::loaded_libraries());
        env.env = Some(mapped::relevant_env());
        env
    }

    fn skip_reason(&self, case: &Case) -> Option<String> {
        if case.world() != self.world.size() {
            return Some(format!(
                "W = {} but the NCCL world has {} rank(s)",
                case.world(),
                self.world.size()
            ));
        }
        control_skip_reason(case)
    }

    fn platform_facts(&self) -> serde_json::Map<String, serde_json::Value> {
        super::gpu_platform_facts()
    }

    /// Lengths first, then every rank's bytes padded to the longest.
    fn gather_bytes(&mut self, case: &Case, mine: &[u8]) -> Result<Vec<Vec<u8>>, BackendError> {
        let fault = |e: dataflow::Fault| e.into_backend(case.id());
        let lens = self
            .all_gather("gather lengths", &[mine.len() as u32])
            .map_err(fault)?;
        let longest = lens.iter().map(|l| l[0] as usize).max().unwrap_or(0);
        let mut padded = mine.to_vec();
        padded.resize(longest.next_multiple_of(4), 0);
        let words: Vec<u32> = padded
            .chunks_exact(4)
            .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        let all = self.all_gather("gather", &words).map_err(fault)?;
        Ok(all
            .iter()
            .zip(&lens)
            .map(|(w, l)| {
                let mut bytes: Vec<u8> = w.iter().flat_map(|v| v.to_le_bytes()).collect();
                bytes.truncate(l[0] as usize);
                bytes
            })
            .collect())
    }

    fn run_case(&mut self, case: &Case, opts: &RunOptions) -> Result<CaseRun, BackendError> {
        if let Some(why) = self.skip_reason(case) {
            return Err(unsupported(case.id(), why));
        }
        // NCCL's own sum needs no fold program.
        let (mode, prog) = if case.contract() == Contract::NcclAllreduce {
            (FoldMode::Fixed, Vec::new())
        } else {
            super::fold_program(case)?
        };
        let mut run = super::repeat_rounds(case.rounds(), || {
            self.own_shards.clear();
            let start = Instant::now();
            let mut t = RoundTimings::default();
            let mut arenas = Vec::new();
            for (a, &n) in case.arenas().iter().enumerate() {
                let job = ArenaJob {
                    case,
                    arena: a as u32,
                    n,
                    world: self.world.size(),
                    mode,
                    variant: self.cfg.cuda.variant,
                    cuda: &self.cfg.cuda,
                    opts,
                    timing_only: false,
                };
                let (dog, timeout) = (&self.watchdog, self.cfg.timeout);
                let outs = on_every_rank(&mut self.ranks, |ctx| {
                    let upload = dataflow::gpu("uploading the fold program");
                    ctx.dev.bind().map_err(&upload)?;
                    // Each rank's own copy of the fold program, in its context.
                    let buf = if prog.is_empty() {
                        None
                    } else {
                        let b = DeviceBuffer::<u32>::alloc(&ctx.dev.ctx, prog.len())
                            .map_err(&upload)?;
                        b.upload(&prog).map_err(&upload)?;
                        Some(b)
                    };
                    rank_arena(
                        ctx,
                        &job,
                        buf.as_ref().map_or(0, |b| b.ptr()),
                        prog.len() as u32,
                        dog,
                        timeout,
                    )
                });
                if !case.collective().is_all_reduce() {
                    let arena = self
                        .scattered_arena(n, outs, &mut t)
                        .map_err(|e| e.into_backend(case.id()))?;
                    arenas.push(arena);
                    continue;
                }
                let mut chunks = Vec::new();
                let mut mine = Vec::new();
                // Digest time: the slowest rank's hashing, then the gather.
                let mut ranks_digest_ms = 0f64;
                let mut values = None;
                for o in outs {
                    let o = o.map_err(|e| e.into_backend(case.id()))?;
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
                let rank_digests = self.gather(&mine).map_err(|e| e.into_backend(case.id()))?;
                t.digest_ms += ranks_digest_ms + d.elapsed().as_secs_f64() * 1e3;
                arenas.push(ReducedArena {
                    scattered: None,
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
        })?;
        // Each rank holds only its own file: the sensitivity sample is
        // gathered from every rank (rank 0 cannot read the others' files).
        if let (Some(files), Some(_)) = (case.files(), self.world.env()) {
            run.sensitivity = Some(self.gathered_sensitivity(case, files)?);
        }
        if case.expect_own().is_some() {
            run.own_shards = Some(std::mem::take(&mut self.own_shards));
        }
        Ok(run)
    }
}

/// Why NCCL's own collective (contract `nccl-allreduce`) cannot run
/// `case`: its all-reduce has no mean variant, and `ncclReduceScatter`
/// needs W equal shards, so every arena length must be a multiple of W.
pub(crate) fn control_skip_reason(case: &Case) -> Option<String> {
    if case.contract() != Contract::NcclAllreduce {
        return None;
    }
    let world = case.world();
    if case.collective().is_all_reduce() {
        return case
            .mean()
            .then(|| "nccl-allreduce has no mean variant".into());
    }
    let (a, n) = case
        .arenas()
        .iter()
        .enumerate()
        .find(|(_, &n)| world == 0 || !n.is_multiple_of(world))?;
    Some(format!(
        "ncclReduceScatter needs equal shards: arena {a} has n = {n}, not a multiple of W = {world}"
    ))
}

impl NcclBackend {
    /// A reduce-scatter's arena from this process's ranks' outputs: every
    /// rank's shard digest and rank 0's gathered digest, moved between
    /// processes as 64 bytes a rank (point-to-point, like the reduction).
    fn scattered_arena(
        &mut self,
        n: usize,
        outs: Vec<Result<dataflow::RankOut, dataflow::Fault>>,
        t: &mut RoundTimings,
    ) -> Result<ReducedArena, dataflow::Fault> {
        let mut mine = Vec::new();
        let mut gathered = None;
        let mut values = None;
        let mut chunks = Vec::new();
        let mut ranks_digest_ms = 0f64;
        for o in outs {
            let o = o?;
            t.generate_ms = t.generate_ms.max(o.generate_ms);
            t.reduce_ms = t.reduce_ms.max(o.reduce_ms);
            ranks_digest_ms = ranks_digest_ms.max(o.digest_ms);
            mine.push(o.digest.sha256);
            if let Some(g) = o.gathered {
                gathered = Some(g.sha256);
                chunks = g.chunks;
            }
            if o.values.is_some() {
                values = o.values;
            }
            if let Some(v) = o.own_shard {
                self.own_shards.push(v);
            }
        }
        let d = Instant::now();
        let (shard_digests, gathered) = if self.world.env().is_none() {
            let g = gathered
                .ok_or_else(|| dataflow::infra("shard gather", "rank 0 gave no gathered digest"))?;
            (mine, g)
        } else {
            // [my shard digest, rank 0's gathered digest (zeros elsewhere)].
            let mut words: Vec<u32> = Vec::with_capacity(16);
            for d in [
                mine.first().copied().unwrap_or_default(),
                gathered.unwrap_or_default(),
            ] {
                words.extend(
                    d.as_bytes()
                        .chunks_exact(4)
                        .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]])),
                );
            }
            let all = self.all_gather("digest gather", &words)?;
            let sha = |w: &[u32]| {
                let mut bytes = [0u8; 32];
                for (out, v) in bytes.chunks_exact_mut(4).zip(w) {
                    out.copy_from_slice(&v.to_le_bytes());
                }
                crate::digest::Sha256::from_bytes(bytes)
            };
            let shards = all.iter().map(|w| sha(&w[..8])).collect();
            (shards, sha(&all[0][8..16]))
        };
        t.digest_ms += ranks_digest_ms + d.elapsed().as_secs_f64() * 1e3;
        Ok(ReducedArena {
            len: n,
            rank_digests: Vec::new(),
            scattered: Some(crate::result::Scattered {
                shard_digests,
                gathered,
            }),
            chunks,
            values,
            differing: Vec::new(),
        })
    }

    /// The order sensitivity of a case of rank files, each rank sampling
    /// its own file and rank 0 folding the gathered samples.
    fn gathered_sensitivity(
        &mut self,
        case: &Case,
        files: &crate::addends::AddendFiles,
    ) -> Result<crate::sensitivity::Sensitivity, BackendError> {
        let me = self.process_rank().unwrap_or(0);
        let stride = crate::sensitivity::stride(case);
        let mut words = Vec::new();
        let mut picks = Vec::new();
        for (a, &n) in case.arenas().iter().enumerate() {
            let k = crate::sensitivity::picks(n, stride);
            let mine = files
                .sample(me, a, stride, k)
                .map_err(super::addends_error(case))?;
            words.extend(mine.iter().map(|v| v.to_bits()));
            picks.push(k as usize);
        }
        let all = self
            .all_gather("sensitivity sample", &words)
            .map_err(|e| e.into_backend(case.id()))?;
        let mut samples = Vec::new();
        let mut at = 0;
        for k in picks {
            samples.push(
                all.iter()
                    .map(|r| r[at..at + k].iter().map(|&b| f32::from_bits(b)).collect())
                    .collect(),
            );
            at += k;
        }
        Ok(crate::sensitivity::of_samples(case, &samples))
    }
}

impl Drop for NcclBackend {
    fn drop(&mut self) {
        // After one abort (the watchdog's or a rank's) the others may wait
        // on it forever in a destroy: abort them all, which never blocks,
        // and their drops then skip the destroy.
        if self.watchdog.fired().is_some() || self.ranks.iter().any(|r| r.comm.aborted()) {
            for r in &self.ranks {
                r.comm.abort();
            }
        }
    }
}
