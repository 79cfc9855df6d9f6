//! `foldprint verify`: run experiments and check them against goldens.

use super::args::VerifyArgs;
use super::checks::check_outputs;
use super::progress::Live;
use super::run_common::start_threads;
use super::table;
use foldprint::exit::{ExitCode, Failure};
use foldprint::report::{golden, Golden};
use std::path::{Path, PathBuf};
type Result<T, E = Failure> = std::result::Result<T, E>;

/// `--golden` names the directory of goldens; a file there is a usage
/// error, whose hint says what the flag takes.
pub(super) fn golden_dir(dir: &Path) -> Result<()> {
    match std::fs::metadata(dir) {
        Ok(m) if !m.is_dir() => Err(Failure::Refused(format!(
            "--golden {0} is not a directory: --golden takes the directory of goldens, \
             one <experiment>.json each (e.g. --golden experiments/golden); to check a report \
             against one golden file, use `foldprint compare REPORT {0}`",
            dir.display()
        ))),
        _ => Ok(()),
    }
}

pub(super) fn run(a: VerifyArgs) -> Result<i32> {
    golden_dir(&a.golden)?;
    start_threads()?;
    let loaded = foldprint::run::load(a.common.run_options(None))?;
    let exps = &loaded.experiments;
    let golden_files: Vec<PathBuf> = exps
        .iter()
        .map(|e| Golden::path_in(&a.golden, &e.name))
        .collect();
    let golden_inputs: Vec<(String, PathBuf)> = golden_files
        .iter()
        .map(|g| ("the golden".to_string(), g.clone()))
        .collect();
    check_outputs(&a.common, exps, None, &golden_inputs)?;
    // Read every golden before running anything: a missing one is known early.
    let goldens = golden::load(exps, &a.golden, a.common.nan_policy)?;
    foldprint::interrupt::install();
    // Rows stream as cases finish, as for `run`, so a piped verify is not
    // silent until the end; each case is compared with its golden as it
    // finishes, so its row says whether it matched.
    let judge = |c: &foldprint::report::CaseReport| {
        golden::case_problems(&goldens, c)
            .iter()
            .map(|p| p.in_case())
            .collect()
    };
    let mut live = Live::new(!a.common.json, a.common.nan_policy, &judge);
    let Some(mut run) = loaded.execute(&mut live)? else {
        return Ok(0);
    };
    let against_golden: Vec<String> = golden::check(&goldens, &run.experiments, &run.report)
        .iter()
        .map(|p| p.to_string())
        .collect();
    let mut problems = against_golden.clone();
    problems.extend(run.report.summary.failures.iter().cloned());
    problems.extend(run.report.summary.differs_from_expect.iter().cloned());
    let junit = a.common.junit.as_ref().map(|_| {
        let of_case = |c: &foldprint::report::CaseReport| {
            golden::case_problems(&goldens, c)
                .iter()
                .map(|p| p.to_string())
                .collect()
        };
        let rest: Vec<String> = golden::run_problems(&goldens, &run.experiments, &run.report)
            .iter()
            .map(|p| p.to_string())
            .collect();
        foldprint::report::junit(&run.report, &of_case, &rest)
    });
    run.commit(junit)?;
    let report = run.report;
    if a.common.json {
        let v = serde_json::json!({ "ok": problems.is_empty(), "problems": problems, "report": report });
        outln!("{}", serde_json::to_string_pretty(&v)?);
    } else {
        table::print_tail_judged(&report, a.common.out.as_deref(), None, against_golden.len());
        table::print_verify(
            &goldens.iter().map(|g| g.path.clone()).collect::<Vec<_>>(),
            &report,
            &problems,
        );
    }
    Ok(ExitCode::verdict(problems.is_empty()).code())
}
