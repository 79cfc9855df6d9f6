//! Backends: take a validated [`Case`], run the reducer's dataflow over W
//! ranks, and return per-rank digests of every reduced arena plus timings.
//! They move bytes and call the fold; they never decide what is compared.

pub mod cpu;
pub mod cuda;
pub mod nccl;

use crate::digest::NanPolicy;
use crate::experiment::Case;
use crate::ranks::world::World;
pub use crate::result::{BackendChoice, ReducedArena, RoundTimings};

#[derive(Debug, thiserror::Error)]
pub enum BackendError {
    #[error("backend `{backend}` is not usable here: {reason}")]
    Unavailable {
        backend: &'static str,
        reason: String,
    },
    #[error(
        "case `{case}` needs {needed} bytes of {what} but only {available} are available{inputs}"
    )]
    OutOfMemory {
        case: String,
        what: &'static str,
        needed: u64,
        available: u64,
        /// For rank files: which files and tensor (see [`inputs_note`]).
        inputs: String,
    },
    /// This backend cannot run the case (a contract it lacks, a tree
    /// deeper than the device's stack, a world it was not started with):
    /// nothing was compared, so this is no failed check.
    #[error("case `{case}`: {reason}")]
    Unsupported { case: String, reason: String },
    /// A GPU call failed mid-case; its code says whether a resource ran out
    /// (device memory) or the device or driver broke.
    #[error("case `{case}`: {phase}: {source}")]
    Gpu {
        case: String,
        phase: &'static str,
        #[source]
        source: crate::gpu::error::GpuError,
    },
    /// The ranks could not start together: no device for this rank, a
    /// rendezvous that failed (a peer died, plans disagree), or a signal
    /// that stopped the wait. Its exit code is the rank error's.
    #[error("{0}")]
    Rank(#[from] crate::ranks::RankError),
    /// A rank file could not be read, or changed after it was hashed.
    #[error("case `{case}`: {source}")]
    Addends {
        case: String,
        #[source]
        source: crate::addends::AddendError,
    },
    /// The machinery around the numbers broke (an NCCL error, a dead peer,
    /// the watchdog, the rendezvous, a driver error mid-run): no digest was
    /// judged, so this is not a failed check.
    #[error("case `{case}`: {phase}: {message}")]
    Infrastructure {
        case: String,
        phase: String,
        message: String,
    },
}

/// What a caller wants besides digests.
#[derive(Debug, Clone, Copy, Default)]
pub struct RunOptions {
    pub nan_policy: NanPolicy,
    /// Return rank 0's reduced values (for `--dump`).
    pub keep_values: bool,
}

/// The result of running one case.
#[derive(Debug, Clone)]
pub struct CaseRun {
    /// Arenas of the last round, in the case's order.
    pub arenas: Vec<ReducedArena>,
    pub rounds: Vec<RoundTimings>,
    /// Every round produced the same digests.
    pub rounds_identical: bool,
    /// The order sensitivity, when the backend measured it (NCCL ranks
    /// that each read only their own file); otherwise the runner does.
    pub sensitivity: Option<crate::sensitivity::Sensitivity>,
    /// This rank's own shard of each arena, last round, when the case
    /// compares it with this rank's own `expect` file (one process per
    /// rank, [`Case::expect_own`]).
    pub own_shards: Option<Vec<Vec<f32>>>,
}

