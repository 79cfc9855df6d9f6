//! Golden digests: the CPU oracle's arena digests per experiment, committed
//! under experiments/golden/ and checked by `verify`.

use super::{Report, ReportError};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

pub const GOLDEN_FORMAT: &str = "foldprint-golden";
pub const GOLDEN_VERSION: u32 = 1;

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct GoldenCase {
    pub key: String,
    pub id: String,
    pub arenas: Vec<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Golden {
    pub format: String,
    pub version: u32,
    pub experiment: String,
    pub nan_policy: String,
    pub produced_by: String,
    pub cases: Vec<GoldenCase>,
}

impl Golden {
    /// The golden for one experiment, taken from a run's report.
    pub fn from_report(report: &Report, experiment: &str) -> Golden {
        Golden {
            format: GOLDEN_FORMAT.into(),
            version: GOLDEN_VERSION,
            experiment: experiment.into(),
            nan_policy: report.nan_policy.clone(),
            produced_by: format!(
                "foldprint {} ({} backend)",
                report.foldprint.version, report.backend
            ),
            cases: report
                .cases
                .iter()
                .filter(|c| c.experiment == experiment)
                .map(|c| GoldenCase {
                    key: c.key.clone(),
                    id: c.id.clone(),
                    arenas: c.arenas.iter().map(|a| a.sha256.clone()).collect(),
                })
                .collect(),
        }
    }

    pub fn path_in(dir: &Path, experiment: &str) -> PathBuf {
        dir.join(format!("{experiment}.json"))
    }

    pub fn write(&self, path: &Path) -> Result<(), ReportError> {
        let mut s = serde_json::to_string_pretty(self).expect("golden serializes");
        s.push('\n');
        crate::atomic::write(path, s.as_bytes()).map_err(|source| ReportError::Write {
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
