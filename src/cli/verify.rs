//! `foldprint verify`: run experiments and check them against goldens.

use super::args::VerifyArgs;
use super::checks::check_outputs;
use super::run_common::{execute, junit_of, load, start_threads};
use super::table;
use foldprint::exit::{ExitCode, Failure};
use foldprint::report::{golden, Golden};
use std::path::PathBuf;
type Result<T, E = Failure> = std::result::Result<T, E>;

pub(super) fn run(a: VerifyArgs) -> Result<i32> {
    start_threads()?;
    let exps = load(&a.common.paths, a.common.backend)?;
    let golden_files: Vec<PathBuf> = exps
        .iter()
        .map(|e| Golden::path_in(&a.golden, &e.name))
        .collect();
    let golden_inputs: Vec<(String, PathBuf)> = golden_files
        .iter()
        .map(|g| ("the golden".to_string(), g.clone()))
        .collect();
    check_outputs(&a.common, &exps, None, &golden_inputs)?;
    // Read every golden before running anything: a missing one is known early.
    let goldens = golden::load(&exps, &a.golden, a.common.nan_policy)?;
    foldprint::interrupt::install();
    // Rows stream as cases finish, as for `run`, so a piped verify is not
    // silent until the end.
    let Some(mut run) = execute(&a.common, &exps, None, !a.common.json)? else {
        return Ok(0);
    };
    let mut problems: Vec<String> = golden::check(&goldens, &run.experiments, &run.report)
        .iter()
        .map(|p| p.to_string())
        .collect();
    problems.extend(run.report.summary.failures.iter().cloned());
    problems.extend(run.report.summary.differs_from_expect.iter().cloned());
    let junit = junit_of(&a.common, &run.report, &problems);
    run.commit(&a.common, junit)?;
    let report = run.report;
    if a.common.json {
        let v = serde_json::json!({ "ok": problems.is_empty(), "problems": problems, "report": report });
        outln!("{}", serde_json::to_string_pretty(&v)?);
    } else {
        table::print_tail(&report, a.common.out.as_deref(), None);
        table::print_verify(
            &goldens.iter().map(|g| g.path.clone()).collect::<Vec<_>>(),
            &report,
            &problems,
        );
    }
    Ok(ExitCode::verdict(problems.is_empty()).code())
}