pub trait Backend {
    /// Short name written into reports (`cpu`, `cuda` ...).
    fn name(&self) -> &'static str;
    /// What this backend runs on, for the report's environment block.
    fn environment(&self) -> crate::environment::BackendEnvironment;
    fn run_case(&mut self, case: &Case, opts: &RunOptions) -> Result<CaseRun, BackendError>;
    /// Whether `case` can run here (memory, limits), asked of every case
    /// before the first one runs so that a run never throws away finished
    /// cases for a later one that could never have run.
    fn preflight(&self, _case: &Case, _opts: &RunOptions) -> Result<(), BackendError> {
        Ok(())
    }
    /// Why this backend cannot run `case` (e.g. W differs from its world).
    fn skip_reason(&self, _case: &Case) -> Option<String> {
        None
    }
    /// Whether [`Self::run_case`] measures `case`'s order sensitivity
    /// itself ([`CaseRun::sensitivity`]); otherwise [`run_case_measured`]
    /// measures it from the addends beside the case.
    fn measures_sensitivity(&self, _case: &Case) -> bool {
        false
    }
    /// Entries of the report's environment from the platform under the
    /// backend (the GPU backends' `host_driver`), so that the runner never
    /// asks the GPU platform itself and a CPU run never touches it.
    fn platform_facts(&self) -> serde_json::Map<String, serde_json::Value> {
        serde_json::Map::new()
    }
    /// Every rank's `mine`, rank order, on every rank: the bytes of a
    /// per-rank result (each rank's own `expect` outcome) moved between
    /// the processes of a world of one process per rank. A backend that
    /// holds every rank in this process never needs it.
    fn gather_bytes(&mut self, case: &Case, _mine: &[u8]) -> Result<Vec<Vec<u8>>, BackendError> {
        Err(infrastructure(
            case.id(),
            "gather",
            format!(
                "the {} backend has no ranks in other processes",
                self.name()
            ),
        ))
    }
}

/// A sensitivity measured beside a case, and how long it took.
pub type MeasuredSensitivity =
    Result<(crate::sensitivity::Sensitivity, f64), crate::addends::AddendError>;

/// `backend.run_case`, with the case's order sensitivity measured on
/// another thread meanwhile: it reads only the addends (the generator's
/// or the rank files' kept bytes), so neither waits for the other and a
/// case of rank files does not pay for its sample after its rounds. A
/// backend that measures it itself ([`Backend::measures_sensitivity`])
/// gives it back in the run, taken out here (0 ms).
pub fn run_case_measured(
    backend: &mut dyn Backend,
    case: &Case,
    opts: &RunOptions,
) -> Result<(CaseRun, MeasuredSensitivity), BackendError> {
    let measure = || {
        let t = std::time::Instant::now();
        crate::sensitivity::measure(case).map(|s| (s, t.elapsed().as_secs_f64() * 1e3))
    };
    if backend.measures_sensitivity(case) {
        let mut run = backend.run_case(case, opts)?;
        let s = match run.sensitivity.take() {
            Some(s) => Ok((s, 0.0)),
            None => measure(),
        };
        return Ok((run, s));
    }
    std::thread::scope(|scope| {
        let beside = std::thread::Builder::new()
            .name("foldprint-sensitivity".into())
            .spawn_scoped(scope, measure);
        let run = backend.run_case(case, opts);
        // No thread to spare: measured after the case, as before.
        let s = match beside {
            Ok(h) => h.join().unwrap_or_else(|p| std::panic::resume_unwind(p)),
            Err(_) => measure(),
        };
        Ok((run?, s))
    })
}

/// The GPU platform's facts: how the host's CUDA driver was found, if this
/// process looked.
pub(crate) fn gpu_platform_facts() -> serde_json::Map<String, serde_json::Value> {
    let mut facts = serde_json::Map::new();
    if let Some(d) = crate::gpu::host_driver::state() {
        facts.insert("host_driver".into(), serde_json::json!(d));
    }
    facts
}

/// `case` is one this backend cannot run.
pub(crate) fn unsupported(case: &str, reason: impl Into<String>) -> BackendError {
    BackendError::Unsupported {
        case: case.to_string(),
        reason: reason.into(),
    }
}

/// A GPU call of `case` failed while doing `phase`.
pub(crate) fn gpu_failed(
    case: &str,
    phase: &'static str,
    source: crate::gpu::error::GpuError,
) -> BackendError {
    BackendError::Gpu {
        case: case.to_string(),
        phase,
        source,
    }
}

