//! JUnit XML for CI dashboards: one testcase per case (ranks identical,
//! rounds identical, its `expect` and whatever the caller checked of it,
//! e.g. `verify`'s golden), one per case the backend skipped (a
//! `<skipped>` element with the reason) and one per invariance group.
//!
//! Written by hand rather than with `quick-junit`: that crate (0.8) pulls
//! in chrono, uuid, quick-xml, vte and a second major version of syn for
//! four element types, and drops control characters from names without a
//! trace, where this file writes them as `\u{7}` so an id stays findable.

use super::{CaseReport, Report};

/// XML-escaped, with control characters (which XML 1.0 cannot carry even
/// as references) written as `\u{7}`.
fn esc(s: &str) -> String {
    super::printable(s)
        .replace(['\n', '\t'], " ")
        .replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// The XML of `report`. `of_case` gives the failures the caller found in
/// a case (beyond the report's own); `extra_failures` are failures of no
/// one case, listed under a `run` testcase with the report's own.
pub fn junit(
    report: &Report,
    of_case: &dyn Fn(&CaseReport) -> Vec<String>,
    extra_failures: &[String],
) -> String {
    let mut cases = Vec::new();
    for c in &report.cases {
        let mut problems = Vec::new();
        if !c.ranks_identical {
            problems.push("ranks ended with different arenas".to_string());
        }
        if !c.rounds_identical {
            problems.push("rounds gave different digests".to_string());
        }
        if let Some(f) = c.expect.as_ref().and_then(|e| e.failure(&c.id)) {
            problems.push(f);
        }
        for f in of_case(c) {
            if !problems.contains(&f) {
                problems.push(f);
            }
        }
        let secs = c.timings.rounds.iter().map(|t| t.total_ms).sum::<f64>() / 1e3;
        let digests: Vec<String> = c.digests().iter().map(ToString::to_string).collect();
        cases.push((
            format!("{}.{}", c.experiment, c.id),
            c.key.clone(),
            secs,
            problems,
            digests.join(" "),
        ));
    }
    for g in &report.groups {
        let problems = if g.ok { vec![] } else { vec![g.note.clone()] };
        cases.push((
            format!("group.{}", g.contract),
            g.key.clone(),
            0.0,
            problems,
            g.note.clone(),
        ));
    }
    // Failures of no case or group (nothing checked, a stale golden) get a
    // testcase of their own: a dashboard must never show 0 tests, 0 failures
    // for a run that checked nothing.
    // The report's own failures of a case or group are its testcase's.
    let listed = |f: &str| {
        report
            .cases
            .iter()
            .any(|c| f.contains(&format!("case `{}`", c.id)))
            || f.starts_with("group ")
    };
    let rest: Vec<String> = report
        .summary
        .failures
        .iter()
        .filter(|f| !listed(f))
        .chain(extra_failures)
        .cloned()
        .collect();
    if !rest.is_empty() {
        cases.push((
            "run".to_string(),
            "verdict".to_string(),
            0.0,
            rest,
            String::new(),
        ));
    }
    let failures = cases.iter().filter(|c| !c.3.is_empty()).count();
    let skipped = report.skipped.len();
    let tests = cases.len() + skipped;
    let mut xml = String::from("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n");
    xml.push_str(&format!(
        "<testsuites name=\"foldprint\" tests=\"{tests}\" failures=\"{failures}\" skipped=\"{skipped}\">\n  <testsuite name=\"foldprint.{}\" tests=\"{tests}\" failures=\"{failures}\" skipped=\"{skipped}\">\n",
        esc(&report.backend),
    ));
    for (class, name, secs, problems, out) in &cases {
        xml.push_str(&format!(
            "    <testcase classname=\"{}\" name=\"{}\" time=\"{secs:.3}\">\n",
            esc(class),
            esc(name)
        ));
        for p in problems {
            xml.push_str(&format!("      <failure message=\"{}\"/>\n", esc(p)));
        }
        xml.push_str(&format!(
            "      <system-out>{}</system-out>\n    </testcase>\n",
            esc(out)
        ));
    }
    // A case the backend could not run is listed, never left out: a
    // dashboard counts it as skipped, with the reason.
    for c in &report.skipped {
        xml.push_str(&format!(
            "    <testcase classname=\"{}.{}\" name=\"{}\" time=\"0.000\">\n      <skipped message=\"{}\"/>\n    </testcase>\n",
            esc(&c.experiment),
            esc(&c.id),
            esc(&c.key),
            esc(&c.reason)
        ));
    }
    xml.push_str("  </testsuite>\n</testsuites>\n");
    xml
}
