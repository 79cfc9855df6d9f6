//! Reports: the versioned JSON a run writes, read back for `compare` and
//! `verify`. Cases are keyed by [`Case::key`], which depends on the numeric
//! parameters only, so reports from different machines line up.

pub mod attest;
pub mod check;
mod check_params;
mod compare;
pub mod expect;
pub mod golden;
mod groups;
mod json;
mod junit;
pub mod localize;
pub mod plot;

pub use compare::{compare, compare_sources, Comparison, Mismatch, Source};
pub use golden::{Golden, GoldenCase, GoldenError, GoldenFile, GoldenProblem, GOLDEN_FORMAT};
pub use groups::{build_groups, Expect, Group, GroupVerdict};
pub use junit::junit;

use crate::experiment::{Case, CaseParams, Experiment};
use crate::result::{ReducedArena, RoundTimings};
use crate::sensitivity::Sensitivity;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// `s` with control characters (other than newline and tab) written as
/// `\u{1b}`, so that an id cannot move a terminal's cursor or break XML.
pub fn printable(s: &str) -> std::borrow::Cow<'_, str> {
    let bad = |c: char| c.is_control() && c != '\n' && c != '\t';
    if !s.chars().any(bad) {
        return std::borrow::Cow::Borrowed(s);
    }
    std::borrow::Cow::Owned(
        s.chars()
            .map(|c| {
                if bad(c) {
                    format!("\\u{{{:x}}}", c as u32)
                } else {
                    c.to_string()
                }
            })
            .collect(),
    )
}

pub const REPORT_FORMAT: &str = "foldprint-report";
pub const REPORT_VERSION: u32 = 1;

#[derive(Debug, thiserror::Error)]
pub enum ReportError {
    #[error("{path}: cannot read: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: not a foldprint report: {message}")]
    Malformed { path: PathBuf, message: String },
    #[error(
        "{path}: {what} version {found} is not supported (this foldprint reads version {expected})"
    )]
    Version {
        path: PathBuf,
        what: &'static str,
        found: u64,
        expected: u32,
    },
    #[error("{path}: inconsistent {what}, refusing to trust it: {}", problems.join("; "))]
    Inconsistent {
        path: PathBuf,
        what: &'static str,
        problems: Vec<String>,
    },
    /// A dump directory whose files, SHA256SUMS or sizes do not agree.
    #[error("{path}: {message}")]
    Dump { path: PathBuf, message: String },
    #[error("{path}: cannot write: {source}")]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

