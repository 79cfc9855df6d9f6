//! One whole run, from experiment files to its outputs in place: what
//! `run`, `verify` and `golden` share, so that the command line only
//! parses arguments and prints. In order:
//!
//! 1. [`load`]: how this process takes part (an NCCL rank reads the
//!    launcher's variables once, into [`Launch`], and checks rank 0's
//!    address, before any GPU is looked for), then the experiments, each
//!    set of rank files opened as that says (an NCCL rank under a launcher
//!    opens only its own, as in the job that wrote them);
//! 2. [`Loaded::execute`]: the rank files hashed while the backend starts
//!    (an NCCL rank hashes first: it presents its own file's digests when
//!    the ranks meet); the [`World`] the backend placed and met, from which
//!    rank 0 completes the rank files it could not read; the output locks;
//!    the cases ([`crate::runner`]), with an [`Observer`] told of each;
//! 3. [`Executed::commit`]: the report and JUnit staged, then put in place
//!    with the dump directory as one unit ([`crate::outputs`]).
//!
//! Only the process that reports (rank 0, or the one process of its world)
//! locks, writes and prints; the other ranks take part and return nothing.

use crate::addends::{AddendError, Scope};
use crate::backend::{self, Backend, BackendChoice, BackendError, BackendOptions};
use crate::digest::NanPolicy;
use crate::environment::BackendEnvironment;
use crate::experiment::{self, Experiment, InputError};
use crate::ranks::rendezvous::{self, Plan};
use crate::ranks::world::{self, Launch, World};
use crate::ranks::{placement, RankError};
use crate::report::Report;
use crate::runner::{self, RunConfig, RunError};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// What a run is asked to do, as plain values (the command line's flags).
#[derive(Debug, Clone)]
pub struct Options {
    /// Experiment files, or directories of `*.toml` files.
    pub paths: Vec<PathBuf>,
    pub backend: BackendChoice,
    pub nan_policy: NanPolicy,
    /// The GPU backends' device settings.
    pub device: crate::gpu::DeviceConfig,
    /// NCCL without a launcher: ranks of the one process, one GPU each.
    pub gpus: usize,
    /// NCCL: bound on the rendezvous and the communicator's start.
    pub init_timeout: Duration,
    /// NCCL: bound on each collective window.
    pub timeout: Duration,
    /// NCCL under a launcher: emulated hosts, as asked on the command line
    /// (`FOLDPRINT_EMULATE_HOSTS` is read too).
    pub emulate_hosts: bool,
    /// The report (`--out`), the JUnit file and the dump directory.
    pub out: Option<PathBuf>,
    pub junit: Option<PathBuf>,
    pub dump: Option<PathBuf>,
}

impl Options {
    /// A run of `paths` on `backend`, every other setting its default and
    /// no output but what the caller prints.
    pub fn new(paths: Vec<PathBuf>, backend: BackendChoice) -> Options {
        let defaults = BackendOptions::default();
        Options {
            paths,
            backend,
            nan_policy: NanPolicy::default(),
            device: defaults.cuda,
            gpus: 1,
            init_timeout: Duration::from_secs(world::DEFAULT_INIT_TIMEOUT_S),
            timeout: defaults.timeout,
            emulate_hosts: false,
            out: None,
            junit: None,
            dump: None,
        }
    }
}

