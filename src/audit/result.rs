//! What an audit found, in the shape `--json` and `--out` write: the
//! configurations with what each loaded, one row per case with a cell per
//! configuration, the CPU oracle's row, failures and warnings.

use super::matrix::{Config, Matrix};
use super::pins::{LibraryCheck, LoadedLibrary};
use super::AuditError;
use crate::environment::BackendEnvironment;
pub use crate::environment::Versions;
use crate::report::{ExperimentInfo, ToolInfo};
use serde::Serialize;
use std::collections::BTreeMap;
use std::path::Path;

pub const AUDIT_FORMAT: &str = "foldprint-audit";
pub const AUDIT_VERSION: u32 = 1;

/// What happened to one configuration's child run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Status {
    /// Exit 0 with a report.
    Ok,
    /// Exit 1 with a report: the run's own checks failed.
    ChecksFailed,
    /// Exit 2: the run rejected its arguments or experiments.
    Rejected,
    /// No usable report: backend missing (exit 3), crash, signal, timeout.
    CouldNotRun,
    /// Not started (the baseline could not run).
    NotRun,
}

impl Status {
    pub fn has_report(self) -> bool {
        matches!(self, Status::Ok | Status::ChecksFailed)
    }
}

/// One configuration: what it asked for, how its child ended, what it loaded.
#[derive(Debug, Clone, Serialize)]
pub struct ConfigOutcome {
    pub name: String,
    pub control: bool,
    pub baseline: bool,
    pub settings: serde_json::Value,
    /// The child's argv (program first).
    pub command: Vec<String>,
    /// Variables set for the child on top of the audit's own environment.
    pub env: BTreeMap<String, String>,
    /// Links made in the child's library directory.
    pub links: Vec<String>,
    pub status: Status,
    /// `exit 0`, `killed by signal 9`, `timed out (killed)` ...
    pub ending: String,
    pub exit_code: Option<i32>,
    pub duration_s: f64,
    /// Why it did not give a usable report.
    pub error: Option<String>,
    pub stderr_tail: String,
    /// The backend the report names.
    pub backend: Option<String>,
    pub versions: Versions,
    /// The report's `environment.backend`: device, driver, NVRTC, compile
    /// options and fold program image, as the child recorded them (`null`
    /// without a report).
    pub environment: Option<BackendEnvironment>,
    /// Every tracked library the child mapped (report's environment).
    pub libraries: Vec<LoadedLibrary>,
    /// The requested libraries, checked against `libraries`.
    pub requested: Vec<LibraryCheck>,
    /// The run's own failed checks (`summary.failures`).
    pub run_failures: Vec<String>,
    /// The report's `environment.notes` (e.g. why `auto` fell back).
    pub notes: Vec<String>,
    pub cases: usize,
    pub skipped: usize,
    /// Its work directory, when `--keep` was given.
    pub kept: Option<String>,
}

/// One cell of the matrix: a case under one configuration.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "state", rename_all = "kebab-case")]
pub enum Cell {
    /// The baseline's own digests.
    Baseline { digests: Vec<crate::digest::Sha256> },
    /// Same digests as the baseline.
    Equal,
    /// Different digests; `arena` is the first that differs.
    Differs {
        digests: Vec<crate::digest::Sha256>,
        arena: usize,
    },
    /// A control with the baseline's digests.
    Unchanged,
    /// A control whose digests differ, as it should.
    Changed {
        digests: Vec<crate::digest::Sha256>,
        arena: usize,
    },
    /// Ran, but the baseline has no digests for this case.
    Uncompared { digests: Vec<crate::digest::Sha256> },
    /// The backend declined the case (its report says why).
    Skipped { reason: String },
    /// The configuration's report does not list the case.
    Missing,
    /// The configuration gave no report.
    NotRun,
}

#[derive(Debug, Clone, Serialize)]
pub struct NamedCell {
    pub config: String,
    #[serde(flatten)]
    pub cell: Cell,
}

/// A negative control of the contract, run on the CPU oracle.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "state", rename_all = "kebab-case")]
pub enum ControlCell {
    Changed { digests: Vec<crate::digest::Sha256> },
    Unchanged,
    NotApplicable { reason: String },
}

