//! `foldprint run`: run experiments, print the table or the report.

use super::args::RunArgs;
use super::checks::check_outputs;
use super::run_common::{execute, junit_of, load, start_threads};
use super::table;
use foldprint::exit::{ExitCode, Failure};
type Result<T, E = Failure> = std::result::Result<T, E>;

pub(super) fn run(a: RunArgs) -> Result<i32> {
    start_threads()?;
    let exps = load(&a.common.paths, a.common.backend)?;
    check_outputs(&a.common, &exps, a.dump.as_deref(), &[])?;
    foldprint::interrupt::install();
    let stream = !a.common.json;
    let Some(mut run) = execute(&a.common, &exps, a.dump.as_deref(), stream)? else {
        return Ok(0);
    };
    let junit = junit_of(&a.common, &run.report, &[]);
    run.commit(&a.common, junit)?;
    let report = run.report;
    if a.common.json {
        out!("{}", report.to_json());
    } else {
        // The banner and case rows were printed as the cases finished.
        table::print_tail(&report, a.common.out.as_deref(), a.dump.as_deref());
    }
    Ok(ExitCode::verdict(report.passed()).code())
}