use crate::digest::Sha256;

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Report {
    pub format: String,
    pub version: u32,
    pub foldprint: ToolInfo,
    pub backend: String,
    pub nan_policy: crate::digest::NanPolicy,
    pub environment: crate::environment::Environment,
    pub experiments: Vec<ExperimentInfo>,
    pub cases: Vec<CaseReport>,
    /// Cases this backend could not run, with the reason (never silent).
    #[serde(default)]
    pub skipped: Vec<SkippedCase>,
    pub groups: Vec<Group>,
    pub summary: Summary,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SkippedCase {
    pub key: String,
    pub experiment: String,
    pub id: String,
    pub reason: String,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ToolInfo {
    pub version: String,
    pub git: String,
}

impl ToolInfo {
    pub fn current() -> Self {
        ToolInfo {
            version: env!("CARGO_PKG_VERSION").into(),
            git: option_env!("FOLDPRINT_GIT_REV").unwrap_or("unknown").into(),
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ExperimentInfo {
    pub name: String,
    pub path: String,
    pub sha256: Sha256,
    pub description: String,
    pub cases: usize,
}

impl From<&Experiment> for ExperimentInfo {
    fn from(e: &Experiment) -> Self {
        ExperimentInfo {
            name: e.name.clone(),
            path: e.path.display().to_string(),
            sha256: e.sha256,
            description: e.description.clone(),
            cases: e.cases.len(),
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ArenaReport {
    pub index: usize,
    pub len: usize,
    /// SHA-256 of the reduced arena (rank 0's copy; equal on every rank when
    /// `ranks_identical`); of a reduce-scatter, of the shards concatenated
    /// in rank order.
    pub sha256: Sha256,
    pub ranks_identical: bool,
    /// Each rank's copy; empty for a reduce-scatter (no rank holds one).
    pub rank_sha256: Vec<Sha256>,
    /// A reduce-scatter's shard digests, rank r's shard r in rank order;
    /// absent for an all-reduce.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub shard_sha256: Vec<Sha256>,
    /// Localization: SHA-256 of each `chunk_elems`-element chunk of rank
    /// 0's hashed bytes, and of their concatenation (`chunk_root`).
    #[serde(default)]
    pub chunk_elems: usize,
    #[serde(default)]
    pub chunk_sha256: Vec<Sha256>,
    pub chunk_root: Sha256,
    /// Ranks whose copy differs from rank 0's, with the differing chunk
    /// indices; absent when every copy agrees.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub rank_differing_chunks: Vec<RankDiff>,
}

/// One rank's copy that differs from rank 0's, and where.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RankDiff {
    pub rank: usize,
    pub chunks: Vec<usize>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CaseReport {
    pub key: String,
    pub group: String,
    pub experiment: String,
    pub id: String,
    pub params: CaseParams,
    pub arenas: Vec<ArenaReport>,
    pub ranks_identical: bool,
    pub rounds_identical: bool,
    pub sensitivity: Sensitivity,
    pub timings: Timings,
    /// The framework result the case names (`expect`), compared.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expect: Option<expect::ExpectOutcome>,
    /// A reduce-scatter's per-rank `expect` files, rank order, each
    /// compared with that rank's shard (element indices within the shard).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub expect_ranks: Vec<expect::ExpectOutcome>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Timings {
    pub rounds: Vec<RoundTimings>,
    pub addend_bytes: u64,
    /// Addend bytes over the fastest round's generate + reduce time.
    pub fold_gb_per_s: f64,
    /// Host time of the order-sensitivity measure (not part of a round).
    #[serde(default)]
    pub sensitivity_ms: f64,
}

impl CaseReport {
    /// Every `expect` comparison of the case: the one file, or each rank's.
    pub fn expect_outcomes(&self) -> impl Iterator<Item = &expect::ExpectOutcome> {
        self.expect.iter().chain(&self.expect_ranks)
    }

    pub fn new(
        case: &Case,
        arenas: &[ReducedArena],
        rounds: Vec<RoundTimings>,
        rounds_identical: bool,
        sensitivity: Sensitivity,
    ) -> Self {
        let arenas: Vec<ArenaReport> = arenas
            .iter()
            .enumerate()
            .map(|(i, a)| ArenaReport {
                index: i,
                len: a.len,
                sha256: a.digest(),
                ranks_identical: a.ranks_identical(),
                rank_sha256: a.rank_digests.clone(),
                shard_sha256: a.shard_digests().to_vec(),
                chunk_elems: crate::digest::CHUNK_ELEMS,
                chunk_root: crate::digest::chunk_root(&a.chunks),
                chunk_sha256: a.chunks.clone(),
                rank_differing_chunks: a
                    .differing
                    .iter()
                    .map(|(rank, chunks)| RankDiff {
                        rank: *rank,
                        chunks: chunks.clone(),
                    })
                    .collect(),
            })
            .collect();
        let best = rounds
            .iter()
            .map(|r| r.generate_ms + r.reduce_ms)
            .fold(f64::INFINITY, f64::min);
        let bytes = case.addend_bytes();
        CaseReport {
            key: case.key(),
            group: case.group_key(),
            experiment: case.experiment().to_string(),
            id: case.id().to_string(),
            params: case.params(),
            ranks_identical: arenas.iter().all(|a| a.ranks_identical),
            arenas,
            rounds_identical,
            sensitivity,
            timings: Timings {
                rounds,
                addend_bytes: bytes,
                sensitivity_ms: 0.0,
                fold_gb_per_s: if best > 0.0 && best.is_finite() {
                    bytes as f64 / best / 1e6
                } else {
                    0.0
                },
            },
            expect: None,
            expect_ranks: Vec::new(),
        }
    }

    /// The arena digests that identify this case's result.
    pub fn digests(&self) -> Vec<Sha256> {
        self.arenas.iter().map(|a| a.sha256).collect()
    }
}

#[derive(Debug, Clone, Serialize, Deserialize, Default)]
pub struct Summary {
    pub cases: usize,
    #[serde(default)]
    pub skipped: usize,
    pub groups: usize,
    /// Human-readable reasons this run failed its own checks.
    pub failures: Vec<String>,
    pub ok: bool,
    /// Cases whose result differs from the framework result they name
    /// (`expect`): a finding about that framework, not a failed check of
    /// this run, whose digests stay good to compare.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub differs_from_expect: Vec<String>,
}

/// The words every "nothing was checked" verdict starts with.
pub const NOTHING_CHECKED: &str = "nothing was checked";

/// A check a run failed, typed: whose it is (a case, by its place in
/// `Report::cases`, a group, or the run) and what failed. Its `Display` is
/// its line in `summary.failures`; JUnit files each under its testcase.
#[derive(Debug, Clone, Copy)]
pub enum CheckFailure<'r> {
    /// The ranks of case `case` ended with different arenas.
    RanksDiffer { case: CaseAt<'r> },
    /// Where one rank's copy of an arena differs from rank 0's: the
    /// detail of [`CheckFailure::RanksDiffer`].
    RankChunks {
        case: CaseAt<'r>,
        arena: usize,
        chunk_elems: usize,
        diff: &'r RankDiff,
    },
    /// The rounds of case `case` gave different digests.
    RoundsDiffer { case: CaseAt<'r> },
    /// An invariance group's verdict failed.
    Group { key: &'r str, note: &'r str },
    /// The run holds no case: every one skipped, or none declared.
    NothingChecked { skipped: &'r [SkippedCase] },
}

/// A case of a report: its place in `Report::cases` and its id.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CaseAt<'r> {
    pub index: usize,
    pub id: &'r str,
}

impl CheckFailure<'_> {
    /// The case it is a failure of, if it is one case's.
    pub fn case(&self) -> Option<CaseAt<'_>> {
        match *self {
            CheckFailure::RanksDiffer { case }
            | CheckFailure::RankChunks { case, .. }
            | CheckFailure::RoundsDiffer { case } => Some(case),
            CheckFailure::Group { .. } | CheckFailure::NothingChecked { .. } => None,
        }
    }

    /// Whether it is the run's, no one case's or group's.
    pub fn of_the_run(&self) -> bool {
        match self {
            CheckFailure::NothingChecked { .. } => true,
            CheckFailure::RanksDiffer { .. }
            | CheckFailure::RankChunks { .. }
            | CheckFailure::RoundsDiffer { .. }
            | CheckFailure::Group { .. } => false,
        }
    }

    /// The failure as a line of its case's testcase (the case named by
    /// the testcase itself); `None` where it adds nothing to another line
    /// there, or is no case's.
    pub fn in_case(&self) -> Option<String> {
        match self {
            CheckFailure::RanksDiffer { .. } => Some("ranks ended with different arenas".into()),
            CheckFailure::RoundsDiffer { .. } => Some("rounds gave different digests".into()),
            // The chunks say where the ranks differ, which fails the
            // testcase already.
            CheckFailure::RankChunks { .. }
            | CheckFailure::Group { .. }
            | CheckFailure::NothingChecked { .. } => None,
        }
    }
}

impl std::fmt::Display for CheckFailure<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match *self {
            CheckFailure::RanksDiffer { case } => {
                write!(f, "case `{}`: ranks ended with different arenas", case.id)
            }
            CheckFailure::RankChunks {
                case,
                arena,
                chunk_elems,
                diff,
            } => {
                let shown: Vec<String> =
                    diff.chunks.iter().take(8).map(|k| k.to_string()).collect();
                write!(
                    f,
                    "case `{}` arena {arena}: rank {}'s copy differs from rank 0's in {} chunk(s) of {chunk_elems} elements: {}{}",
                    case.id,
                    diff.rank,
                    diff.chunks.len(),
                    shown.join(", "),
                    if diff.chunks.len() > 8 { ", ..." } else { "" }
                )
            }
            CheckFailure::RoundsDiffer { case } => {
                write!(f, "case `{}`: rounds gave different digests", case.id)
            }
            CheckFailure::Group { key, note } => write!(f, "group {key}: {note}"),
            CheckFailure::NothingChecked { skipped } => match skipped.first() {
                None => write!(f, "{NOTHING_CHECKED}: the run holds no case"),
                Some(first) => write!(
                    f,
                    "{NOTHING_CHECKED}: the backend skipped all {} case(s) (e.g. `{}`: {})",
                    skipped.len(),
                    first.id,
                    first.reason
                ),
            },
        }
    }
}

impl Report {
    /// Every check this run failed, in the order `summary.failures` lists
    /// them: the cases' (ranks, the chunks where they differ, rounds),
    /// then the groups', then the run's.
    pub fn check_failures(&self) -> Vec<CheckFailure<'_>> {
        let mut failures = Vec::new();
        for (index, c) in self.cases.iter().enumerate() {
            let case = CaseAt { index, id: &c.id };
            if !c.ranks_identical {
                failures.push(CheckFailure::RanksDiffer { case });
            }
            for (arena, a) in c.arenas.iter().enumerate() {
                for diff in &a.rank_differing_chunks {
                    failures.push(CheckFailure::RankChunks {
                        case,
                        arena,
                        chunk_elems: a.chunk_elems,
                        diff,
                    });
                }
            }
            if !c.rounds_identical {
                failures.push(CheckFailure::RoundsDiffer { case });
            }
        }
        for g in &self.groups {
            if !g.ok {
                failures.push(CheckFailure::Group {
                    key: &g.key,
                    note: &g.note,
                });
            }
        }
        // A run that compared nothing must never read as a pass.
        if self.cases.is_empty() {
            failures.push(CheckFailure::NothingChecked {
                skipped: &self.skipped,
            });
        }
        failures
    }

    pub fn summarize(&mut self) {
        let failures: Vec<String> = self
            .check_failures()
            .iter()
            .map(ToString::to_string)
            .collect();
        let differs_from_expect = self
            .cases
            .iter()
            .flat_map(|c| {
                c.expect_outcomes()
                    .filter_map(|e| e.failure(&c.id, c.params.dtype.unwrap_or_default()))
            })
            .collect();
        self.summary = Summary {
            cases: self.cases.len(),
            skipped: self.skipped.len(),
            groups: self.groups.len(),
            ok: failures.is_empty(),
            failures,
            differs_from_expect,
        };
    }

    /// Every check held and every `expect` was met: what exit code 0 says.
    pub fn passed(&self) -> bool {
        self.summary.ok && self.summary.differs_from_expect.is_empty()
    }

    pub fn to_json(&self) -> String {
        let mut s = serde_json::to_string_pretty(self).expect("report serializes");
        s.push('\n');
        s
    }

    pub fn write(&self, path: &Path) -> Result<(), ReportError> {
        crate::atomic::write(path, self.to_json().as_bytes()).map_err(|source| ReportError::Write {
            path: path.to_path_buf(),
            source,
        })
    }

    /// Read a report, checking its format marker and version first so a
    /// wrong file gets a precise message rather than a field error.
    /// The report is checked for internal consistency
    /// ([`check::problems`]): an inconsistent one is an error.
    pub fn read(path: &Path) -> Result<Report, ReportError> {
        let r: Report = read_versioned(path, REPORT_FORMAT, REPORT_VERSION, "report")?;
        let problems = check::problems(&r);
        if !problems.is_empty() {
            return Err(ReportError::Inconsistent {
                path: path.to_path_buf(),
                what: "report",
                problems,
            });
        }
        Ok(r)
    }
}

/// Read a JSON file of ours, checking its `format` marker and `version`
/// before its fields, so a wrong file gets a precise message.
pub(crate) fn read_versioned<T: serde::de::DeserializeOwned>(
    path: &Path,
    format: &str,
    version: u32,
    what: &'static str,
) -> Result<T, ReportError> {
    let bytes =
        crate::input::read_capped(path, crate::input::MAX_REPORT_BYTES).map_err(|source| {
            ReportError::Io {
                path: path.to_path_buf(),
                source,
            }
        })?;
    let text = String::from_utf8(bytes).map_err(|e| ReportError::Malformed {
        path: path.to_path_buf(),
        message: {
            let (line, column, m) = crate::experiment::utf8_where(e.as_bytes(), &e.utf8_error());
            format!("{m}, line {line} column {column}")
        },
    })?;
    let malformed = |message: String| ReportError::Malformed {
        path: path.to_path_buf(),
        message,
    };
    let value = json::parse_strict(&text).map_err(|e| {
        if json::is_duplicate_key(&e) {
            ReportError::Inconsistent {
                path: path.to_path_buf(),
                what,
                problems: vec![e.to_string()],
            }
        } else {
            malformed(format!("invalid JSON: {e}"))
        }
    })?;
    match value.get("format").and_then(|f| f.as_str()) {
        Some(f) if f == format => {}
        Some(other) => {
            return Err(malformed(format!(
                "format is `{other}`, expected `{format}`"
            )))
        }
        None => return Err(malformed("no `format` field".into())),
    }
    let found = value
        .get("version")
        .and_then(|v| v.as_u64())
        .ok_or_else(|| malformed("no numeric `version` field".into()))?;
    if found != version as u64 {
        return Err(ReportError::Version {
            path: path.to_path_buf(),
            what,
            found,
            expected: version,
        });
    }
    serde_json::from_value(value).map_err(|e| {
        // The same parse from the text also says where: the field's path
        // and the line and column.
        let mut de = serde_json::Deserializer::from_str(&text);
        match serde_path_to_error::deserialize::<_, T>(&mut de) {
            Err(located) if located.path().to_string() != "." => {
                malformed(format!("{}: {}", located.path(), located.inner()))
            }
            Err(located) => malformed(located.inner().to_string()),
            Ok(_) => malformed(e.to_string()),
        }
    })
}

/// The environment block, typed where readers need it.
impl Report {
    /// `environment.backend`, as the backend wrote it.
    pub fn backend_environment(&self) -> &crate::environment::BackendEnvironment {
        &self.environment.backend
    }

    /// `environment.notes`: things worth knowing about the run (e.g. why
    /// `auto` fell back to the CPU).
    pub fn notes(&self) -> &[String] {
        &self.environment.notes
    }
}

#[cfg(test)]
mod tests {
    use crate::backend::{cpu::CpuBackend, Backend, BackendError, CaseRun, RunOptions};
    use crate::experiment::Case;
    use crate::runner::{run_staged, RunConfig};

    /// The CPU oracle in an NCCL world of 4 ranks: it skips every case whose
    /// W differs, as the NCCL backend does (`launch -n 4`).
    struct WorldOf4(CpuBackend);

    impl Backend for WorldOf4 {
        fn name(&self) -> &'static str {
            "nccl"
        }
        fn environment(&self) -> crate::environment::BackendEnvironment {
            // The kind a `nccl` report must carry (`BackendChoice::environment_kind`).
            let mut env = self.0.environment();
            env.kind = "nccl".into();
            env
        }
        fn run_case(&mut self, case: &Case, opts: &RunOptions) -> Result<CaseRun, BackendError> {
            self.0.run_case(case, opts)
        }
        fn skip_reason(&self, case: &Case) -> Option<String> {
            (case.world() != 4)
                .then(|| format!("W = {} but the NCCL world has 4 rank(s)", case.world()))
        }
    }

    #[test]
    fn a_run_whose_every_case_is_skipped_checked_nothing_and_fails() {
        let exp =
            crate::experiment::load(std::path::Path::new("experiments/order-sweep.toml")).unwrap();
        assert!(exp.cases.iter().all(|c| c.world() != 4));
        let cfg = RunConfig {
            nan_policy: crate::digest::NanPolicy::Canonical,
            dump: None,
            notes: vec![],
            backend_init_ms: 0.0,
        };
        let n = exp.cases.len();
        let (r, _) = run_staged(&[exp], &mut WorldOf4(CpuBackend::new()), &cfg, &mut ()).unwrap();
        assert_eq!((r.summary.cases, r.summary.skipped), (0, n));
        assert!(!r.summary.ok);
        assert_eq!(
            r.summary.failures,
            vec![format!(
                "nothing was checked: the backend skipped all {n} case(s) (e.g. `orders[ascending,fixed-order]`: W = 8 but the NCCL world has 4 rank(s))"
            )]
        );
        // The verdict is part of the report: a reader recomputes it.
        assert_eq!(super::check::problems(&r), Vec::<String>::new());
    }
}
