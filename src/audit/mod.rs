//! `foldprint audit`: one set of experiments under many configurations
//! (library builds, compile targets, kernels, launch shapes, environment
//! variables), one verdict, with proof of which library files were loaded.
//!
//! Each configuration runs `foldprint run --json` in a fresh child process
//! whose `LD_LIBRARY_PATH` starts with a directory of unversioned links to
//! the requested NVRTC / NCCL files ([`libs`]); the child's report says
//! what was actually mapped, and that is checked against the request. Every
//! case's arena digests are compared with the baseline configuration's (the
//! first that is not a control). Negative controls show that the comparison
//! can fail: configurations marked `control = true` are expected to change
//! digests, and each case is also run in-process on the CPU oracle under
//! the contract's own controls (arrival order reversed, pairwise tree).

mod child;
pub mod matrix;
pub mod pins;

pub use matrix::{load, parse, Config, Matrix};
pub use pins::{Family, LibRequest, LibraryCheck, LoadedLibrary};

use crate::backend::cpu::CpuBackend;
use crate::backend::{Backend, BackendError, RunOptions};
use crate::digest::NanPolicy;
use crate::experiment::{Case, DeliveryOrder, ExperimentError};
use crate::fold::Contract;
use crate::report::{ExperimentInfo, Report, ToolInfo};
use serde::Serialize;
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::time::Instant;

pub const AUDIT_FORMAT: &str = "foldprint-audit";
pub const AUDIT_VERSION: u32 = 1;

