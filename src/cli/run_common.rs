//! What `run`, `verify` and `golden` share: starting the threads, loading
//! experiments, running them on a backend and putting the outputs in place.

use super::args::Common;
use super::progress::Bar;
use super::table;
use foldprint::backend;
use foldprint::exit::{Context, Failure};
use foldprint::experiment::{self, Experiment};
use foldprint::report::Report;
use foldprint::runner::{self, RunConfig};
use std::path::PathBuf;
type Result<T, E = Failure> = std::result::Result<T, E>;

/// Start the worker threads now, so that a machine that cannot start them
/// gets a clear error (exit 3) instead of a panic at the first parallel step.
pub(super) fn start_threads() -> Result<()> {
    // Under an address-space limit a thread can start and then abort the
    // process while setting up its signal stack: refuse before spawning.
    let threads = std::env::var("RAYON_NUM_THREADS")
        .ok()
        .and_then(|v| v.parse::<u64>().ok())
        .filter(|&t| t > 0)
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get() as u64));
    let stack = std::env::var("RUST_MIN_STACK")
        .ok()
        .and_then(|v| v.parse::<u64>().ok())
        .unwrap_or(2 << 20);
    // Each thread maps its stack plus a guard page and a signal stack.
    let need = threads.saturating_mul(stack + (64 << 10));
    if let Some(left) = foldprint::memory::address_space_left() {
        if need > left {
            return Err(Failure::Unavailable(format!(
                "cannot start worker threads: {threads} threads need {} MiB of address space, \
                     the limit (RLIMIT_AS) leaves {} MiB; lower RAYON_NUM_THREADS",
                need >> 20,
                left >> 20
            )));
        }
    }
    rayon::ThreadPoolBuilder::new()
        .build_global()
        .map_err(|e| Failure::Unavailable(format!("cannot start worker threads: {e}")))
}

/// An interruption says which outputs were left as they were.
fn interrupted(e: runner::RunError, common: &Common, dump: Option<&std::path::Path>) -> Failure {
    if let runner::RunError::Interrupted { signal, .. } = &e {
        let kept: Vec<String> = [common.out.as_deref(), common.junit.as_deref(), dump]
            .into_iter()
            .flatten()
            .map(|p| p.display().to_string())
            .collect();
        let tail = if kept.is_empty() {
            String::new()
        } else {
            format!("; {} left as they were", kept.join(", "))
        };
        return Failure::Interrupted {
            signal: *signal,
            message: format!("{e}{tail}"),
        };
    }
    e.into()
}

/// The experiments, each rank file opened as `backend` needs: an NCCL rank
/// started by a launcher opens only its own (as in the job that wrote
/// them); every other run opens them all. They are hashed in `execute`,
/// while the backend starts.
pub(super) fn load(paths: &[PathBuf], backend: backend::BackendChoice) -> Result<Vec<Experiment>> {
    let scope = match backend {
        // Bad launcher variables are refused here (exit 2), before any
        // device is looked for.
        backend::BackendChoice::Nccl => match foldprint::ranks::discover::from_process_env()? {
            Some(e) => {
                let by_dir = std::env::var("FOLDPRINT_RENDEZVOUS_DIR").is_ok_and(|d| !d.is_empty());
                if !by_dir {
                    foldprint::ranks::job::rendezvous_addr(&e)?;
                }
                foldprint::addends::Scope::OwnRank {
                    rank: e.rank,
                    world: e.world,
                }
            }
            None => foldprint::addends::Scope::AllRanks,
        },
        _ => foldprint::addends::Scope::AllRanks,
    };
    Ok(experiment::load_all_in(paths, scope)?)
}

/// A finished run whose outputs are not yet in place.
pub(super) struct Executed {
    pub(super) report: Report,
    /// The experiments as run: rank files hashed, keys complete.
    pub(super) experiments: Vec<Experiment>,
    dump: Option<foldprint::dumpdir::DumpDir>,
    dump_path: Option<PathBuf>,
    /// Held until the outputs are committed.
    _locks: Vec<foldprint::outputs::Lock>,
}

impl Executed {
    /// Stage the report (`--out`) and `junit`, then put every output in
    /// place as one unit (`foldprint::outputs`).
    pub(super) fn commit(&mut self, common: &Common, junit: Option<String>) -> Result<()> {
        let mut files = Vec::new();
        if let Some(out) = &common.out {
            files.push(foldprint::outputs::stage(
                out,
                self.report.to_json().as_bytes(),
            )?);
        }
        if let (Some(path), Some(xml)) = (&common.junit, junit) {
            files.push(foldprint::outputs::stage(path, xml.as_bytes())?);
        }
        let cases = self.report.cases.len() + self.report.skipped.len();
        foldprint::outputs::commit(self.dump.take(), files, cases)
            .map_err(|e| interrupted(e, common, self.dump_path.as_deref()))
    }
}

