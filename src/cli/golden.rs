//! `foldprint golden`: regenerate goldens from the CPU oracle.

use super::args::GoldenArgs;
use super::checks::{check_output, refuse_inputs};
use super::progress::Live;
use super::run_common::start_threads;
use super::table;
use foldprint::backend::BackendChoice;
use foldprint::exit::{Context, Failure};
use foldprint::report::Golden;
type Result<T, E = Failure> = std::result::Result<T, E>;

pub(super) fn run(a: GoldenArgs) -> Result<i32> {
    super::verify::golden_dir(&a.golden)?;
    start_threads()?;
    let mut opts = foldprint::run::Options::new(a.paths.clone(), BackendChoice::Cpu);
    opts.nan_policy = a.nan_policy;
    let loaded = foldprint::run::load(opts)?;
    let exps = &loaded.experiments;
    let inputs = foldprint::experiment::input_files(exps);
    for e in exps {
        refuse_inputs("--golden", &Golden::path_in(&a.golden, &e.name), &inputs)?;
        check_output("--golden", &Golden::path_in(&a.golden, &e.name)).or_else(|err| {
            // A golden directory that does not exist yet is made below.
            if a.golden.exists() {
                Err(err)
            } else {
                Ok(())
            }
        })?;
    }
    // A golden that does not parse may be a conflicted merge or another
    // tool's file: refuse, before running, rather than overwrite it unseen.
    let mut old = Vec::with_capacity(exps.len());
    for e in exps {
        let path = Golden::path_in(&a.golden, &e.name);
        old.push(if path.exists() {
            Some(Golden::read(&path).map_err(|err| {
                Failure::Refused(format!(
                    "{err}\nrefusing to overwrite {}: it is not a golden this foldprint reads; \
                         look at it, then fix or delete it",
                    path.display()
                ))
            })?)
        } else {
            None
        });
    }
    foldprint::interrupt::install();
    let mut quiet = Live::new(false, a.nan_policy, &|_| Vec::new());
    let report = loaded
        .execute(&mut quiet)?
        .context("goldens come from the CPU oracle")?
        .report;
    if !report.summary.ok {
        table::print_report(&report, None, None);
        return Err(Failure::CheckFailed(
            "the run failed its own checks; no goldens written".into(),
        ));
    }
    // A golden of no case would vouch for nothing: check every experiment
    // before writing any.
    let goldens: Vec<Golden> = exps
        .iter()
        .map(|e| Golden::from_report(&report, &e.name))
        .collect();
    for (e, g) in exps.iter().zip(&goldens) {
        if g.cases.is_empty() {
            return Err(Failure::CheckFailed(format!(
                    "{}: the CPU oracle skipped all {} case(s) of experiment `{}` ({}); no goldens written",
                    foldprint::report::NOTHING_CHECKED,
                    e.cases.len(),
                    e.name,
                    e.path.display()
                ),
            ));
        }
    }
    std::fs::create_dir_all(&a.golden)
        .with_context(|| format!("creating {}", a.golden.display()))?;
    for ((e, golden), old) in exps.iter().zip(&goldens).zip(&old) {
        let path = Golden::path_in(&a.golden, &e.name);
        golden.write(&path)?;
        let skipped = report
            .skipped
            .iter()
            .filter(|s| s.experiment == e.name)
            .count();
        outln!(
            "wrote {} ({} cases{})",
            path.display(),
            golden.cases.len(),
            if skipped == 0 {
                String::new()
            } else {
                format!("; {skipped} skipped by the CPU oracle, not pinned")
            }
        );
        let Some(old) = old else { continue };
        let mut changes = golden.changes_from(old);
        if old.experiment != golden.experiment {
            changes.insert(0, format!("it held experiment `{}`", old.experiment));
        }
        if !changes.is_empty() {
            eprintln!(
                "warning: {} changed: {}; review the difference before committing it",
                path.display(),
                changes.join(", ")
            );
        }
    }
    Ok(0)
}
