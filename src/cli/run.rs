//! `foldprint run`: run experiments, print the table or the report.

use super::args::RunArgs;
use super::checks::check_outputs;
use super::progress::Live;
use super::run_common::{junit_of, start_threads};
use super::table;
use foldprint::exit::{ExitCode, Failure};
type Result<T, E = Failure> = std::result::Result<T, E>;

pub(super) fn run(a: RunArgs) -> Result<i32> {
    start_threads()?;
    let loaded = foldprint::run::load(a.common.run_options(a.dump.clone()))?;
    check_outputs(&a.common, &loaded.experiments, a.dump.as_deref(), &[])?;
    foldprint::interrupt::install();
    let mut live = Live::new(!a.common.json, a.common.nan_policy, &|_| Vec::new());
    let Some(mut run) = loaded.execute(&mut live)? else {
        return Ok(0);
    };
    let junit = junit_of(&a.common, &run.report, &[]);
    run.commit(junit)?;
    let report = run.report;
    if a.common.json {
        out!("{}", report.to_json());
    } else {
        // The banner and case rows were printed as the cases finished.
        table::print_tail(&report, a.common.out.as_deref(), a.dump.as_deref());
    }
    let failing = a.expect_gate.failing(&report);
    if !a.expect_gate.is_default() && !report.summary.differs_from_expect.is_empty() {
        // On stderr: `--json` keeps stdout one report.
        eprintln!(
            "expect gate `{}`: {}",
            a.expect_gate,
            match failing.len() {
                0 => "no gated case differs from its expect (exit 0 unless a check failed)".into(),
                n => format!(
                    "{n} gated case(s) differ from their expect: {}",
                    failing.join(", ")
                ),
            }
        );
    }
    Ok(ExitCode::verdict(report.summary.ok && failing.is_empty()).code())
}
