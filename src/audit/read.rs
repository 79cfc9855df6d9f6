//! Reading a child's report (the typed [`Report`], checked on read): what
//! it loaded, which library versions, its own failures and notes for the
//! configuration's outcome; the digests, sensitivities and skips for the
//! comparison.

use super::matrix::Config;
use super::pins;
use super::result::{ConfigOutcome, Sens};
use crate::report::Report;
use std::collections::HashMap;

/// A case as reports name it: (experiment, id).
pub(super) type CaseId = (String, String);

/// What the comparison needs from one child's report.
#[derive(Default)]
pub(super) struct Digests {
    /// The configuration gave a report.
    pub ran: bool,
    pub cases: HashMap<CaseId, Vec<crate::digest::Sha256>>,
    pub sensitivity: HashMap<CaseId, Sens>,
    /// Cases the backend declined, with its reason.
    pub skipped: HashMap<CaseId, String>,
}

impl Digests {
    /// Every case and skip of `r`.
    pub fn of(r: &Report) -> Digests {
        let mut d = Digests {
            ran: true,
            ..Digests::default()
        };
        for case in &r.cases {
            let id = (case.experiment.clone(), case.id.clone());
            d.sensitivity.insert(
                id.clone(),
                Sens {
                    verdict: case.sensitivity.verdict.name().into(),
                    fraction: case.sensitivity.fraction,
                },
            );
            d.cases.insert(id, case.digests());
        }
        for s in &r.skipped {
            d.skipped
                .insert((s.experiment.clone(), s.id.clone()), s.reason.clone());
        }
        d
    }
}

/// First arena whose digest differs (a missing arena counts). Here, beside
/// the digests, so the comparison and the oracle's controls share it
/// without depending on each other.
pub(super) fn first_difference(
    base: &[crate::digest::Sha256],
    other: &[crate::digest::Sha256],
) -> Option<usize> {
    (0..base.len().max(other.len())).find(|&i| base.get(i) != other.get(i))
}

/// Fill `o` and `d` from configuration `c`'s report; nothing is filled
/// when its backend environment cannot be read.
pub(super) fn read_report(
    c: &Config,
    r: &Report,
    o: &mut ConfigOutcome,
    d: &mut Digests,
) -> Result<(), String> {
    let env = r.backend_environment();
    o.backend = Some(r.backend.clone());
    o.libraries = env.libraries.clone().unwrap_or_default();
    o.versions = env.versions();
    o.requested = c
        .requests()
        .into_iter()
        .map(|req| pins::check(req, &o.libraries, &r.backend))
        .collect();
    o.environment = Some(env.clone());
    o.run_failures = r.summary.failures.clone();
    o.notes = r.notes().to_vec();
    *d = Digests::of(r);
    o.cases = d.cases.len();
    o.skipped = d.skipped.len();
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn differences_are_located_by_arena() {
        let d = |s: &str| crate::digest::Sha256::of(s.as_bytes());
        let a = vec![d("x"), d("y")];
        assert_eq!(first_difference(&a, &a), None);
        assert_eq!(first_difference(&a, &[d("x"), d("z")]), Some(1));
        assert_eq!(first_difference(&a, &[d("x")]), Some(1));
    }
}
