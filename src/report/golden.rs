//! Golden digests: the CPU oracle's arena digests per experiment, committed
//! under experiments/golden/ and checked by `verify`. Besides each arena's
//! SHA-256 a golden pins its chunk digests and chunk root (docs/SPEC.md §5)
//! and the case's order sensitivity (§7); those fields are optional, so a
//! golden written before them still reads and verifies its digests.

use super::{CaseReport, Report, ReportError};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

pub const GOLDEN_FORMAT: &str = "foldprint-golden";
pub const GOLDEN_VERSION: u32 = 1;

/// The part of a case's order sensitivity that a golden pins: the counts
/// and the sample (fraction and verdict follow from them).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct GoldenSensitivity {
    pub changed: u64,
    pub checked: u64,
    pub sample: String,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct GoldenCase {
    pub key: String,
    pub id: String,
    /// SHA-256 of each reduced arena.
    pub arenas: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sensitivity: Option<GoldenSensitivity>,
    /// Per arena: SHA-256 of its concatenated raw chunk digests.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub chunk_root: Vec<String>,
    /// Per arena: the SHA-256 of each `chunk_elems`-element chunk.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub chunk_sha256: Vec<Vec<String>>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Golden {
    pub format: String,
    pub version: u32,
    pub experiment: String,
    pub nan_policy: String,
    pub produced_by: String,
    /// Elements per chunk of `chunk_sha256`; 0 when the golden has no chunks.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub chunk_elems: usize,
    pub cases: Vec<GoldenCase>,
}

fn is_zero(n: &usize) -> bool {
    *n == 0
}

impl Golden {
    /// The golden for one experiment, taken from a run's report.
    pub fn from_report(report: &Report, experiment: &str) -> Golden {
        let cases: Vec<&CaseReport> = report
            .cases
            .iter()
            .filter(|c| c.experiment == experiment)
            .collect();
        Golden {
            format: GOLDEN_FORMAT.into(),
            version: GOLDEN_VERSION,
            experiment: experiment.into(),
            nan_policy: report.nan_policy.clone(),
            produced_by: format!(
                "foldprint {} ({} backend)",
                report.foldprint.version, report.backend
            ),
            chunk_elems: cases
                .iter()
                .flat_map(|c| &c.arenas)
                .map(|a| a.chunk_elems)
                .next()
                .unwrap_or(crate::digest::CHUNK_ELEMS),
            cases: cases
                .iter()
                .map(|c| GoldenCase {
                    key: c.key.clone(),
                    id: c.id.clone(),
                    arenas: c.arenas.iter().map(|a| a.sha256.clone()).collect(),
                    sensitivity: Some(GoldenSensitivity {
                        changed: c.sensitivity.changed,
                        checked: c.sensitivity.checked,
                        sample: c.sensitivity.sample.clone(),
                    }),
                    chunk_root: c.arenas.iter().map(|a| a.chunk_root.clone()).collect(),
                    chunk_sha256: c.arenas.iter().map(|a| a.chunk_sha256.clone()).collect(),
                })
                .collect(),
        }
    }

    /// What a run's case contradicts in this golden's entry beyond the
    /// arena digests (which `verify` compares itself): chunk size, chunk
    /// roots, chunk digests and order sensitivity, each where the golden
    /// records it. One line per disagreement.
    pub fn mismatches_beyond_digests(&self, want: &GoldenCase, got: &CaseReport) -> Vec<String> {
        let mut out = Vec::new();
        let at = |i: usize| format!("case `{}` ({}) arena {i}", got.id, got.key);
        let chunked = !want.chunk_root.is_empty() || !want.chunk_sha256.is_empty();
        if chunked {
            for (i, a) in got.arenas.iter().enumerate() {
                if a.chunk_elems != self.chunk_elems {
                    out.push(format!(
                        "{}: chunks of {} elements, golden has {}",
                        at(i),
                        a.chunk_elems,
                        self.chunk_elems
                    ));
                    continue;
                }
                match want.chunk_root.get(i) {
                    Some(root) if *root != a.chunk_root => out.push(format!(
                        "{}: chunk root {} but golden says {root}",
                        at(i),
                        a.chunk_root
                    )),
                    None => out.push(format!("{}: golden has no chunk root", at(i))),
                    _ => {}
                }
                match want.chunk_sha256.get(i) {
                    Some(chunks) => {
                        let differing: Vec<usize> = (0..chunks.len().max(a.chunk_sha256.len()))
                            .filter(|&k| chunks.get(k) != a.chunk_sha256.get(k))
                            .collect();
                        if let Some(&first) = differing.first() {
                            out.push(format!(
                                "{}: {} of {} chunk digests differ from the golden's {} (first: chunk {first})",
                                at(i),
                                differing.len(),
                                a.chunk_sha256.len(),
                                chunks.len()
                            ));
                        }
                    }
                    None => out.push(format!("{}: golden has no chunk digests", at(i))),
                }
            }
        }
        if let Some(s) = &want.sensitivity {
            let g = &got.sensitivity;
            if (g.changed, g.checked, g.sample.as_str())
                != (s.changed, s.checked, s.sample.as_str())
            {
                out.push(format!(
                    "case `{}` ({}): order sensitivity {} of {} changed ({}) but golden says {} of {} ({})",
                    got.id, got.key, g.changed, g.checked, g.sample, s.changed, s.checked, s.sample
                ));
            }
        }
        out
    }

    pub fn path_in(dir: &Path, experiment: &str) -> PathBuf {
        dir.join(format!("{experiment}.json"))
    }

    /// The golden as its file holds it: pretty JSON and a final newline.
    pub fn to_json(&self) -> String {
        let mut s = serde_json::to_string_pretty(self).expect("golden serializes");
        s.push('\n');
        s
    }

    pub fn write(&self, path: &Path) -> Result<(), ReportError> {
        crate::atomic::write(path, self.to_json().as_bytes()).map_err(|source| ReportError::Write {
            path: path.to_path_buf(),
            source,
        })
    }

    /// Read a golden, refusing malformed digests and duplicate case keys.
    pub fn read(path: &Path) -> Result<Golden, ReportError> {
        let g: Golden = super::read_versioned(path, GOLDEN_FORMAT, GOLDEN_VERSION, "golden")?;
        let problems = g.problems();
        if !problems.is_empty() {
            return Err(ReportError::Inconsistent {
                path: path.to_path_buf(),
                what: "golden",
                problems,
            });
        }
        Ok(g)
    }

    /// Malformed digests and repeated case keys, in words.
    pub fn problems(&self) -> Vec<String> {
        let mut out = Vec::new();
        let mut seen = std::collections::HashMap::new();
        for c in &self.cases {
            if let Some(first) = seen.insert(c.key.as_str(), c.id.as_str()) {
                out.push(format!(
                    "case key {} appears twice (cases `{first}` and `{}`)",
                    c.key, c.id
                ));
            }
            for (i, d) in c.arenas.iter().enumerate() {
                if !super::check::is_digest(d) {
                    out.push(format!(
                        "case `{}` arena {i}: `{d}` is not a SHA-256 digest",
                        c.id
                    ));
                }
            }
        }
        out
    }
}
