//! `foldprint audit`: one set of experiments under many configurations
//! (library builds, compile targets, kernels, launch shapes, environment
//! variables), one verdict, with proof of which library files were loaded.
//!
//! Each configuration runs `foldprint run --json` in a fresh child process
//! whose `LD_LIBRARY_PATH` starts with a directory of unversioned links to
//! the requested NVRTC / NCCL files ([`pins`]); the child's report says
//! what was actually mapped, and that is checked against the request. Every
//! case's arena digests are compared with the baseline configuration's (the
//! first that is not a control). Negative controls show that the comparison
//! can fail: configurations marked `control = true` are expected to change
//! digests, and each case is also run on the CPU oracle, in one more child,
//! under the contract's own controls (arrival order reversed, pairwise
//! tree). The audit never runs a backend itself: it runs `foldprint run`
//! and reads reports.
//!
//! Files: `matrix.rs` (the matrix), `pins.rs` (library links and the
//! check), `workdir.rs`, `child.rs` (one child run), `read.rs` (a child's
//! report), `compare.rs` (cells, failures, warnings), `oracle.rs` (the CPU
//! oracle's child), `result.rs` (what `--json` writes).

mod child;
mod compare;
pub mod matrix;
mod oracle;
pub mod pins;
mod read;
mod result;
mod workdir;

pub use crate::environment::LoadedLibrary;
pub use matrix::{load, parse, Config, Matrix};
pub use pins::{Family, LibRequest, LibraryCheck};
pub use result::{
    AuditResult, CaseRow, Cell, ConfigOutcome, ControlCell, MatrixInfo, NamedCell, OracleRow, Sens,
    Status, Versions, AUDIT_FORMAT, AUDIT_VERSION,
};

use crate::experiment::{Case, InputError};
use crate::report::{ExperimentInfo, ToolInfo};
use read::Digests;
use result::not_run;
use std::path::PathBuf;
use std::time::Instant;
use workdir::WorkArea;

#[derive(Debug, thiserror::Error)]
pub enum AuditError {
    /// The matrix or an experiment it names is unreadable or invalid.
    #[error(transparent)]
    Input(#[from] InputError),
    #[error("--keep {path}: {message}")]
    Keep { path: PathBuf, message: String },
    #[error("{path}: cannot prepare the work directory: {source}")]
    WorkDir {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The CPU oracle's child gave no digests.
    #[error("CPU oracle: {0}")]
    Oracle(String),
    #[error("{path}: cannot write: {source}")]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// A signal asked the audit to stop: the running child got it too and
    /// was reaped; the temporary work directory is removed.
    #[error(
        "interrupted by {}: the running child was stopped, no result written",
        crate::interrupt::signal_name(*signal)
    )]
    Interrupted { signal: i32 },
}

/// Stop before starting another child when a signal asked to.
fn check_signal() -> Result<(), AuditError> {
    match crate::interrupt::pending() {
        Some(signal) => Err(AuditError::Interrupted { signal }),
        None => Ok(()),
    }
}

/// Called as the audit proceeds (the CLI prints progress on stderr).
pub trait Progress {
    fn oracle_start(&mut self, _cases: usize) {}
    fn oracle_done(&mut self, _seconds: f64) {}
    fn config_start(&mut self, _index: usize, _total: usize, _config: &Config) {}
    fn config_done(&mut self, _outcome: &ConfigOutcome) {}
}

impl Progress for () {}

pub struct Options {
    /// The foldprint binary the children run (normally this one); the CPU
    /// oracle's child runs it too.
    pub exe: PathBuf,
    /// Keep each configuration's work directory under here.
    pub keep: Option<PathBuf>,
}

/// Run the whole matrix.
pub fn run(
    m: &Matrix,
    opts: &Options,
    progress: &mut dyn Progress,
) -> Result<AuditResult, AuditError> {
    let experiments = crate::experiment::load_all(&m.experiments)?;
    let cases: Vec<&Case> = experiments.iter().flat_map(|e| &e.cases).collect();
    let work = WorkArea::new(opts.keep.as_deref())?;
    let base = m.baseline();

    check_signal()?;
    let oracle = if m.oracle {
        progress.oracle_start(cases.len());
        let t = Instant::now();
        let o = oracle::run(&cases, m.configs[base].nan_policy, m.timeout, &work, opts)?;
        progress.oracle_done(t.elapsed().as_secs_f64());
        Some(o)
    } else {
        None
    };

    let mut outcomes = Vec::with_capacity(m.configs.len());
    let mut results = Vec::with_capacity(m.configs.len());
    let mut stop = false;
    for (i, c) in m.configs.iter().enumerate() {
        if stop {
            outcomes.push(not_run(m, c, i == base));
            results.push(Digests::default());
            continue;
        }
        check_signal()?;
        progress.config_start(i, m.configs.len(), c);
        let (o, d) = child::run_config(m, c, i == base, &work, opts)?;
        progress.config_done(&o);
        // Nothing can be compared without the baseline: stop spending time.
        if i == base && !o.status.has_report() {
            stop = true;
        }
        outcomes.push(o);
        results.push(d);
    }

    check_signal()?;
    let mut failures = Vec::new();
    let mut warnings = Vec::new();
    for o in &outcomes {
        compare::collect_config_problems(o, &mut failures, &mut warnings);
    }
    let rows = compare::compare(m, &cases, &results, oracle.as_deref(), &mut failures);
    compare::collect_control_warnings(m, &outcomes, &rows, &mut failures, &mut warnings);

    let exit_code = if outcomes.iter().any(|o| o.status == Status::Rejected) {
        2
    } else if outcomes
        .iter()
        .any(|o| matches!(o.status, Status::CouldNotRun | Status::NotRun))
    {
        3
    } else if failures.is_empty() {
        0
    } else {
        1
    };
    Ok(AuditResult {
        format: AUDIT_FORMAT.into(),
        version: AUDIT_VERSION,
        foldprint: ToolInfo::current(),
        matrix: MatrixInfo {
            name: m.name.clone(),
            description: m.description.clone(),
            path: m.path.display().to_string(),
            sha256: m.sha256.clone(),
            timeout_s: m.timeout.as_secs(),
        },
        host: crate::host::facts(),
        experiments: experiments.iter().map(ExperimentInfo::from).collect(),
        baseline: m.configs[base].name.clone(),
        oracle: m.oracle,
        configurations: outcomes,
        cases: rows,
        ok: exit_code == 0,
        failures,
        warnings,
        exit_code,
    })
}

#[cfg(test)]
mod tests {
    /// ARCHITECTURE.md: the audit runs `foldprint run` and reads reports;
    /// from the backends it takes only the names a matrix may write.
    #[test]
    fn the_audit_runs_no_backend_itself() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src/audit");
        let allowed = ["crate::backend::BackendChoice", "crate::gpu::Target"];
        let mut files = 0;
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            let text = std::fs::read_to_string(&path).unwrap();
            files += 1;
            for (n, line) in text.lines().enumerate() {
                let rest = line.replace(allowed[0], "").replace(allowed[1], "");
                // (Spelled in pieces, so that this test does not find itself.)
                let forbidden = [["backend", "::"], ["Cpu", "Backend"], ["run", "_case"]];
                assert!(
                    !forbidden.iter().any(|w| rest.contains(&w.concat())),
                    "{}:{}: {line}",
                    path.display(),
                    n + 1
                );
            }
        }
        assert!(files >= 8, "{files} files");
    }
}
