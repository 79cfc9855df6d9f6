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
    let failures = report.check_failures();
    let mut cases = Vec::new();
    for (i, c) in report.cases.iter().enumerate() {
        let mut problems: Vec<String> = failures
            .iter()
            .filter(|f| f.case().is_some_and(|at| at.index == i))
            .filter_map(|f| f.in_case())
            .collect();
        for f in c
            .expect_outcomes()
            .filter_map(|e| e.failure(&c.id, c.params.dtype.unwrap_or_default()))
        {
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
    // for a run that checked nothing. The report's own failures of a case
    // or group are its testcase's.
    let rest: Vec<String> = failures
        .iter()
        .filter(|f| f.of_the_run())
        .map(ToString::to_string)
        .chain(extra_failures.iter().cloned())
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::cpu::CpuBackend;
    use crate::report::RankDiff;
    use crate::runner::{run_staged, RunConfig};
    use std::path::Path;

    /// Two experiments with a case `a` each, the second's ranks and rounds
    /// made to differ: its failures are its testcase's (by its place in
    /// the report, not by its id, which the first shares), in the words
    /// `summary.failures` gives them.
    #[test]
    fn a_cases_failures_go_to_its_own_testcase() {
        let exp = |name: &str| {
            let text =
                format!("name = \"{name}\"\n[[case]]\nid = \"a\"\nworld = 3\narenas = [5]\n");
            crate::experiment::parse(Path::new("e.toml"), &text).unwrap()
        };
        let cfg = RunConfig {
            nan_policy: crate::digest::NanPolicy::Canonical,
            dump: None,
            notes: vec![],
            backend_init_ms: 0.0,
        };
        let (mut r, _) = run_staged(
            &[exp("e1"), exp("e2")],
            &mut CpuBackend::new(),
            &cfg,
            &mut (),
        )
        .unwrap();
        assert!(r.summary.ok);
        let broken = &mut r.cases[1];
        broken.ranks_identical = false;
        broken.rounds_identical = false;
        broken.arenas[0].rank_differing_chunks = vec![RankDiff {
            rank: 2,
            chunks: vec![0],
        }];
        r.summarize();
        assert_eq!(
            r.summary.failures,
            [
                "case `a`: ranks ended with different arenas".to_string(),
                format!(
                    "case `a` arena 0: rank 2's copy differs from rank 0's in 1 chunk(s) of {} elements: 0",
                    r.cases[1].arenas[0].chunk_elems
                ),
                "case `a`: rounds gave different digests".to_string(),
            ]
        );
        let xml = junit(&r, &|_| Vec::new(), &[]);
        let testcases: Vec<&str> = xml.split("<testcase ").skip(1).collect();
        assert!(testcases[0].starts_with("classname=\"e1.a\""), "{xml}");
        assert!(!testcases[0].contains("<failure"), "{xml}");
        assert!(testcases[1].starts_with("classname=\"e2.a\""), "{xml}");
        assert_eq!(
            testcases[1].matches("<failure").count(),
            2,
            "ranks and rounds, the chunks being the ranks' detail: {xml}"
        );
        assert!(
            testcases[1].contains("<failure message=\"ranks ended with different arenas\"/>"),
            "{xml}"
        );
        // No failure is left over for a `run` testcase.
        assert!(!xml.contains("classname=\"run\""), "{xml}");
        assert!(xml.contains("tests=\"2\" failures=\"1\""), "{xml}");
    }
}