/// Run the experiments; `None` on an NCCL rank other than 0, which only
/// takes part (rank 0 writes and prints the one report).
pub(super) fn execute(
    common: &Common,
    experiments: &[Experiment],
    dump: Option<&std::path::Path>,
    stream: bool,
) -> Result<Option<Executed>> {
    execute_judged(common, experiments, dump, stream, &|_| Vec::new())
}

/// [`execute`], with `judge` saying what each case contradicts beyond the
/// run's own checks (`verify`: its golden), so that a streamed row says it
/// as the case finishes.
pub(super) fn execute_judged(
    common: &Common,
    experiments: &[Experiment],
    dump: Option<&std::path::Path>,
    stream: bool,
    judge: &dyn Fn(&foldprint::report::CaseReport) -> Vec<String>,
) -> Result<Option<Executed>> {
    let t0 = std::time::Instant::now();
    // Rank files are hashed while the backend starts (a GPU context takes
    // about as long as hashing a gigabyte); an NCCL rank presents its own
    // file's digest in the rendezvous, so it hashes first.
    let (experiments, (mut be, note)) = if common.backend == backend::BackendChoice::Nccl {
        let hashed = experiment::hash_rank_files(experiments)?;
        let started = backend::select(common.backend, &common.options(&hashed)?)?;
        (hashed, started)
    } else {
        let opts = common.options(experiments)?;
        let (hashed, started) = std::thread::scope(|s| {
            let hashing = s.spawn(|| experiment::hash_rank_files(experiments));
            let started = backend::select(common.backend, &opts);
            (hashing.join(), started)
        });
        let hashed = hashed.map_err(|_| {
            Failure::Unavailable("the thread hashing the rank files failed".into())
        })??;
        (hashed, started?)
    };
    let backend_init_ms = t0.elapsed().as_secs_f64() * 1e3;
    let reporting = be.is_reporting_rank();
    // Rank 0 of NCCL ranks that each opened only their own rank file
    // learns the others' digests from the rendezvous.
    let experiments = if reporting && !be.members().is_empty() {
        let presented: Vec<_> = be.members().iter().map(|m| m.inputs.clone()).collect();
        experiment::complete_rank_files(&experiments, &presented)
            .context("the rank files the ranks presented")?
    } else {
        experiments
    };
    let experiments = &experiments[..];
    let dump = dump.filter(|_| reporting);
    if let Some(n) = &note {
        eprintln!("note: {n}");
    }
    let mut not_gpu = None;
    if reporting {
        let prov = foldprint::host::provenance();
        if let Some(w) = foldprint::host::cpu_under_cuda_combination(be.name(), prov.as_ref()) {
            eprintln!("warning: {w}");
            not_gpu = Some(w);
        }
    }
    let total = experiments.iter().map(|e| e.cases.len()).sum();
    let stream = stream && reporting;
    if stream {
        table::banner(
            env!("CARGO_PKG_VERSION"),
            be.name(),
            &be.environment(),
            common.nan_policy.name(),
        );
        if let Some(w) = &not_gpu {
            outln!("NOT A GPU RESULT: {w}");
        }
    }
    let rows = stream.then(|| {
        experiments
            .iter()
            .map(|e| {
                let info = foldprint::report::ExperimentInfo::from(e);
                let arenas = e.cases.iter().map(|c| c.arenas().len()).max().unwrap_or(0);
                (
                    info.name,
                    info.path,
                    info.cases,
                    table::digest_width(arenas),
                )
            })
            .collect()
    });
    let mut bar = Bar::new(total, rows, judge);
    let cfg = RunConfig {
        nan_policy: common.nan_policy,
        dump,
        notes: note.into_iter().collect(),
        backend_init_ms,
    };
    // Two runs writing the same outputs take turns, from before the first
    // case to the last rename (only the rank that writes them locks).
    let outputs: Vec<&std::path::Path> = [common.out.as_deref(), common.junit.as_deref(), dump]
        .into_iter()
        .flatten()
        .collect();
    let locks = if reporting {
        foldprint::outputs::lock_all(&outputs, total, &mut |p| {
            eprintln!(
                "note: waiting for another foldprint run writing {}",
                p.display()
            )
        })
        .map_err(|e| interrupted(e, common, dump))
        .context("locking the outputs")?
    } else {
        Vec::new()
    };
    let (report, staged) = runner::run_staged(experiments, be.as_mut(), &cfg, &mut bar)
        .map_err(|e| interrupted(e, common, dump))?;
    drop(bar);
    if !reporting {
        return if report.summary.ok {
            Ok(None)
        } else {
            Err(Failure::CheckFailed(format!(
                "this rank's checks failed: {}",
                report.summary.failures.join("; ")
            )))
        };
    }
    Ok(Some(Executed {
        report,
        experiments: experiments.to_vec(),
        dump: staged,
        dump_path: dump.map(|d| d.to_path_buf()),
        _locks: locks,
    }))
}

pub(super) fn junit_of(common: &Common, report: &Report, problems: &[String]) -> Option<String> {
    common
        .junit
        .as_ref()
        .map(|_| foldprint::report::junit(report, &|_| Vec::new(), problems))
}
