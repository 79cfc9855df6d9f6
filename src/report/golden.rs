//! Golden digests: the CPU oracle's arena digests per experiment, committed
//! under experiments/golden/ and checked by `verify`. Besides each arena's
//! SHA-256 a golden pins its chunk digests and chunk root (docs/SPEC.md §5)
//! and the case's order sensitivity (§7); those fields are optional, so a
//! golden written before them still reads and verifies its digests.

use super::{CaseReport, Report, ReportError};
use crate::digest::NanPolicy;
use crate::experiment::Experiment;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
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
    pub arenas: Vec<crate::digest::Sha256>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sensitivity: Option<GoldenSensitivity>,
    /// Per arena: SHA-256 of its concatenated raw chunk digests.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub chunk_root: Vec<crate::digest::Sha256>,
    /// Per arena: the SHA-256 of each `chunk_elems`-element chunk.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub chunk_sha256: Vec<Vec<crate::digest::Sha256>>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Golden {
    pub format: String,
    pub version: u32,
    pub experiment: String,
    pub nan_policy: NanPolicy,
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
            nan_policy: report.nan_policy,
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
                    arenas: c.arenas.iter().map(|a| a.sha256).collect(),
                    sensitivity: Some(GoldenSensitivity {
                        changed: c.sensitivity.changed,
                        checked: c.sensitivity.checked,
                        sample: c.sensitivity.sample.clone(),
                    }),
                    chunk_root: c.arenas.iter().map(|a| a.chunk_root).collect(),
                    chunk_sha256: c.arenas.iter().map(|a| a.chunk_sha256.clone()).collect(),
                })
                .collect(),
        }
    }

    /// What a run's case contradicts in this golden's entry beyond the
    /// arena digests (which [`check`] compares first): chunk size, chunk
    /// roots, chunk digests and order sensitivity, each where the golden
    /// records it. One problem per disagreement.
    pub fn mismatches_beyond_digests(
        &self,
        want: &GoldenCase,
        got: &CaseReport,
    ) -> Vec<GoldenProblem> {
        let mut out = Vec::new();
        let at = |arena: usize| ArenaOf {
            id: got.id.clone(),
            key: got.key.clone(),
            arena,
        };
        let chunked = !want.chunk_root.is_empty() || !want.chunk_sha256.is_empty();
        if chunked {
            for (i, a) in got.arenas.iter().enumerate() {
                if a.chunk_elems != self.chunk_elems {
                    out.push(GoldenProblem::ChunkElems {
                        at: at(i),
                        got: a.chunk_elems,
                        want: self.chunk_elems,
                    });
                    continue;
                }
                match want.chunk_root.get(i) {
                    Some(root) if *root != a.chunk_root => out.push(GoldenProblem::ChunkRoot {
                        at: at(i),
                        got: a.chunk_root,
                        want: *root,
                    }),
                    Some(_) => {}
                    None => out.push(GoldenProblem::NoChunkRoot { at: at(i) }),
                }
                match want.chunk_sha256.get(i) {
                    Some(chunks) => {
                        let differing: Vec<usize> = (0..chunks.len().max(a.chunk_sha256.len()))
                            .filter(|&k| chunks.get(k) != a.chunk_sha256.get(k))
                            .collect();
                        if let Some(&first) = differing.first() {
                            out.push(GoldenProblem::ChunkDigests {
                                at: at(i),
                                differing: differing.len(),
                                got: a.chunk_sha256.len(),
                                want: chunks.len(),
                                first,
                            });
                        }
                    }
                    None => out.push(GoldenProblem::NoChunkDigests { at: at(i) }),
                }
            }
        }
        if let Some(s) = &want.sensitivity {
            let g = &got.sensitivity;
            if (g.changed, g.checked, g.sample.as_str())
                != (s.changed, s.checked, s.sample.as_str())
            {
                out.push(GoldenProblem::Sensitivity {
                    id: got.id.clone(),
                    key: got.key.clone(),
                    got: GoldenSensitivity {
                        changed: g.changed,
                        checked: g.checked,
                        sample: g.sample.clone(),
                    },
                    want: s.clone(),
                });
            }
        }
        out
    }

    /// What changed from `old` to this golden, in words (empty: nothing
    /// that `verify` checks changed).
    pub fn changes_from(&self, old: &Golden) -> Vec<String> {
        let before: BTreeMap<&str, &GoldenCase> =
            old.cases.iter().map(|c| (c.key.as_str(), c)).collect();
        let now: BTreeSet<&str> = self.cases.iter().map(|c| c.key.as_str()).collect();
        let (mut added, mut digests, mut chunks, mut sens, mut ids) = (0, 0, 0, 0, 0);
        for c in &self.cases {
            let Some(o) = before.get(c.key.as_str()) else {
                added += 1;
                continue;
            };
            if c.arenas != o.arenas {
                digests += 1;
            } else if c.chunk_root != o.chunk_root || c.chunk_sha256 != o.chunk_sha256 {
                chunks += 1;
            }
            if c.sensitivity != o.sensitivity {
                sens += 1;
            }
            if c.id != o.id {
                ids += 1;
            }
        }
        let removed = before.keys().filter(|k| !now.contains(*k)).count();
        let mut out = Vec::new();
        let mut say = |n: usize, what: &str| {
            if n > 0 {
                out.push(format!("{n} case(s) {what}"));
            }
        };
        say(digests, "with other arena digests");
        say(chunks, "with other chunk digests only");
        say(sens, "with other order-sensitivity counts");
        say(added, "added");
        say(removed, "removed");
        say(ids, "renamed");
        if self.chunk_elems != old.chunk_elems {
            out.push(format!(
                "chunk size {} -> {} elements",
                old.chunk_elems, self.chunk_elems
            ));
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
        }
        out
    }
}