#[derive(Debug, thiserror::Error)]
pub enum AuditError {
    #[error("{path}: cannot read: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}:{line}:{column}: {message}")]
    Invalid {
        path: PathBuf,
        line: usize,
        column: usize,
        message: String,
    },
    #[error("{path}: {message}")]
    File { path: PathBuf, message: String },
    #[error(transparent)]
    Experiment(#[from] ExperimentError),
    #[error("--keep {path}: {message}")]
    Keep { path: PathBuf, message: String },
    #[error("{path}: cannot prepare the work directory: {source}")]
    WorkDir {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("CPU oracle: {0}")]
    Oracle(#[source] BackendError),
    #[error("{path}: cannot write: {source}")]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

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

/// Library versions a report names.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Versions {
    pub nvrtc: Option<String>,
    pub nccl: Option<String>,
    pub driver: Option<String>,
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
    /// options and fold program image, as the child recorded them.
    pub environment: serde_json::Value,
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
    Baseline { digests: Vec<String> },
    /// Same digests as the baseline.
    Equal,
    /// Different digests; `arena` is the first that differs.
    Differs { digests: Vec<String>, arena: usize },
    /// A control with the baseline's digests.
    Unchanged,
    /// A control whose digests differ, as it should.
    Changed { digests: Vec<String>, arena: usize },
    /// Ran, but the baseline has no digests for this case.
    Uncompared { digests: Vec<String> },
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
    Changed { digests: Vec<String> },
    Unchanged,
    NotApplicable { reason: String },
}

/// The CPU oracle's view of one case.
#[derive(Debug, Clone, Serialize)]
pub struct OracleRow {
    /// Digests of the case itself on the CPU oracle.
    pub digests: Option<Vec<String>>,
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
    pub baseline: Option<Vec<String>>,
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
    pub host: serde_json::Value,
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

/// Called as the audit proceeds (the CLI prints progress on stderr).
pub trait Progress {
    fn oracle_start(&mut self, _cases: usize) {}
    fn oracle_done(&mut self, _seconds: f64) {}
    fn config_start(&mut self, _index: usize, _total: usize, _config: &Config) {}
    fn config_done(&mut self, _outcome: &ConfigOutcome) {}
}

impl Progress for () {}

pub struct Options {
    /// The foldprint binary the children run (normally this one).
    pub exe: PathBuf,
    /// Keep each configuration's work directory under here.
    pub keep: Option<PathBuf>,
}

/// Where the children's link directories and outputs live.
struct WorkArea {
    root: PathBuf,
    temporary: bool,
}

impl WorkArea {
    fn new(keep: Option<&Path>) -> Result<WorkArea, AuditError> {
        if let Some(dir) = keep {
            if let Ok(mut entries) = std::fs::read_dir(dir) {
                if entries.next().is_some() {
                    return Err(AuditError::Keep {
                        path: dir.to_path_buf(),
                        message: "must be a new or empty directory".into(),
                    });
                }
            } else if dir.exists() {
                return Err(AuditError::Keep {
                    path: dir.to_path_buf(),
                    message: "exists and is not a readable directory".into(),
                });
            }
            std::fs::create_dir_all(dir).map_err(|e| AuditError::Keep {
                path: dir.to_path_buf(),
                message: format!("cannot create: {e}"),
            })?;
            let root = std::path::absolute(dir).unwrap_or_else(|_| dir.to_path_buf());
            return Ok(WorkArea {
                root,
                temporary: false,
            });
        }
        let base = std::env::temp_dir();
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        let mut last = None;
        for attempt in 0..100u32 {
            let root = base.join(format!(
                "foldprint-audit-{}-{nanos:x}-{attempt}",
                std::process::id()
            ));
            match std::fs::create_dir(&root) {
                Ok(()) => {
                    return Ok(WorkArea {
                        root,
                        temporary: true,
                    })
                }
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => last = Some(e),
                Err(source) => return Err(AuditError::WorkDir { path: root, source }),
            }
        }
        Err(AuditError::WorkDir {
            path: base,
            source: last.unwrap_or_else(|| std::io::Error::other("no free name")),
        })
    }
}

impl Drop for WorkArea {
    fn drop(&mut self) {
        if self.temporary {
            let _ = std::fs::remove_dir_all(&self.root);
        }
    }
}

type CaseId = (String, String);

/// Variable naming the NCCL file the NCCL backend opens first.
const NCCL_OVERRIDE: &str = "FOLDPRINT_NCCL_LIBRARY";

/// What the comparison needs from one child's report.
#[derive(Default)]
struct Digests {
    ran: bool,
    cases: HashMap<CaseId, Vec<String>>,
    sensitivity: HashMap<CaseId, Sens>,
    skipped: HashMap<CaseId, String>,
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

    let oracle = if m.oracle {
        progress.oracle_start(cases.len());
        let t = Instant::now();
        let o = run_oracle(&cases, m.configs[base].nan_policy)?;
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
        progress.config_start(i, m.configs.len(), c);
        let (o, d) = run_config(m, c, i == base, &work, opts)?;
        progress.config_done(&o);
        // Nothing can be compared without the baseline: stop spending time.
        if i == base && !o.status.has_report() {
            stop = true;
        }
        outcomes.push(o);
        results.push(d);
    }

    let mut failures = Vec::new();
    let mut warnings = Vec::new();
    for o in &outcomes {
        collect_config_problems(o, &mut failures, &mut warnings);
    }
    let rows = compare(m, &cases, &results, oracle.as_deref(), &mut failures);
    collect_control_warnings(m, &outcomes, &rows, &mut failures, &mut warnings);

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
        host: crate::env::host(),
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

fn blank_outcome(c: &Config, baseline: bool, status: Status) -> ConfigOutcome {
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
        environment: serde_json::Value::Null,
        libraries: Vec::new(),
        requested: Vec::new(),
        run_failures: Vec::new(),
        notes: Vec::new(),
        cases: 0,
        skipped: 0,
        kept: None,
    }
}

fn not_run(m: &Matrix, c: &Config, baseline: bool) -> ConfigOutcome {
    let mut o = blank_outcome(c, baseline, Status::NotRun);
    o.ending = "not run".into();
    o.error = Some(format!(
        "not run: the baseline `{}` gave no report",
        m.configs[m.baseline()].name
    ));
    o
}

/// Quote for a POSIX shell, for the kept `command.sh`.
fn shell_quote(s: &str) -> String {
    if !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_./=:,+@%".contains(c))
    {
        s.to_string()
    } else {
        format!("'{}'", s.replace('\'', "'\\''"))
    }
}

fn run_config(
    m: &Matrix,
    c: &Config,
    baseline: bool,
    work: &WorkArea,
    opts: &Options,
) -> Result<(ConfigOutcome, Digests), AuditError> {
    let dir = work.root.join(&c.name);
    let io = |source: std::io::Error| AuditError::WorkDir {
        path: dir.clone(),
        source,
    };
    std::fs::create_dir(&dir).map_err(io)?;
    let mut o = blank_outcome(c, baseline, Status::CouldNotRun);
    o.env = c.env.clone();
    let requests = c.requests();
    if !requests.is_empty() {
        let libdir = dir.join("lib");
        if libdir.to_string_lossy().contains(':') {
            return Err(io(std::io::Error::other(
                "the path holds ':', which LD_LIBRARY_PATH cannot carry",
            )));
        }
        o.links = pins::make_link_dir(&libdir, &requests).map_err(io)?;
        let inherited = c
            .env
            .get("LD_LIBRARY_PATH")
            .cloned()
            .or_else(|| std::env::var("LD_LIBRARY_PATH").ok())
            .filter(|v| !v.is_empty());
        let first = libdir.display().to_string();
        o.env.insert(
            "LD_LIBRARY_PATH".into(),
            match inherited {
                Some(rest) => format!("{first}:{rest}"),
                None => first,
            },
        );
    }
    let mut argv = c.run_args();
    // The report goes to a file: libraries such as NCCL (NCCL_DEBUG) may
    // print to the child's stdout. Stdout stays the fallback.
    let report_path = dir.join("report.json");
    let _ = std::fs::remove_file(&report_path);
    argv.insert(1, "--out".into());
    argv.insert(2, report_path.display().to_string());
    argv.push("--".into());
    argv.extend(m.experiments.iter().map(|p| p.display().to_string()));
    o.command = std::iter::once(opts.exe.display().to_string())
        .chain(argv.iter().cloned())
        .collect();
    let script: String = o
        .env
        .iter()
        .map(|(k, v)| format!("{k}={} ", shell_quote(v)))
        .chain(o.command.iter().map(|a| format!("{} ", shell_quote(a))))
        .collect();
    std::fs::write(dir.join("command.sh"), format!("{}\n", script.trim_end())).map_err(io)?;

    let mut cmd = std::process::Command::new(&opts.exe);
    cmd.args(&argv).envs(&o.env);
    // The NCCL backend opens this file before any bare name: an inherited
    // value would override the requested library.
    if c.nccl.is_some() && !c.env.contains_key(NCCL_OVERRIDE) {
        cmd.env_remove(NCCL_OVERRIDE);
    }
    let out = child::run(cmd, m.timeout);
    let stdout_path = dir.join("stdout.txt");
    std::fs::write(&stdout_path, &out.stdout).map_err(io)?;
    let report_path = if report_path.is_file() {
        report_path
    } else {
        stdout_path
    };
    std::fs::write(dir.join("stderr.txt"), &out.stderr).map_err(io)?;
    if !work.temporary {
        o.kept = Some(dir.display().to_string());
    }
    o.ending = out.ending.to_string();
    o.duration_s = out.duration.as_secs_f64();
    o.stderr_tail = child::tail(&out.stderr, 20);
    if let child::Ending::Exited(code) = out.ending {
        o.exit_code = Some(code);
    }
    let mut d = Digests::default();
    match out.ending {
        child::Ending::Exited(code @ (0 | 1)) => match Report::read(&report_path) {
            Ok(r) => {
                o.status = if code == 0 && r.summary.ok {
                    Status::Ok
                } else {
                    Status::ChecksFailed
                };
                read_report(c, &r, &report_path, &mut o, &mut d);
            }
            Err(e) => {
                o.error = Some(format!(
                    "exit {code} without a usable report on stdout ({e})"
                ));
            }
        },
        child::Ending::Exited(2) => {
            o.status = Status::Rejected;
            o.error = Some("the run rejected its arguments or experiments (exit 2)".into());
        }
        child::Ending::Exited(3) => {
            o.error = Some("this machine cannot run it (exit 3)".into());
        }
        ref e @ child::Ending::TimedOut => {
            o.error = Some(format!(
                "{e} after {} s (matrix `timeout_s`)",
                m.timeout.as_secs()
            ));
        }
        ref e => o.error = Some(e.to_string()),
    }
    Ok((o, d))
}

/// Depth-first search for an object under `key` with a `version`.
fn find_version(v: &serde_json::Value, key: &str) -> Option<String> {
    match v {
        serde_json::Value::Object(map) => {
            if let Some(ver) = map.get(key).and_then(|o| o.get("version")) {
                match ver {
                    serde_json::Value::String(s) => return Some(s.clone()),
                    serde_json::Value::Number(n) => return Some(n.to_string()),
                    _ => {}
                }
            }
            map.iter()
                .filter(|(k, _)| k.as_str() != "libraries")
                .find_map(|(_, child)| find_version(child, key))
        }
        serde_json::Value::Array(items) => items.iter().find_map(|i| find_version(i, key)),
        _ => None,
    }
}

fn read_report(c: &Config, r: &Report, path: &Path, o: &mut ConfigOutcome, d: &mut Digests) {
    let env_backend = &r.environment["backend"];
    o.backend = Some(r.backend.clone());
    o.environment = env_backend.clone();
    o.libraries = env_backend
        .get("libraries")
        .and_then(|l| serde_json::from_value::<Vec<LoadedLibrary>>(l.clone()).ok())
        .unwrap_or_default();
    o.versions = Versions {
        nvrtc: find_version(env_backend, "nvrtc"),
        nccl: find_version(env_backend, "nccl"),
        driver: find_version(env_backend, "driver"),
    };
    o.requested = c
        .requests()
        .into_iter()
        .map(|req| pins::check(req, &o.libraries, &r.backend))
        .collect();
    o.run_failures = r.summary.failures.clone();
    o.notes = r.environment["notes"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|n| n.as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default();
    d.ran = true;
    for case in &r.cases {
        let id = (case.experiment.clone(), case.id.clone());
        d.sensitivity.insert(
            id.clone(),
            Sens {
                verdict: case.sensitivity.verdict.name().into(),
                fraction: case.sensitivity.fraction,
            },
        );
        d.cases
            .insert(id, case.digests().into_iter().map(str::to_string).collect());
    }
    // Reports of backends that decline cases list them under `skipped`.
    if let Some(skipped) = std::fs::read_to_string(path)
        .ok()
        .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok())
        .and_then(|v| v.get("skipped").and_then(|s| s.as_array()).cloned())
    {
        for s in skipped {
            let text = |k: &str| s.get(k).and_then(|v| v.as_str()).unwrap_or("").to_string();
            d.skipped
                .insert((text("experiment"), text("id")), text("reason"));
        }
    }
    o.cases = d.cases.len();
    o.skipped = d.skipped.len();
}

fn collect_config_problems(
    o: &ConfigOutcome,
    failures: &mut Vec<String>,
    warnings: &mut Vec<String>,
) {
    let who = if o.control {
        "control"
    } else {
        "configuration"
    };
    if let Some(e) = &o.error {
        if o.status != Status::NotRun {
            let tail = if o.stderr_tail.is_empty() {
                " (its stderr was empty)".to_string()
            } else {
                format!("; its stderr ends:\n{}", indent(&o.stderr_tail))
            };
            failures.push(format!("{who} `{}` could not run: {e}{tail}", o.name));
        }
    }
    for check in &o.requested {
        if let Some(msg) = &check.message {
            failures.push(format!("{who} `{}`: {msg}", o.name));
        }
    }
    for f in &o.run_failures {
        let line = format!("{who} `{}`: the run's own check failed: {f}", o.name);
        if o.control {
            warnings.push(line);
        } else {
            failures.push(line);
        }
    }
    for n in &o.notes {
        warnings.push(format!("{who} `{}`: {n}", o.name));
    }
    if o.skipped > 0 {
        warnings.push(format!(
            "{who} `{}`: its backend skipped {} case(s) (not compared; see the report)",
            o.name, o.skipped
        ));
    }
}

fn indent(s: &str) -> String {
    s.lines()
        .map(|l| format!("    | {l}"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// First arena whose digest differs (a missing arena counts).
fn first_difference(base: &[String], other: &[String]) -> Option<usize> {
    (0..base.len().max(other.len())).find(|&i| base.get(i) != other.get(i))
}

fn digest_at(d: &[String], i: usize) -> &str {
    d.get(i).map_or("(no arena)", String::as_str)
}

fn compare(
    m: &Matrix,
    cases: &[&Case],
    results: &[Digests],
    oracle: Option<&[OracleCase]>,
    failures: &mut Vec<String>,
) -> Vec<CaseRow> {
    let base = m.baseline();
    let base_name = &m.configs[base].name;
    let mut rows = Vec::with_capacity(cases.len());
    for (ci, case) in cases.iter().enumerate() {
        let id: CaseId = (case.experiment.clone(), case.id.clone());
        let label = format!("{}/{}", case.experiment, case.id);
        let base_digests = results[base].cases.get(&id).cloned();
        let mut cells = Vec::with_capacity(m.configs.len());
        for (i, c) in m.configs.iter().enumerate() {
            let r = &results[i];
            let who = if c.control {
                "control"
            } else {
                "configuration"
            };
            let cell = if !r.ran {
                Cell::NotRun
            } else if let Some(d) = r.cases.get(&id) {
                if i == base {
                    Cell::Baseline { digests: d.clone() }
                } else if let Some(b) = &base_digests {
                    match (first_difference(b, d), c.control) {
                        (None, false) => Cell::Equal,
                        (None, true) => Cell::Unchanged,
                        (Some(a), true) => Cell::Changed {
                            digests: d.clone(),
                            arena: a,
                        },
                        (Some(a), false) => {
                            failures.push(format!(
                                "configuration `{}`: case `{label}` arena {a}: digest {} but the baseline `{base_name}` has {}",
                                c.name,
                                digest_at(d, a),
                                digest_at(b, a)
                            ));
                            Cell::Differs {
                                digests: d.clone(),
                                arena: a,
                            }
                        }
                    }
                } else {
                    Cell::Uncompared { digests: d.clone() }
                }
            } else if let Some(reason) = r.skipped.get(&id) {
                Cell::Skipped {
                    reason: reason.clone(),
                }
            } else {
                failures.push(format!(
                    "{who} `{}`: its report has no case `{label}`",
                    c.name
                ));
                Cell::Missing
            };
            cells.push(NamedCell {
                config: c.name.clone(),
                cell,
            });
        }
        let oracle_row = oracle.map(|o| {
            let oc = &o[ci];
            let vs_baseline = match (&oc.digests, &base_digests) {
                (None, _) => Cell::Skipped {
                    reason: oc.skip.clone().unwrap_or_default(),
                },
                (Some(d), None) => Cell::Uncompared { digests: d.clone() },
                (Some(d), Some(b)) => match first_difference(b, d) {
                    None => Cell::Equal,
                    Some(a) => {
                        failures.push(format!(
                            "CPU oracle: case `{label}` arena {a}: digest {} but the baseline `{base_name}` has {}",
                            digest_at(d, a),
                            digest_at(b, a)
                        ));
                        Cell::Differs {
                            digests: d.clone(),
                            arena: a,
                        }
                    }
                },
            };
            OracleRow {
                digests: oc.digests.clone(),
                vs_baseline,
                arrival_reversed: oc.arrival_reversed.clone(),
                pairwise_tree: oc.pairwise_tree.clone(),
            }
        });
        let sensitivity = results[base]
            .sensitivity
            .get(&id)
            .or_else(|| results.iter().find_map(|r| r.sensitivity.get(&id)))
            .cloned();
        rows.push(CaseRow {
            experiment: case.experiment.clone(),
            id: case.id.clone(),
            key: case.key(),
            world: case.world,
            contract: case.contract.name().to_string(),
            sensitivity,
            baseline: base_digests,
            cells,
            oracle: oracle_row,
        });
    }
    rows
}

/// Blind (or of unknown sensitivity): agreement proves nothing there.
fn is_blind(r: &CaseRow) -> bool {
    r.sensitivity.as_ref().is_none_or(|s| s.verdict == "blind")
}

/// Name up to five cases, then how many more.
fn some_cases(labels: &[String]) -> String {
    let mut s = labels
        .iter()
        .take(5)
        .map(|l| format!("`{l}`"))
        .collect::<Vec<_>>()
        .join(", ");
    if labels.len() > 5 {
        s.push_str(&format!(" and {} more", labels.len() - 5));
    }
    s
}

fn collect_control_warnings(
    m: &Matrix,
    outcomes: &[ConfigOutcome],
    rows: &[CaseRow],
    failures: &mut Vec<String>,
    warnings: &mut Vec<String>,
) {
    let base = m.baseline();
    for (i, c) in m.configs.iter().enumerate() {
        if !outcomes[i].status.has_report() || i == base {
            continue;
        }
        let compared = rows
            .iter()
            .filter(|r| {
                matches!(
                    r.cells[i].cell,
                    Cell::Equal | Cell::Differs { .. } | Cell::Changed { .. } | Cell::Unchanged
                )
            })
            .count();
        if compared == 0 && outcomes[base].status.has_report() {
            let line = format!(
                "{} `{}` compared no case with the baseline (all skipped or uncompared)",
                if c.control {
                    "control"
                } else {
                    "configuration"
                },
                c.name
            );
            if c.control {
                warnings.push(line);
            } else {
                failures.push(line);
            }
        }
        if !c.control {
            continue;
        }
        let changed = rows
            .iter()
            .filter(|r| matches!(r.cells[i].cell, Cell::Changed { .. }))
            .count();
        let still: Vec<String> = rows
            .iter()
            .filter(|r| r.cells[i].cell == Cell::Unchanged && !is_blind(r))
            .map(|r| format!("{}/{}", r.experiment, r.id))
            .collect();
        if compared > 0 && changed == 0 {
            warnings.push(format!(
                "control `{}` changed no case's digests: it does not show that this audit can see a difference",
                c.name
            ));
        } else if !still.is_empty() {
            warnings.push(format!(
                "control `{}` changed {changed} of {compared} case(s) and left {} order-sensitive case(s) unchanged: {}",
                c.name,
                still.len(),
                some_cases(&still)
            ));
        }
    }
    for (what, pick) in [
        ("arrival-order (reversed)", 0usize),
        ("pairwise-tree", 1usize),
    ] {
        let still: Vec<String> = rows
            .iter()
            .filter(|r| !is_blind(r))
            .filter(|r| {
                r.oracle.as_ref().is_some_and(|o| {
                    let cell = if pick == 0 {
                        &o.arrival_reversed
                    } else {
                        &o.pairwise_tree
                    };
                    *cell == ControlCell::Unchanged
                })
            })
            .map(|r| format!("{}/{}", r.experiment, r.id))
            .collect();
        if !still.is_empty() {
            warnings.push(format!(
                "contract control {what} left {} order-sensitive case(s) unchanged: {}",
                still.len(),
                some_cases(&still)
            ));
        }
    }
}

/// The CPU oracle's results for one case.
struct OracleCase {
    digests: Option<Vec<String>>,
    /// Why the oracle did not run it.
    skip: Option<String>,
    arrival_reversed: ControlCell,
    pairwise_tree: ControlCell,
}

fn cpu_digests(
    be: &mut CpuBackend,
    case: &Case,
    nan_policy: NanPolicy,
) -> Result<Vec<String>, AuditError> {
    let mut one = case.clone();
    // Rounds repeat bit for bit (the child checks that); one is enough here.
    one.rounds = 1;
    let run = be
        .run_case(
            &one,
            &RunOptions {
                nan_policy,
                keep_values: false,
            },
        )
        .map_err(AuditError::Oracle)?;
    Ok(run.arenas.iter().map(|a| a.digest().to_string()).collect())
}

fn control_cell(
    be: &mut CpuBackend,
    variant: &Case,
    own: &[String],
    nan_policy: NanPolicy,
) -> Result<ControlCell, AuditError> {
    let d = cpu_digests(be, variant, nan_policy)?;
    Ok(if first_difference(own, &d).is_some() {
        ControlCell::Changed { digests: d }
    } else {
        ControlCell::Unchanged
    })
}

fn run_oracle(cases: &[&Case], nan_policy: NanPolicy) -> Result<Vec<OracleCase>, AuditError> {
    let mut be = CpuBackend::new();
    let mut out = Vec::with_capacity(cases.len());
    for case in cases {
        let oracle_runs = matches!(
            case.contract,
            Contract::FixedOrder | Contract::ArrivalOrder | Contract::PairwiseTree
        );
        if !oracle_runs {
            let reason = format!("the CPU oracle does not run `{}`", case.contract);
            out.push(OracleCase {
                digests: None,
                skip: Some(reason.clone()),
                arrival_reversed: ControlCell::NotApplicable {
                    reason: reason.clone(),
                },
                pairwise_tree: ControlCell::NotApplicable { reason },
            });
            continue;
        }
        let own = cpu_digests(&mut be, case, nan_policy)?;
        let arrival_reversed = if case.world <= 2 {
            ControlCell::NotApplicable {
                reason: "W <= 2: two addends sum the same in either order".into(),
            }
        } else {
            // Reverse the order the case itself folds in: its delivery
            // order under arrival-order, ascending source rank otherwise.
            let mut v = (*case).clone();
            let mut seq = if case.contract == Contract::ArrivalOrder {
                case.order.sequence(case.world)
            } else {
                (0..case.world).collect()
            };
            seq.reverse();
            v.contract = Contract::ArrivalOrder;
            v.order = DeliveryOrder::Explicit(seq);
            control_cell(&mut be, &v, &own, nan_policy)?
        };
        let pairwise_tree = if case.contract == Contract::PairwiseTree {
            ControlCell::NotApplicable {
                reason: "the case is the pairwise tree".into(),
            }
        } else if case.world <= 3 {
            ControlCell::NotApplicable {
                reason: "W <= 3: the pairwise tree is the fixed order".into(),
            }
        } else {
            let mut v = (*case).clone();
            v.contract = Contract::PairwiseTree;
            control_cell(&mut be, &v, &own, nan_policy)?
        };
        out.push(OracleCase {
            digests: Some(own),
            skip: None,
            arrival_reversed,
            pairwise_tree,
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn differences_are_located_by_arena() {
        let a = vec!["x".to_string(), "y".to_string()];
        assert_eq!(first_difference(&a, &a), None);
        assert_eq!(first_difference(&a, &["x".into(), "z".into()]), Some(1));
        assert_eq!(first_difference(&a, &["x".into()]), Some(1));
    }

    #[test]
    fn versions_are_found_where_backends_put_them() {
        let cuda = serde_json::json!({"nvrtc": {"version": "13.0"}, "driver": {"version": 13000}});
        assert_eq!(find_version(&cuda, "nvrtc").as_deref(), Some("13.0"));
        assert_eq!(find_version(&cuda, "driver").as_deref(), Some("13000"));
        let nccl = serde_json::json!({"nccl": {"version": "2.28.3"}, "devices": [{"nvrtc": {"version": "12.4"}}]});
        assert_eq!(find_version(&nccl, "nvrtc").as_deref(), Some("12.4"));
        assert_eq!(find_version(&nccl, "nccl").as_deref(), Some("2.28.3"));
        assert_eq!(
            find_version(&serde_json::json!({"kind": "cpu"}), "nvrtc"),
            None
        );
    }

    #[test]
    fn shell_quoting_round_trips_plain_and_odd_words() {
        assert_eq!(shell_quote("/a/b.so"), "/a/b.so");
        assert_eq!(shell_quote("a b"), "'a b'");
        assert_eq!(shell_quote("it's"), "'it'\\''s'");
        assert_eq!(shell_quote(""), "''");
    }
}
