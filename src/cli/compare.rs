//! `foldprint compare`: reports (or dump directories) against the first.

use super::args::CompareArgs;
use super::table;
use foldprint::exit::{ExitCode, Failure};
type Result<T, E = Failure> = std::result::Result<T, E>;

pub(super) fn run(a: CompareArgs) -> Result<i32> {
    use foldprint::report::{compare_sources, localize, Source};
    if a.reports.iter().all(|p| p.is_dir()) {
        let mut ok = true;
        let mut all = Vec::new();
        for other in &a.reports[1..] {
            let cmp = localize::compare_dumps(&a.reports[0], other, 10)?;
            if !a.json {
                table::print_dump_comparison(&a.reports[0], other, &cmp);
            }
            // Two empty SHA256SUMS "agree" about nothing.
            let compared = cmp.identical + cmp.differing.len();
            ok &= compared > 0 && cmp.differing.is_empty() && cmp.unmatched.is_empty();
            let mut v = serde_json::to_value(&cmp)?;
            v["left"] = serde_json::json!(a.reports[0]);
            v["right"] = serde_json::json!(other);
            v["compared"] = serde_json::json!(compared);
            all.push(v);
        }
        if a.json {
            let v = serde_json::json!({ "ok": ok, "comparisons": all });
            outln!("{}", serde_json::to_string_pretty(&v)?);
        }
        return Ok(ExitCode::verdict(ok).code());
    }
    if let Some(dir) = a.reports.iter().find(|p| p.is_dir()) {
        let file = a.reports.iter().find(|p| !p.is_dir()).unwrap_or(dir);
        return Err(Failure::Refused(format!(
                "{} is a dump directory and {} is a report: compare reports with reports, dump directories with dump directories",
                dir.display(),
                file.display()
            ),
        ));
    }
    let mut sources = Vec::new();
    for p in &a.reports {
        sources.push((p.display().to_string(), Source::read(p)?));
    }
    for (path, s) in &sources {
        if let Source::Report(r) = s {
            if let Some(n) = table::not_a_gpu_result(r) {
                eprintln!("warning: {path}: {n}");
            }
        }
    }
    let cmp = compare_sources(&sources, a.allow_missing);
    if a.json {
        let v = serde_json::json!({
            "compared": cmp.compared,
            "ok": cmp.ok(),
            "mismatches": cmp.mismatches.iter().map(|m| m.to_string()).collect::<Vec<_>>(),
        });
        outln!("{}", serde_json::to_string_pretty(&v)?);
    } else {
        table::print_comparison(&sources, &cmp);
    }
    Ok(ExitCode::verdict(cmp.ok()).code())
}