/// Why `verify` cannot compare with the goldens at all.
#[derive(Debug, thiserror::Error)]
pub enum GoldenError {
    /// An experiment has no golden file: a failed check, not bad input.
    #[error(
        "no golden for experiment `{experiment}` at {} (generate it with `foldprint golden {} --golden {}`)",
        path.display(),
        experiment_path.display(),
        dir.display()
    )]
    Missing {
        experiment: String,
        experiment_path: PathBuf,
        dir: PathBuf,
        path: PathBuf,
    },
    /// The golden hashed NaNs under another policy than the run will.
    #[error("{}: golden was made with NaN policy `{golden}`, this run uses `{run}`", path.display())]
    NanPolicy {
        path: PathBuf,
        golden: NanPolicy,
        run: NanPolicy,
    },
    /// The golden file is another experiment's: its `experiment` field
    /// must name the experiment it is loaded for.
    #[error(
        "{}: golden of experiment `{golden}`, but it is loaded for experiment `{experiment}` ({}); \
         a golden can only vouch for its own experiment",
        path.display(),
        experiment_path.display()
    )]
    WrongExperiment {
        path: PathBuf,
        experiment: String,
        experiment_path: PathBuf,
        golden: String,
    },
    /// The golden file cannot be read, or is malformed or inconsistent.
    #[error(transparent)]
    Read(#[from] ReportError),
}

/// A golden file, read for `verify`.
#[derive(Debug, Clone)]
pub struct GoldenFile {
    pub path: PathBuf,
    pub golden: Golden,
}

/// Read the golden of every experiment from `dir`, in the experiments'
/// order, before anything runs: the first that is missing, unreadable or
/// made with another NaN policy than `nan_policy` is the error.
pub fn load(
    experiments: &[Experiment],
    dir: &Path,
    nan_policy: NanPolicy,
) -> Result<Vec<GoldenFile>, GoldenError> {
    let mut out = Vec::with_capacity(experiments.len());
    for e in experiments {
        let path = Golden::path_in(dir, &e.name);
        if !path.exists() {
            return Err(GoldenError::Missing {
                experiment: e.name.clone(),
                experiment_path: e.path.clone(),
                dir: dir.to_path_buf(),
                path,
            });
        }
        let golden = Golden::read(&path)?;
        if golden.experiment != e.name {
            return Err(GoldenError::WrongExperiment {
                path,
                experiment: e.name.clone(),
                experiment_path: e.path.clone(),
                golden: golden.experiment,
            });
        }
        if golden.nan_policy != nan_policy {
            return Err(GoldenError::NanPolicy {
                path,
                golden: golden.nan_policy,
                run: nan_policy,
            });
        }
        out.push(GoldenFile { path, golden });
    }
    Ok(out)
}

