//! One `run`: experiments -> backend -> digests -> report (+ dumps).

use crate::backend::{Backend, BackendError, RunOptions};
use crate::digest::{hashed_bytes_as, NanPolicy};
pub use crate::dumpdir::{dump_name, dump_names};
use crate::environment::Environment;
use crate::experiment::{Case, Experiment};
use crate::report::expect::ExpectOutcome;
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
    #[error("--dump: {0}")]
    DumpNames(String),
    #[error("{path}: cannot write: {source}")]
    Output {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// A signal asked the run to stop; it did, at a case boundary, and
    /// wrote nothing.
    #[error(
        "interrupted by {} after {done} of {total} cases: nothing was written",
        crate::interrupt::signal_name(*signal)
    )]
    Interrupted {
        signal: i32,
        done: usize,
        total: usize,
    },
}

/// Called before and after each case (for progress bars).
pub trait Progress {
    fn start(&mut self, _case: &Case, _index: usize, _total: usize) {}
    /// `result` is `None` for a skipped case.
    fn done(&mut self, _case: &Case, _result: Option<&CaseReport>) {}
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

/// One run; its dumps, if asked for, are written in full to a staging
/// directory and returned uncommitted, so the caller commits them with its
/// other outputs ([`crate::outputs::commit`]).
pub fn run_staged(
    experiments: &[Experiment],
    backend: &mut dyn Backend,
    cfg: &RunConfig<'_>,
    progress: &mut dyn Progress,
) -> Result<(Report, Option<crate::dumpdir::DumpDir>), RunError> {
    let dump_opts = RunOptions {
        nan_policy: cfg.nan_policy,
        keep_values: cfg.dump.is_some(),
    };
    // A case with `expect` needs its values to compare them.
    let opts_for = |case: &Case| RunOptions {
        keep_values: dump_opts.keep_values
            || case.expect().is_some()
            || !case.expect_ranks().is_empty(),
        ..dump_opts
    };
    let all: Vec<&Case> = experiments.iter().flat_map(|e| &e.cases).collect();
    // Everything that can be known before the first case is checked first:
    // dump names, every case's memory need, the dump directory.
    let running: Vec<&Case> = all
        .iter()
        .copied()
        .filter(|c| backend.skip_reason(c).is_none())
        .collect();
    let names = dump_names(
        &running
            .iter()
            .map(|c| (c.experiment(), c.id(), c.arenas().len()))
            .collect::<Vec<_>>(),
    )
    .map_err(RunError::DumpNames)?;
    for case in &running {
        backend.preflight(case, &opts_for(case))?;
    }
    let mut dump = match cfg.dump {
        Some(dir) => {
            Some(
                crate::dumpdir::DumpDir::create(dir).map_err(|source| RunError::Dump {
                    path: dir.to_path_buf(),
                    source,
                })?,
            )
        }
        None => None,
    };
    let mut cases = Vec::with_capacity(all.len());
    let mut skipped = Vec::new();
    for (i, case) in all.iter().enumerate() {
        if let Some(signal) = crate::interrupt::pending() {
            return Err(RunError::Interrupted {
                signal,
                done: i,
                total: all.len(),
            });
        }
        progress.start(case, i, all.len());
        if let Some(reason) = backend.skip_reason(case) {
            skipped.push(SkippedCase {
                key: case.key(),
                experiment: case.experiment().to_string(),
                id: case.id().to_string(),
                reason,
            });
            progress.done(case, None);
            continue;
        }
        // The sensitivity is measured beside the case (or by the backend:
        // NCCL ranks that each hold only their own file gather the sample).
        let (mut out, measured) =
            crate::backend::run_case_measured(backend, case, &opts_for(case))?;
        let (sensitivity, sensitivity_ms) = measured.map_err(addends_error(case))?;
        let compared = case.expect().is_some() || !case.expect_ranks().is_empty();
        let values: Option<Vec<&[f32]>> = out
            .arenas
            .iter()
            .map(|a| a.values.as_deref())
            .collect::<Option<_>>()
            .filter(|_| compared);
        if compared && values.is_none() {
            return Err(RunError::Backend(crate::backend::infrastructure(
                case.id(),
                "expect",
                "the backend returned no values to compare",
            )));
        }
        let values = values.unwrap_or_default();
        let expect = match case.expect() {
            Some(file) => Some(
                ExpectOutcome::compare(file, &values, case.dtype(), cfg.nan_policy)
                    .map_err(addends_error(case))?,
            ),
            None => None,
        };
        // Each rank's file against its shard of the gathered arenas.
        let mut expect_ranks = Vec::with_capacity(case.expect_ranks().len());
        for (r, file) in case.expect_ranks().iter().enumerate() {
            let shards: Vec<&[f32]> = values
                .iter()
                .map(|v| {
                    let plan = crate::fold::shard_plan(v.len(), case.world());
                    plan.map_or(&v[..0], |p| &v[p[r].range()])
                })
                .collect();
            expect_ranks.push(
                ExpectOutcome::compare(file, &shards, case.dtype(), cfg.nan_policy)
                    .map_err(addends_error(case))?,
            );
        }
        // One process per rank: each rank compares its own shard with its
        // own file, and the outcomes travel to every rank.
        if let Some((rank, file)) = case.expect_own() {
            let shards = out.own_shards.take().unwrap_or_default();
            expect_ranks = own_expects(backend, case, rank, file, &shards, cfg.nan_policy)?;
        }
        if let Some(dir) = dump.as_mut().filter(|_| dump_opts.keep_values) {
            for (a, arena) in out.arenas.iter_mut().enumerate() {
                if let Some(values) = arena.values.take() {
                    let name = &names[&(case.experiment(), case.id(), a)];
                    let bytes = hashed_bytes_as(&values, case.dtype(), cfg.nan_policy);
                    drop(values);
                    dir.write_as(name, &bytes, case.dtype())
                        .map_err(|source| RunError::Dump {
                            path: dir.target().join(name),
                            source,
                        })?;
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
        report.expect = expect;
        report.expect_ranks = expect_ranks;
        progress.done(case, Some(&report));
        cases.push(report);
    }
    if let Some(signal) = crate::interrupt::pending() {
        return Err(RunError::Interrupted {
            signal,
            done: all.len(),
            total: all.len(),
        });
    }
    let groups = build_groups(&cases);
    let mut notes = cfg.notes.clone();
    let mut tool = ToolInfo::current();
    let mut provenance = crate::host::provenance();
    if let Some(p) = provenance.as_mut() {
        // A CPU run under a package pinning CUDA libraries must not read as
        // that combination's GPU result.
        if let Some(note) = crate::host::cpu_under_cuda_combination(backend.name(), Some(p)) {
            p.used = Some(false);
            p.note = Some(note.clone());
            notes.push(note);
        }
        // Packaged builds keep the git revision out of the binary (it would
        // rebuild on every commit) and put it in the provenance.
        if tool.git == "unknown" {
            if let Some(g) = p.content_str(&["foldprint", "git"]) {
                tool.git = g.to_string();
            }
        }
    }
    let environment = Environment {
        backend: backend.environment(),
        backend_init_ms: Some(cfg.backend_init_ms),
        host: crate::host::facts(),
        // E.g. how the host's CUDA driver was found, when the backend looked.
        platform: backend.platform_facts(),
        notes,
        provenance,
    };
    let mut report = Report {
        format: REPORT_FORMAT.into(),
        version: REPORT_VERSION,
        foldprint: tool,
        backend: backend.name().into(),
        nan_policy: cfg.nan_policy,
        environment,
        experiments: experiments.iter().map(ExperimentInfo::from).collect(),
        cases,
        skipped,
        groups,
        summary: Summary::default(),
    };
    report.summarize();
    Ok((report, dump))
}

/// Every rank's outcome of comparing its own shard with its own `expect`
/// file, rank order: this rank's computed here, the others' received (a
/// rank whose file could not be read is named with its reason).
fn own_expects(
    backend: &mut dyn Backend,
    case: &Case,
    rank: usize,
    file: &crate::addends::ExpectFile,
    shards: &[Vec<f32>],
    policy: NanPolicy,
) -> Result<Vec<ExpectOutcome>, RunError> {
    let mine: Result<ExpectOutcome, String> = if shards.len() == case.arenas().len() {
        let shards: Vec<&[f32]> = shards.iter().map(Vec::as_slice).collect();
        ExpectOutcome::compare(file, &shards, case.dtype(), policy).map_err(|e| e.to_string())
    } else {
        Err(format!(
            "the backend returned {} of {} shards to compare",
            shards.len(),
            case.arenas().len()
        ))
    };
    let bytes = serde_json::to_vec(&mine).map_err(|e| {
        RunError::Backend(crate::backend::infrastructure(
            case.id(),
            "expect",
            e.to_string(),
        ))
    })?;
    let all = backend.gather_bytes(case, &bytes)?;
    let mut outcomes = Vec::with_capacity(all.len());
    for (r, b) in all.iter().enumerate() {
        let got: Result<ExpectOutcome, String> = if r == rank {
            mine.clone()
        } else {
            serde_json::from_slice(b)
                .unwrap_or_else(|e| Err(format!("its outcome came back unreadable: {e}")))
        };
        outcomes.push(got.map_err(|message| {
            addends_error(case)(crate::addends::AddendError::Bad {
                path: format!("rank {r}'s expect file"),
                message,
            })
        })?);
    }
    Ok(outcomes)
}

fn addends_error(case: &Case) -> impl Fn(crate::addends::AddendError) -> RunError + '_ {
    move |e| RunError::Backend(crate::backend::addends_error(case)(e))
}

#[cfg(test)]
mod tests {
    /// ARCHITECTURE.md: the runner and the CPU oracle stand on no GPU code;
    /// GPU facts reach the report through `Backend::platform_facts`.
    #[test]
    fn a_cpu_run_touches_no_gpu_code() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
        // (Spelled in pieces, so that this test does not find itself.)
        let forbidden = [["gpu", "::"], ["host", "_driver"]];
        for file in ["src/runner.rs", "src/backend/cpu.rs"] {
            let text = std::fs::read_to_string(root.join(file)).unwrap();
            for (n, line) in text.lines().enumerate() {
                assert!(
                    !forbidden.iter().any(|w| line.contains(&w.concat())),
                    "{file}:{}: {line}",
                    n + 1
                );
            }
        }
    }
}
