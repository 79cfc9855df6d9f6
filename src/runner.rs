//! One `run`: experiments -> backend -> digests -> report (+ dumps).

use crate::backend::{Backend, BackendError, RunOptions};
use crate::digest::{hashed_bytes, sha256_hex, NanPolicy};
use crate::experiment::{Case, Experiment};
use crate::report::{
    build_groups, CaseReport, ExperimentInfo, Report, SkippedCase, Summary, ToolInfo,
    REPORT_FORMAT, REPORT_VERSION,
};
use std::path::{Path, PathBuf};

#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error(transparent)]
    Backend(#[from] BackendError),
    #[error("{path}: cannot write dump: {source}")]
    Dump {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// Called before and after each case (for progress bars).
pub trait Progress {
    fn start(&mut self, _case: &Case, _index: usize, _total: usize) {}
    fn done(&mut self, _case: &Case) {}
}

impl Progress for () {}

pub struct RunConfig<'a> {
    pub nan_policy: NanPolicy,
    pub dump: Option<&'a Path>,
    /// Extra lines for the report (e.g. why `auto` fell back).
    pub notes: Vec<String>,
    /// Wall time spent starting the backend (device, NVRTC, communicator).
    pub backend_init_ms: f64,
}

pub fn run(
    experiments: &[Experiment],
    backend: &mut dyn Backend,
    cfg: &RunConfig<'_>,
    progress: &mut dyn Progress,
) -> Result<Report, RunError> {
    let opts = RunOptions {
        nan_policy: cfg.nan_policy,
        keep_values: cfg.dump.is_some(),
    };
    let all: Vec<&Case> = experiments.iter().flat_map(|e| &e.cases).collect();
    let mut dumps = Vec::new();
    let mut cases = Vec::with_capacity(all.len());
    let mut skipped = Vec::new();
    for (i, case) in all.iter().enumerate() {
        progress.start(case, i, all.len());
        if let Some(reason) = backend.skip_reason(case) {
            skipped.push(SkippedCase {
                key: case.key(),
                experiment: case.experiment.clone(),
                id: case.id.clone(),
                reason,
            });
            progress.done(case);
            continue;
        }
        let mut out = backend.run_case(case, &opts)?;
        let s0 = std::time::Instant::now();
        let sensitivity = crate::sensitivity::measure(case);
        let sensitivity_ms = s0.elapsed().as_secs_f64() * 1e3;
        if let Some(dir) = cfg.dump {
            for (a, arena) in out.arenas.iter_mut().enumerate() {
                if let Some(values) = arena.values.take() {
                    let name = dump_name(case, a);
                    let bytes = hashed_bytes(&values, cfg.nan_policy);
                    write_dump(dir, &name, &bytes)?;
                    dumps.push((sha256_hex(&bytes), name));
                }
            }
        }
        let mut report = CaseReport::new(
            case,
            &out.arenas,
            out.rounds,
            out.rounds_identical,
            sensitivity,
        );
        report.timings.sensitivity_ms = sensitivity_ms;
        cases.push(report);
        progress.done(case);
    }
    if let Some(dir) = cfg.dump {
        // Written last: its presence means every listed file is complete.
        let sums: String = dumps.iter().map(|(h, n)| format!("{h}  {n}\n")).collect();
        write_dump(dir, "SHA256SUMS", sums.as_bytes())?;
    }
    let groups = build_groups(&cases);
    let mut environment = serde_json::json!({
        "host": crate::env::host(),
        "backend": backend.environment(),
    });
    environment["backend_init_ms"] = serde_json::json!(cfg.backend_init_ms);
    let mut notes = cfg.notes.clone();
    let mut tool = ToolInfo::current();
    if let Some(mut p) = crate::env::provenance() {
        // A CPU run under a package pinning CUDA libraries must not read as
        // that combination's GPU result.
        if let Some(note) = crate::env::cpu_under_cuda_combination(backend.name(), Some(&p)) {
            p["used"] = serde_json::json!(false);
            p["note"] = serde_json::json!(note);
            notes.push(note);
        }
        // Packaged builds keep the git revision out of the binary (it would
        // rebuild on every commit) and put it in the provenance.
        if tool.git == "unknown" {
            if let Some(g) = p["content"]["foldprint"]["git"].as_str() {
                tool.git = g.to_string();
            }
        }
        environment["provenance"] = p;
    }
    // How the host's CUDA driver was found, when this process looked.
    if let Some(d) = crate::backend::cuda::host_driver::state() {
        environment["host_driver"] = serde_json::json!(d);
    }
    if !notes.is_empty() {
        environment["notes"] = serde_json::json!(notes);
    }
    let mut report = Report {
        format: REPORT_FORMAT.into(),
        version: REPORT_VERSION,
        foldprint: tool,
        backend: backend.name().into(),
        nan_policy: cfg.nan_policy.name().into(),
        environment,
        experiments: experiments.iter().map(ExperimentInfo::from).collect(),
        cases,
        skipped,
        groups,
        summary: Summary::default(),
    };
    report.summarize();
    Ok(report)
}

/// `<experiment>.<case id>.a<k>.bin`, with anything unsafe in a file name replaced.
pub fn dump_name(case: &Case, arena: usize) -> String {
    let clean = |s: &str| -> String {
        s.chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || "-_.=+".contains(c) {
                    c
                } else {
                    '_'
                }
            })
            .collect()
    };
    format!(
        "{}.{}.a{arena}.bin",
        clean(&case.experiment),
        clean(&case.id)
    )
}

fn write_dump(dir: &Path, name: &str, bytes: &[u8]) -> Result<(), RunError> {
    let path = dir.join(name);
    std::fs::create_dir_all(dir)
        .and_then(|_| crate::atomic::write(&path, bytes))
        .map_err(|source| RunError::Dump { path, source })
}