/// Where a per-arena problem is: `case `ID` (KEY) arena N`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ArenaOf {
    pub id: String,
    pub key: String,
    pub arena: usize,
}

impl fmt::Display for ArenaOf {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "case `{}` ({}) arena {}", self.id, self.key, self.arena)
    }
}

/// One way a run contradicts its goldens. Its text is the line `verify`
/// prints.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GoldenProblem {
    /// The run made a case its experiment's golden does not hold.
    #[error("case `{id}` ({key}) of `{experiment}` has no golden digest in {}", golden.display())]
    NotInGolden {
        id: String,
        key: String,
        experiment: String,
        golden: PathBuf,
    },
    /// An arena's digest differs from the golden's.
    #[error("{at}: digest {got} but golden {} says {want}", golden.display())]
    Digest {
        at: ArenaOf,
        got: crate::digest::Sha256,
        want: crate::digest::Sha256,
        golden: PathBuf,
    },
    /// The case has another number of arenas than its golden entry.
    #[error("case `{id}`: {got} arenas, golden has {want}")]
    ArenaCount { id: String, got: usize, want: usize },
    #[error("{at}: chunks of {got} elements, golden has {want}")]
    ChunkElems {
        at: ArenaOf,
        got: usize,
        want: usize,
    },
    #[error("{at}: chunk root {got} but golden says {want}")]
    ChunkRoot {
        at: ArenaOf,
        got: crate::digest::Sha256,
        want: crate::digest::Sha256,
    },
    #[error("{at}: golden has no chunk root")]
    NoChunkRoot { at: ArenaOf },
    #[error("{at}: {differing} of {got} chunk digests differ from the golden's {want} (first: chunk {first})")]
    ChunkDigests {
        at: ArenaOf,
        differing: usize,
        got: usize,
        want: usize,
        first: usize,
    },
    #[error("{at}: golden has no chunk digests")]
    NoChunkDigests { at: ArenaOf },
    #[error(
        "case `{id}` ({key}): order sensitivity {} of {} changed ({}) but golden says {} of {} ({})",
        got.changed, got.checked, got.sample, want.changed, want.checked, want.sample
    )]
    Sensitivity {
        id: String,
        key: String,
        got: GoldenSensitivity,
        want: GoldenSensitivity,
    },
    /// The experiment declares a case the report neither ran nor skipped:
    /// nothing vouches for it.
    #[error("case `{id}` ({key}) of `{experiment}` is declared but was neither run nor skipped")]
    NotChecked {
        id: String,
        key: String,
        experiment: String,
    },
    /// The golden names an experiment that is not among the ones run.
    #[error("golden {} is for experiment `{experiment}`, which this run does not declare", golden.display())]
    NoSuchExperiment { experiment: String, golden: PathBuf },
    /// The golden holds a case its experiment no longer declares: the
    /// golden is stale, and would vouch for nothing.
    #[error("golden {} lists case `{id}` ({key}) that the experiment no longer declares", golden.display())]
    Stale {
        id: String,
        key: String,
        golden: PathBuf,
    },
}

impl GoldenProblem {
    /// The problem as a line under its case's row (the case named by the
    /// row itself); problems of no case as their full text.
    pub fn in_case(&self) -> String {
        use GoldenProblem as P;
        match self {
            P::NotInGolden { golden, .. } => {
                format!("no golden digest in {}", golden.display())
            }
            P::Digest {
                at,
                got,
                want,
                golden,
            } => format!(
                "arena {}: digest {} but golden {} says {}",
                at.arena,
                got.short(16),
                golden.display(),
                want.short(16)
            ),
            P::ArenaCount { got, want, .. } => format!("{got} arenas, golden has {want}"),
            P::ChunkElems { at, got, want } => format!(
                "arena {}: chunks of {got} elements, golden has {want}",
                at.arena
            ),
            P::ChunkRoot { at, got, want } => format!(
                "arena {}: chunk root {} but golden says {}",
                at.arena,
                got.short(16),
                want.short(16)
            ),
            P::NoChunkRoot { at } => format!("arena {}: golden has no chunk root", at.arena),
            P::ChunkDigests {
                at,
                differing,
                got,
                want,
                first,
            } => format!(
                "arena {}: {differing} of {got} chunk digests differ from the golden's {want} (first: chunk {first})",
                at.arena
            ),
            P::NoChunkDigests { at } => {
                format!("arena {}: golden has no chunk digests", at.arena)
            }
            P::Sensitivity { got, want, .. } => format!(
                "order sensitivity {} of {} changed ({}) but golden says {} of {} ({})",
                got.changed, got.checked, got.sample, want.changed, want.checked, want.sample
            ),
            P::NotChecked { .. } | P::NoSuchExperiment { .. } | P::Stale { .. } => {
                self.to_string()
            }
        }
    }
}