/// The CPU oracle's view of one case.
#[derive(Debug, Clone, Serialize)]
pub struct OracleRow {
    /// Digests of the case itself on the CPU oracle.
    pub digests: Option<Vec<crate::digest::Sha256>>,
    /// Those, against the baseline's.
    pub vs_baseline: Cell,
    /// `arrival-order` folding in the reverse of the case's own fold order
    /// (its delivery order under arrival-order, else ascending rank).
    pub arrival_reversed: ControlCell,
    /// `pairwise-tree` in the case's delivery order.
    pub pairwise_tree: ControlCell,
}

#[derive(Debug, Clone, Serialize)]
pub struct Sens {
    pub verdict: String,
    pub fraction: f64,
}

/// One case across every configuration.
#[derive(Debug, Clone, Serialize)]
pub struct CaseRow {
    pub experiment: String,
    pub id: String,
    pub key: String,
    pub world: usize,
    pub contract: String,
    /// From the baseline's report (else the first report that ran the case).
    pub sensitivity: Option<Sens>,
    pub baseline: Option<Vec<crate::digest::Sha256>>,
    /// One per configuration, in matrix order.
    pub cells: Vec<NamedCell>,
    pub oracle: Option<OracleRow>,
}

#[derive(Debug, Clone, Serialize)]
pub struct MatrixInfo {
    pub name: String,
    pub description: String,
    pub path: String,
    pub sha256: String,
    pub timeout_s: u64,
}

/// Everything an audit found; `--json` / `--out` write exactly this.
#[derive(Debug, Clone, Serialize)]
pub struct AuditResult {
    pub format: String,
    pub version: u32,
    pub foldprint: ToolInfo,
    pub matrix: MatrixInfo,
    pub host: crate::environment::HostFacts,
    pub experiments: Vec<ExperimentInfo>,
    pub baseline: String,
    /// Whether the CPU oracle and the contract controls ran.
    pub oracle: bool,
    pub configurations: Vec<ConfigOutcome>,
    pub cases: Vec<CaseRow>,
    /// Reasons the audit failed.
    pub failures: Vec<String>,
    /// Things worth reading that do not fail it (weak controls, skips).
    pub warnings: Vec<String>,
    pub ok: bool,
    /// 0 pass, 1 a difference or a library mismatch, 2 a run rejected its
    /// input, 3 a run could not run at all.
    pub exit_code: i32,
}

impl AuditResult {
    pub fn to_json(&self) -> String {
        let mut s = serde_json::to_string_pretty(self).unwrap_or_else(|e| {
            format!("{{\"format\": \"{AUDIT_FORMAT}\", \"error\": \"cannot serialize: {e}\"}}")
        });
        s.push('\n');
        s
    }

    /// Write the JSON atomically.
    pub fn write(&self, path: &Path) -> Result<(), AuditError> {
        crate::atomic::write(path, self.to_json().as_bytes()).map_err(|source| AuditError::Write {
            path: path.to_path_buf(),
            source,
        })
    }
}

fn settings_json(c: &Config) -> serde_json::Value {
    serde_json::json!({
        "backend": c.backend,
        "nvrtc": c.nvrtc,
        "nccl": c.nccl,
        "target": c.target,
        "kernel": c.kernel,
        "block": c.block,
        "copy_streams": c.copy_streams,
        "ftz": c.ftz,
        "nan_policy": c.nan_policy.name(),
        "env": c.env,
        "args": c.args,
    })
}

pub(super) fn blank_outcome(c: &Config, baseline: bool, status: Status) -> ConfigOutcome {
    ConfigOutcome {
        name: c.name.clone(),
        control: c.control,
        baseline,
        settings: settings_json(c),
        command: Vec::new(),
        env: BTreeMap::new(),
        links: Vec::new(),
        status,
        ending: String::new(),
        exit_code: None,
        duration_s: 0.0,
        error: None,
        stderr_tail: String::new(),
        backend: None,
        versions: Versions::default(),
        environment: None,
        libraries: Vec::new(),
        requested: Vec::new(),
        run_failures: Vec::new(),
        notes: Vec::new(),
        cases: 0,
        skipped: 0,
        kept: None,
    }
}

pub(super) fn not_run(m: &Matrix, c: &Config, baseline: bool) -> ConfigOutcome {
    let mut o = blank_outcome(c, baseline, Status::NotRun);
    o.ending = "not run".into();
    o.error = Some(format!(
        "not run: the baseline `{}` gave no report",
        m.configs[m.baseline()].name
    ));
    o
}