/// Every way a run can fail besides the library errors it carries as they are.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Input(#[from] InputError),
    #[error(transparent)]
    Rank(#[from] RankError),
    #[error(transparent)]
    Backend(#[from] BackendError),
    #[error(transparent)]
    Run(#[from] RunError),
    /// `FOLDPRINT_EMULATE_HOSTS` is neither yes nor no (bad input).
    #[error("{0}")]
    Emulation(String),
    /// What the ranks presented of their rank files does not complete them.
    #[error("the rank files the ranks presented")]
    Presented(#[source] AddendError),
    #[error("the thread hashing the rank files failed")]
    HashingThread,
    #[error("locking the outputs")]
    Locking(#[source] Box<Error>),
    /// Stopped by signal `signal`; the message names the outputs left as
    /// they were.
    #[error("{message}")]
    Interrupted { signal: i32, message: String },
    /// An NCCL rank other than 0 whose own checks failed (it writes no
    /// report to say so).
    #[error("this rank's checks failed: {0}")]
    RankChecks(String),
}

/// What a run tells whoever shows it, besides each case
/// ([`runner::Progress`]).
pub trait Observer: runner::Progress {
    /// The backend has started and the experiments are as they will run.
    fn started(&mut self, _run: &Started<'_>) {}
    /// Another run holds the lock of `output`; this one waits for it.
    fn waiting(&mut self, _output: &Path) {}
    /// The last case has finished.
    fn finished(&mut self) {}
}

impl Observer for () {}

/// A run whose backend has started, as an [`Observer`] sees it.
pub struct Started<'a> {
    backend: &'a dyn Backend,
    /// Whether this process writes the report and prints (false on NCCL
    /// ranks other than 0).
    pub reporting: bool,
    /// The experiments as they run: rank files hashed, keys complete.
    pub experiments: &'a [Experiment],
    /// Why `auto` fell back, if it did.
    pub note: Option<&'a str>,
    /// On the reporting process: this CPU run stands under a package that
    /// pins a CUDA combination, and why it is not that combination's result.
    pub not_gpu: Option<&'a str>,
}

impl Started<'_> {
    /// The backend's name, as reports write it.
    pub fn backend(&self) -> &'static str {
        self.backend.name()
    }

    /// What the backend runs on (asked only when shown: an NCCL backend
    /// hashes its libraries for it).
    pub fn environment(&self) -> BackendEnvironment {
        self.backend.environment()
    }
}

/// Experiments loaded for a run, their rank files opened, not yet hashed.
pub struct Loaded {
    pub experiments: Vec<Experiment>,
    opts: Options,
    launch: Launch,
}

/// Load the experiments of `opts`. Bad launcher variables, or a rendezvous
/// address rank 0 cannot listen on, are refused first (an NCCL run).
pub fn load(opts: Options) -> Result<Loaded, Error> {
    let launch = match opts.backend {
        BackendChoice::Nccl => {
            let launch = world::discover(opts.gpus)?;
            launch.check_rendezvous()?;
            launch
        }
        BackendChoice::Auto | BackendChoice::Cpu | BackendChoice::Cuda => {
            Launch::OneProcess { gpus: opts.gpus }
        }
    };
    let scope = match &launch {
        Launch::PerRank(e) => Scope::OwnRank {
            rank: e.rank,
            world: e.world,
        },
        Launch::OneProcess { .. } => Scope::AllRanks,
    };
    let experiments = experiment::load_all_in(&opts.paths, scope)?;
    Ok(Loaded {
        experiments,
        opts,
        launch,
    })
}

/// A backend of one process, started as a run starts it, for measurements
/// that make their own cases (`bench --inputs`); the note says why `auto`
/// fell back.
pub fn start_backend(
    choice: BackendChoice,
    opts: &BackendOptions,
) -> Result<(Box<dyn Backend>, Option<String>), Error> {
    let mut world = World::one_process(1, Duration::from_secs(world::DEFAULT_INIT_TIMEOUT_S));
    Ok(backend::select(choice, opts, &mut world)?)
}

impl Loaded {
    /// Run the experiments; `None` on an NCCL rank other than 0, which only
    /// takes part (rank 0 writes and prints the one report).
    pub fn execute(&self, observer: &mut dyn Observer) -> Result<Option<Executed>, Error> {
        let o = &self.opts;
        let t0 = std::time::Instant::now();
        let opts = BackendOptions {
            cuda: o.device.clone(),
            timeout: o.timeout,
        };
        // A value of FOLDPRINT_EMULATE_HOSTS that is neither yes nor no is
        // refused on every backend, so a typo never goes unseen.
        let emulate_hosts = || {
            placement::emulation_requested(o.emulate_hosts, |k| std::env::var(k).ok())
                .map_err(Error::Emulation)
        };
        // Rank files are read and hashed in the background while the
        // backend starts and the cases run (a digest is waited for where a
        // key needs it); an NCCL rank presents its own file's digest in the
        // rendezvous, so it hashes first.
        let (experiments, (mut be, note), world) = match o.backend {
            BackendChoice::Nccl => {
                let hashed = experiment::hash_rank_files(&self.experiments)?;
                let emulate = emulate_hosts()?;
                let (lines, summary) = rendezvous::experiment_plan(&hashed);
                let inputs = experiment::rank_file_sets(&hashed)
                    .iter()
                    .map(|s| s.own_facts())
                    .collect();
                let mut world = World::new(
                    self.launch.clone(),
                    Plan::new(&lines, summary),
                    o.init_timeout,
                )
                .with_emulated_hosts(emulate)
                .presenting(inputs);
                let started = backend::select(o.backend, &opts, &mut world)?;
                (hashed, started, world)
            }
            BackendChoice::Auto | BackendChoice::Cpu | BackendChoice::Cuda => {
                emulate_hosts()?;
                let mut world = World::one_process(o.gpus, o.init_timeout);
                let (hashed, started) = std::thread::scope(|s| {
                    let hashing = s.spawn(|| experiment::read_rank_files(&self.experiments));
                    let started = backend::select(o.backend, &opts, &mut world);
                    (hashing.join(), started)
                });
                let hashed = hashed.map_err(|_| Error::HashingThread)??;
                (hashed, started?, world)
            }
        };
        let backend_init_ms = t0.elapsed().as_secs_f64() * 1e3;
        let reporting = world.reports();
        // Rank 0 of NCCL ranks that each opened only their own rank file
        // learns the others' digests from the rendezvous.
        let experiments = if reporting && !world.members().is_empty() {
            let presented: Vec<_> = world.members().iter().map(|m| m.inputs.clone()).collect();
            experiment::complete_rank_files(&experiments, &presented).map_err(Error::Presented)?
        } else {
            experiments
        };
        let dump = o.dump.as_deref().filter(|_| reporting);
        let not_gpu = if reporting {
            let prov = crate::host::provenance();
            crate::host::cpu_under_cuda_combination(be.name(), prov.as_ref())
        } else {
            None
        };
        observer.started(&Started {
            backend: be.as_ref(),
            reporting,
            experiments: &experiments,
            note: note.as_deref(),
            not_gpu: not_gpu.as_deref(),
        });
        let total = experiments.iter().map(|e| e.cases.len()).sum();
        let cfg = RunConfig {
            nan_policy: o.nan_policy,
            dump,
            notes: note.into_iter().collect(),
            backend_init_ms,
        };
        // Two runs writing the same outputs take turns, from before the first
        // case to the last rename (only the rank that writes them locks).
        let outputs: Vec<&Path> = [o.out.as_deref(), o.junit.as_deref(), dump]
            .into_iter()
            .flatten()
            .collect();
        let locks = if reporting {
            crate::outputs::lock_all(&outputs, total, &mut |p| observer.waiting(p))
                .map_err(|e| Error::Locking(Box::new(self.interrupted(e, dump))))?
        } else {
            Vec::new()
        };
        let (report, staged) = runner::run_staged(&experiments, be.as_mut(), &cfg, observer)
            .map_err(|e| self.interrupted(e, dump))?;
        // A file no case read (all skipped) is still refused if its pass
        // failed: the report would name bytes nobody saw.
        experiment::rank_files_read(&experiments)?;
        observer.finished();
        if !reporting {
            return if report.summary.ok {
                Ok(None)
            } else {
                Err(Error::RankChecks(report.summary.failures.join("; ")))
            };
        }
        Ok(Some(Executed {
            report,
            experiments,
            dump: staged,
            dump_path: dump.map(Path::to_path_buf),
            out: o.out.clone(),
            junit: o.junit.clone(),
            _locks: locks,
        }))
    }

    /// An interruption says which outputs were left as they were.
    fn interrupted(&self, e: RunError, dump: Option<&Path>) -> Error {
        interrupted(
            e,
            [self.opts.out.as_deref(), self.opts.junit.as_deref(), dump],
        )
    }
}

fn interrupted(e: RunError, outputs: [Option<&Path>; 3]) -> Error {
    if let RunError::Interrupted { signal, .. } = &e {
        let kept: Vec<String> = outputs
            .into_iter()
            .flatten()
            .map(|p| p.display().to_string())
            .collect();
        let tail = if kept.is_empty() {
            String::new()
        } else {
            format!("; {} left as they were", kept.join(", "))
        };
        return Error::Interrupted {
            signal: *signal,
            message: format!("{e}{tail}"),
        };
    }
    e.into()
}

/// A finished run whose outputs are not yet in place; its output locks are
/// held until it is dropped.
pub struct Executed {
    pub report: Report,
    /// The experiments as run: rank files hashed, keys complete.
    pub experiments: Vec<Experiment>,
    dump: Option<crate::dumpdir::DumpDir>,
    dump_path: Option<PathBuf>,
    out: Option<PathBuf>,
    junit: Option<PathBuf>,
    _locks: Vec<crate::outputs::Lock>,
}

impl Executed {
    /// Stage the report (`--out`) and `junit` (the XML, when the run has a
    /// JUnit file), then put every output in place as one unit
    /// ([`crate::outputs`]).
    pub fn commit(&mut self, junit: Option<String>) -> Result<(), Error> {
        let mut files = Vec::new();
        if let Some(out) = &self.out {
            files.push(crate::outputs::stage(
                out,
                self.report.to_json().as_bytes(),
            )?);
        }
        if let (Some(path), Some(xml)) = (&self.junit, junit) {
            files.push(crate::outputs::stage(path, xml.as_bytes())?);
        }
        let cases = self.report.cases.len() + self.report.skipped.len();
        crate::outputs::commit(self.dump.take(), files, cases).map_err(|e| {
            interrupted(
                e,
                [
                    self.out.as_deref(),
                    self.junit.as_deref(),
                    self.dump_path.as_deref(),
                ],
            )
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What an observer was told, in order.
    #[derive(Default)]
    struct Told(Vec<String>);

    impl runner::Progress for Told {
        fn start(&mut self, case: &experiment::Case, _: usize, _: usize) {
            self.0.push(format!("start {}", case.id()));
        }
        fn done(&mut self, case: &experiment::Case, _: Option<&crate::report::CaseReport>) {
            self.0.push(format!("done {}", case.id()));
        }
    }

    impl Observer for Told {
        fn started(&mut self, run: &Started<'_>) {
            let cases: usize = run.experiments.iter().map(|e| e.cases.len()).sum();
            self.0.push(format!(
                "started {} reporting={} cases={cases}",
                run.backend(),
                run.reporting
            ));
        }
        fn finished(&mut self) {
            self.0.push("finished".into());
        }
    }

    #[test]
    fn a_run_tells_its_observer_each_step_and_returns_the_report() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("r.json");
        let mut opts = Options::new(
            vec![PathBuf::from("experiments/smoke.toml")],
            BackendChoice::Cpu,
        );
        opts.out = Some(out.clone());
        let loaded = load(opts).unwrap();
        let ids: Vec<String> = loaded.experiments[0]
            .cases
            .iter()
            .map(|c| c.id().to_string())
            .collect();
        let mut told = Told::default();
        let mut run = loaded
            .execute(&mut told)
            .unwrap()
            .expect("one process reports");
        let mut want = vec![format!("started cpu reporting=true cases={}", ids.len())];
        for id in &ids {
            want.push(format!("start {id}"));
            want.push(format!("done {id}"));
        }
        want.push("finished".into());
        assert_eq!(told.0, want);
        assert_eq!(run.report.cases.len(), ids.len());
        // Nothing is written until the commit, and then the report is.
        assert!(!out.exists());
        run.commit(None).unwrap();
        let written: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&out).unwrap()).unwrap();
        assert_eq!(written["cases"].as_array().unwrap().len(), ids.len());
    }
}