/// What one case of a run contradicts in its experiment's golden (none
/// when no golden of `goldens` is its experiment's): the arena digests,
/// their number and [`Golden::mismatches_beyond_digests`]. `verify` asks
/// as each case finishes, so its row says whether it matched.
pub fn case_problems(goldens: &[GoldenFile], c: &CaseReport) -> Vec<GoldenProblem> {
    goldens
        .iter()
        .find(|g| g.golden.experiment == c.experiment)
        .map_or_else(Vec::new, |g| check_case(g, c))
}

fn check_case(file: &GoldenFile, c: &CaseReport) -> Vec<GoldenProblem> {
    let GoldenFile { path, golden: g } = file;
    let mut problems = Vec::new();
    let Some(gc) = g.cases.iter().find(|gc| gc.key == c.key) else {
        problems.push(GoldenProblem::NotInGolden {
            id: c.id.clone(),
            key: c.key.clone(),
            experiment: g.experiment.clone(),
            golden: path.clone(),
        });
        return problems;
    };
    for (i, (got, exp)) in c.arenas.iter().zip(&gc.arenas).enumerate() {
        if got.sha256 != *exp {
            problems.push(GoldenProblem::Digest {
                at: ArenaOf {
                    id: c.id.clone(),
                    key: c.key.clone(),
                    arena: i,
                },
                got: got.sha256,
                want: *exp,
                golden: path.clone(),
            });
        }
    }
    if c.arenas.len() != gc.arenas.len() {
        problems.push(GoldenProblem::ArenaCount {
            id: c.id.clone(),
            got: c.arenas.len(),
            want: gc.arenas.len(),
        });
    }
    problems.extend(g.mismatches_beyond_digests(gc, c));
    problems
}

/// Everything in `report` that contradicts `goldens` (see [`load`]), golden
/// by golden: per case of its experiment [`case_problems`]; then every
/// declared case the report neither ran nor skipped, and the golden's
/// cases that `experiments` no longer declare. Empty when the run matches.
pub fn check(
    goldens: &[GoldenFile],
    experiments: &[Experiment],
    report: &Report,
) -> Vec<GoldenProblem> {
    let mut problems = Vec::new();
    for file in goldens {
        for c in report
            .cases
            .iter()
            .filter(|c| c.experiment == file.golden.experiment)
        {
            problems.extend(check_case(file, c));
        }
        problems.extend(declared(file, experiments, report));
    }
    problems
}

/// The problems of no one case run: every declared case the report
/// neither ran nor skipped, and the golden's cases `experiments` no
/// longer declare (or its experiment, when none declares it).
pub fn run_problems(
    goldens: &[GoldenFile],
    experiments: &[Experiment],
    report: &Report,
) -> Vec<GoldenProblem> {
    goldens
        .iter()
        .flat_map(|file| declared(file, experiments, report))
        .collect()
}

