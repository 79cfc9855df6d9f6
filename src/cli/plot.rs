//! `foldprint plot`: the ULP distances of a report's `expect` differences,
//! or of two dump directories, drawn as an SVG.

use super::args::PlotArgs;
use super::checks::{check_output, inside, refuse_same};
use foldprint::exit::{Context, Failure};
use foldprint::report::{localize, plot, Report};
type Result<T, E = Failure> = std::result::Result<T, E>;

pub(super) fn run(a: PlotArgs) -> Result<i32> {
    check_output("--out", &a.out)?;
    for p in &a.inputs {
        refuse_same("--out", &a.out, "an input", p)?;
        // A file added to a dump directory makes it unreadable as one.
        if p.is_dir() && inside(&a.out, p) {
            return Err(Failure::Refused(format!(
                "--out {} is inside the dump directory {}; refusing to write there",
                a.out.display(),
                p.display()
            )));
        }
    }
    let refused = |e: plot::PlotError| Failure::Refused(e.to_string());
    let (heading, panels) = match a.inputs.as_slice() {
        [report] if !report.is_dir() => {
            let r = Report::read(report)?;
            if r.cases.iter().all(|c| c.expect_outcomes().next().is_none()) {
                return Err(Failure::Refused(format!(
                    "{}: no case names an `expect` file, so there is no element-level difference to draw; \
                     to see where two runs differ, run both with --dump and plot the two dump directories",
                    report.display()
                )));
            }
            let heading = format!("{}: each case against its expect file", report.display());
            (heading, plot::report_panels(&r).map_err(refused)?)
        }
        [left, right] if left.is_dir() && right.is_dir() => {
            let cmp = localize::compare_dumps(left, right, 0)?;
            if cmp.identical + cmp.differing.len() == 0 {
                return Err(Failure::Refused(format!(
                    "{} and {} share no dump file: nothing to draw",
                    left.display(),
                    right.display()
                )));
            }
            for u in &cmp.unmatched {
                eprintln!("warning: {u}: not drawn");
            }
            let heading = format!("{} against {}", right.display(), left.display());
            (heading, plot::dump_panels(&cmp))
        }
        _ => {
            return Err(Failure::Refused(
                "plot takes one report (its cases' expect differences) or two --dump directories; \
                 two reports hold digests, not elements: run both with --dump and plot the directories"
                    .into(),
            ))
        }
    };
    let svg = plot::svg(&heading, &panels).map_err(refused)?;
    foldprint::atomic_write(&a.out, svg.as_bytes())
        .with_context(|| format!("{}: cannot write", a.out.display()))?;
    if panels.is_empty() {
        outln!("wrote {} (no differences)", a.out.display());
    } else {
        outln!("wrote {} ({} panel(s))", a.out.display(), panels.len());
    }
    Ok(0)
}
