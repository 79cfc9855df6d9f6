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

    pub fn read(path: &Path) -> Result<Golden, ReportError> {
        super::read_versioned(path, GOLDEN_FORMAT, GOLDEN_VERSION, "golden")
    }
}