fn declared(file: &GoldenFile, experiments: &[Experiment], report: &Report) -> Vec<GoldenProblem> {
    let GoldenFile { path, golden: g } = file;
    let mut problems = Vec::new();
    let Some(exp) = experiments.iter().find(|e| e.name == g.experiment) else {
        problems.push(GoldenProblem::NoSuchExperiment {
            experiment: g.experiment.clone(),
            golden: path.clone(),
        });
        return problems;
    };
    // Every declared case was compared above or skipped by the backend
    // (the skips are counted where the verdict is printed).
    let seen: BTreeSet<&str> = report
        .cases
        .iter()
        .map(|c| (c.experiment.as_str(), c.key.as_str()))
        .chain(
            report
                .skipped
                .iter()
                .map(|s| (s.experiment.as_str(), s.key.as_str())),
        )
        .filter(|(e, _)| *e == exp.name)
        .map(|(_, k)| k)
        .collect();
    let mut declared = BTreeSet::new();
    for c in &exp.cases {
        let key = c.key();
        if !seen.contains(key.as_str()) {
            problems.push(GoldenProblem::NotChecked {
                id: c.id().to_string(),
                key: key.clone(),
                experiment: exp.name.clone(),
            });
        }
        declared.insert(key);
    }
    for gc in &g.cases {
        if !declared.contains(&gc.key) {
            problems.push(GoldenProblem::Stale {
                id: gc.id.clone(),
                key: gc.key.clone(),
                golden: path.clone(),
            });
        }
    }
    problems
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::cpu::CpuBackend;
    use crate::runner::{self, RunConfig};

    const TWO_CASES: &str = r#"
name = "g"
[defaults]
world = 3
arenas = [70, 5]
seed = 4
[[case]]
id = "a"
[[case]]
id = "b"
seed = 5
"#;

    fn experiment(text: &str) -> Experiment {
        crate::experiment::parse(Path::new("g.toml"), text).unwrap()
    }

    /// A real run of `exp` on the CPU oracle.
    fn run(exp: &Experiment) -> Report {
        let cfg = RunConfig {
            nan_policy: NanPolicy::Canonical,
            dump: None,
            notes: vec![],
            backend_init_ms: 0.0,
        };
        runner::run_staged(
            std::slice::from_ref(exp),
            &mut CpuBackend::new(),
            &cfg,
            &mut (),
        )
        .unwrap()
        .0
    }

    fn file(g: Golden) -> Vec<GoldenFile> {
        vec![GoldenFile {
            path: PathBuf::from("golden/g.json"),
            golden: g,
        }]
    }

    fn lines(problems: &[GoldenProblem]) -> Vec<String> {
        problems.iter().map(|p| p.to_string()).collect()
    }

    #[test]
    fn a_run_matches_its_own_golden() {
        let exp = experiment(TWO_CASES);
        let report = run(&exp);
        let golden = Golden::from_report(&report, "g");
        assert_eq!(golden.cases.len(), 2);
        assert_eq!(check(&file(golden), &[exp], &report), vec![]);
    }

    #[test]
    fn a_golden_case_the_experiment_dropped_is_stale() {
        let exp = experiment(TWO_CASES);
        let golden = Golden::from_report(&run(&exp), "g");
        // Case `b` is gone from the experiment; the golden still lists it.
        let fewer = experiment(&TWO_CASES.replace("[[case]]\nid = \"b\"\nseed = 5\n", ""));
        assert_eq!(fewer.cases.len(), 1);
        let report = run(&fewer);
        let problems = check(&file(golden.clone()), &[fewer], &report);
        let b = &golden.cases[1];
        assert_eq!(
            problems,
            vec![GoldenProblem::Stale {
                id: "b".into(),
                key: b.key.clone(),
                golden: "golden/g.json".into(),
            }]
        );
        assert_eq!(
            problems[0].to_string(),
            format!(
                "golden golden/g.json lists case `b` ({}) that the experiment no longer declares",
                b.key
            )
        );
    }

    #[test]
    fn a_case_the_golden_lacks_fails() {
        let exp = experiment(TWO_CASES);
        let report = run(&exp);
        let mut golden = Golden::from_report(&report, "g");
        let b = golden.cases.pop().unwrap();
        assert_eq!(
            lines(&check(&file(golden), &[exp], &report)),
            vec![format!(
                "case `b` ({}) of `g` has no golden digest in golden/g.json",
                b.key
            )]
        );
    }

    #[test]
    fn digests_and_arena_counts_are_compared() {
        let exp = experiment(TWO_CASES);
        let report = run(&exp);
        let good = Golden::from_report(&report, "g");
        let key = good.cases[0].key.clone();
        let got = good.cases[0].arenas[1];

        let mut g = good.clone();
        g.cases[0].arenas[1] = crate::digest::Sha256::from_bytes([0; 32]);
        assert_eq!(
            lines(&check(&file(g), std::slice::from_ref(&exp), &report)),
            vec![format!(
                "case `a` ({key}) arena 1: digest {got} but golden golden/g.json says {}",
                "0".repeat(64)
            )]
        );

        let mut g = good.clone();
        g.cases[0]
            .arenas
            .push(crate::digest::Sha256::from_bytes([0x11; 32]));
        assert_eq!(
            lines(&check(&file(g), std::slice::from_ref(&exp), &report)),
            vec!["case `a`: 2 arenas, golden has 3".to_string()]
        );
    }

    #[test]
    fn chunks_and_sensitivity_are_compared_where_the_golden_has_them() {
        let exp = experiment(TWO_CASES);
        let report = run(&exp);
        let good = Golden::from_report(&report, "g");
        let key = good.cases[1].key.clone();
        let check_one = |g: Golden| lines(&check(&file(g), std::slice::from_ref(&exp), &report));

        let mut g = good.clone();
        g.cases[1].chunk_root[0] = crate::digest::Sha256::from_bytes([0x22; 32]);
        g.cases[1].chunk_sha256[1][0] = crate::digest::Sha256::from_bytes([0x33; 32]);
        assert_eq!(
            check_one(g),
            vec![
                format!(
                    "case `b` ({key}) arena 0: chunk root {} but golden says {}",
                    good.cases[1].chunk_root[0],
                    "2".repeat(64)
                ),
                format!(
                    "case `b` ({key}) arena 1: 1 of 1 chunk digests differ from the golden's 1 (first: chunk 0)"
                ),
            ]
        );

        let mut g = good.clone();
        g.cases[1].chunk_root.truncate(1);
        g.cases[1].chunk_sha256.truncate(1);
        assert_eq!(
            check_one(g),
            vec![
                format!("case `b` ({key}) arena 1: golden has no chunk root"),
                format!("case `b` ({key}) arena 1: golden has no chunk digests"),
            ]
        );

        let mut g = good.clone();
        g.chunk_elems = 1024;
        assert_eq!(check_one(g).len(), 4, "two arenas of two cases");

        let mut g = good.clone();
        let s = g.cases[1].sensitivity.as_mut().unwrap();
        s.changed += 1;
        let (c, k) = (s.changed, s.checked);
        assert_eq!(
            check_one(g),
            vec![format!(
                "case `b` ({key}): order sensitivity {} of {k} changed (every element) but golden says {c} of {k} (every element)",
                c - 1
            )]
        );

        // A golden written before chunks and sensitivity: digests only.
        let mut g = good.clone();
        g.chunk_elems = 0;
        for c in &mut g.cases {
            c.chunk_root.clear();
            c.chunk_sha256.clear();
            c.sensitivity = None;
        }
        assert_eq!(check_one(g), Vec::<String>::new());
    }

    #[test]
    fn load_reads_every_golden_or_says_which_is_missing_or_wrong() {
        let dir = tempfile::tempdir().unwrap();
        let exp = experiment(TWO_CASES);
        let missing =
            load(std::slice::from_ref(&exp), dir.path(), NanPolicy::Canonical).unwrap_err();
        assert!(matches!(missing, GoldenError::Missing { .. }));
        assert_eq!(
            missing.to_string(),
            format!(
                "no golden for experiment `g` at {0}/g.json (generate it with `foldprint golden g.toml --golden {0}`)",
                dir.path().display()
            )
        );

        let golden = Golden::from_report(&run(&exp), "g");
        golden.write(&Golden::path_in(dir.path(), "g")).unwrap();
        let loaded = load(std::slice::from_ref(&exp), dir.path(), NanPolicy::Canonical).unwrap();
        assert_eq!(loaded.len(), 1);
        assert_eq!(loaded[0].path, dir.path().join("g.json"));
        assert_eq!(loaded[0].golden, golden);

        let other = load(std::slice::from_ref(&exp), dir.path(), NanPolicy::Preserve).unwrap_err();
        assert!(matches!(other, GoldenError::NanPolicy { .. }));
        assert_eq!(
            other.to_string(),
            format!(
                "{}/g.json: golden was made with NaN policy `canonical`, this run uses `preserve`",
                dir.path().display()
            )
        );

        std::fs::write(dir.path().join("g.json"), "{}").unwrap();
        let bad = load(&[exp], dir.path(), NanPolicy::Canonical).unwrap_err();
        assert!(
            matches!(bad, GoldenError::Read(ReportError::Malformed { .. })),
            "{bad}"
        );
    }
}