pub(crate) fn infrastructure(
    case: &str,
    phase: impl Into<String>,
    message: impl Into<String>,
) -> BackendError {
    BackendError::Infrastructure {
        case: case.to_string(),
        phase: phase.into(),
        message: message.into(),
    }
}

/// Skip reason shared by the backends that cannot run NCCL's own sum.
pub(crate) fn nccl_only(case: &Case) -> Option<String> {
    case.contract()
        .needs_nccl()
        .then(|| format!("{} runs only on the NCCL backend", case.contract()))
}

/// The device fold mode and program of `case`, as both GPU backends run
/// it (`gpu::kernels::fold_program` chooses them); a contract the device
/// cannot fold is unsupported.
pub(crate) fn fold_program(
    case: &Case,
) -> Result<(crate::gpu::kernels::FoldMode, Vec<u32>), BackendError> {
    let order = case.order().sequence(case.world());
    crate::gpu::kernels::fold_program(case.contract(), case.world(), &order)
        .map_err(|m| unsupported(case.id(), m))
}

/// NCCL: the default bound on each collective window, in seconds.
pub const DEFAULT_TIMEOUT_S: u64 = 300;

/// Backend settings chosen on the command line. Where the ranks are and
/// whom they meet is the run's [`World`], not a backend's setting.
#[derive(Debug, Clone)]
pub struct BackendOptions {
    pub cuda: crate::gpu::DeviceConfig,
    /// NCCL: bound on each collective window.
    pub timeout: std::time::Duration,
}

impl Default for BackendOptions {
    fn default() -> Self {
        BackendOptions {
            cuda: crate::gpu::DeviceConfig::default(),
            timeout: std::time::Duration::from_secs(DEFAULT_TIMEOUT_S),
        }
    }
}

/// Pick a backend for `choice`; the note says why when `auto` fell back.
/// The NCCL backend places and meets `world` (its device count and unique
/// id are needed between the steps); the others emulate every rank in
/// this process and leave it as it is.
pub fn select(
    choice: BackendChoice,
    opts: &BackendOptions,
    world: &mut World,
) -> Result<(Box<dyn Backend>, Option<String>), BackendError> {
    match choice {
        BackendChoice::Cpu => Ok((Box::new(cpu::CpuBackend::new()), None)),
        BackendChoice::Cuda => Ok((Box::new(cuda::CudaBackend::new(opts.cuda.clone())?), None)),
        BackendChoice::Nccl => {
            let cfg = nccl::NcclConfig {
                cuda: opts.cuda.clone(),
                timeout: opts.timeout,
            };
            Ok((Box::new(nccl::NcclBackend::new(cfg, world)?), None))
        }
        BackendChoice::Auto => {
            let probe = crate::gpu::probe();
            // The oracle then reports what the probe found.
            let fallback = || cpu::CpuBackend::new().with_platform_facts(gpu_platform_facts());
            if !probe.usable {
                return Ok((
                    Box::new(fallback()),
                    Some(format!(
                        "auto: CUDA not usable ({}); using the CPU oracle",
                        probe.short_reason()
                    )),
                ));
            }
            match cuda::CudaBackend::new(opts.cuda.clone()) {
                Ok(b) => Ok((Box::new(b), None)),
                Err(e) => Ok((
                    Box::new(fallback()),
                    Some(format!("auto: {e}; using the CPU oracle")),
                )),
            }
        }
    }
}

/// Run a case's rounds and check that every round gave the first round's
/// digests (digests only: keeping a huge arena's values twice would double it).
pub(crate) fn repeat_rounds(
    rounds: u32,
    mut round: impl FnMut() -> Result<(Vec<ReducedArena>, RoundTimings), BackendError>,
) -> Result<CaseRun, BackendError> {
    let mut timings = Vec::new();
    type Digests = Vec<(Vec<crate::digest::Sha256>, Vec<crate::digest::Sha256>)>;
    let mut first: Option<Digests> = None;
    let mut identical = true;
    let mut last = Vec::new();
    for _ in 0..rounds.max(1) {
        let (arenas, t) = round()?;
        // A reduce-scatter has no rank copies: its shards are compared.
        let digests: Digests = arenas
            .iter()
            .map(|a| (a.rank_digests.clone(), a.shard_digests().to_vec()))
            .collect();
        match &first {
            None => first = Some(digests),
            Some(f) => identical &= *f == digests,
        }
        timings.push(t);
        last = arenas;
    }
    Ok(CaseRun {
        arenas: last,
        rounds: timings,
        rounds_identical: identical,
        sensitivity: None,
        own_shards: None,
    })
}

/// For a case of rank files, which files and which largest tensor a memory
/// need comes from (empty for generated addends).
pub fn inputs_note(case: &Case) -> String {
    let Some(f) = case.files() else {
        return String::new();
    };
    match f.arenas().iter().max_by_key(|a| a.len) {
        Some(a) => format!(
            " (its addends are the rank files {}: W = {} x tensor `{}` of {} elements as float32)",
            f.template(),
            f.world(),
            a.name,
            a.len
        ),
        None => String::new(),
    }
}

/// A case's rank-file error, for `case`.
pub(crate) fn addends_error(
    case: &Case,
) -> impl Fn(crate::addends::AddendError) -> BackendError + '_ {
    move |source| BackendError::Addends {
        case: case.id().to_string(),
        source,
    }
}

#[cfg(test)]
mod scatter_tests {
    use super::*;
    use crate::fold::{shard_plan, Collective, Contract};

    fn control(world: usize, arenas: &[usize], collective: Collective, mean: bool) -> Case {
        Case::builder(world, arenas.to_vec())
            .contract(Contract::NcclAllreduce)
            .collective(collective)
            .mean(mean)
            .build()
            .unwrap()
    }

    /// NCCL's reduce-scatter skips an arena W does not divide, naming the
    /// arena, its length and W; a multiple of W (sum or mean) runs.
    #[test]
    fn the_nccl_reduce_scatter_skips_a_length_w_does_not_divide() {
        let why = nccl::control_skip_reason(&control(3, &[6, 7], Collective::ReduceScatter, false));
        assert_eq!(
            why.as_deref(),
            Some(
                "ncclReduceScatter needs equal shards: arena 1 has n = 7, not a multiple of W = 3"
            )
        );
        for mean in [false, true] {
            assert_eq!(
                nccl::control_skip_reason(&control(3, &[6, 0, 9], Collective::ReduceScatter, mean)),
                None
            );
        }
        // The all-reduce control keeps its one rule, whatever the length.
        assert_eq!(
            nccl::control_skip_reason(&control(3, &[7], Collective::AllReduce, true)).as_deref(),
            Some("nccl-allreduce has no mean variant")
        );
        assert_eq!(
            nccl::control_skip_reason(&control(3, &[7], Collective::AllReduce, false)),
            None
        );
        // Not the control: nothing to say.
        let fixed = Case::builder(3, [7])
            .collective(Collective::ReduceScatter)
            .build()
            .unwrap();
        assert_eq!(nccl::control_skip_reason(&fixed), None);
    }

    /// Where W divides n, NCCL's shard r (elements r*n/W .. (r+1)*n/W) is
    /// the plan's shard r, so both paths leave rank r the same elements;
    /// where it does not, the plan's shards differ in length.
    #[test]
    fn ncclreducescatter_shards_are_the_plan_shards_when_w_divides_n() {
        for world in [1, 2, 3, 7, 8] {
            for k in [0, 1, 5, 1000] {
                let n = world * k;
                let plan = shard_plan(n, world).unwrap();
                for (r, s) in plan.iter().enumerate() {
                    assert_eq!((s.start, s.len), (r * k, k), "W={world} n={n} r={r}");
                }
            }
        }
        let plan = shard_plan(7, 3).unwrap();
        assert_ne!(plan[0].len, plan[2].len);
    }
}
