//! Cross-report agreement by case key. Every digest a report carries is
//! compared (arena, per rank, per chunk, chunk root), the parameters, the
//! order sensitivity and the `expect` result;
//! a golden file (arena digests of one experiment) can stand on either side.

use super::expect::ExpectOutcome;
use super::{ArenaReport, CaseParams, Golden, Report, ReportError};
use crate::digest::NanPolicy;
use std::collections::BTreeMap;
use std::path::Path;

#[derive(Debug, Clone, PartialEq)]
pub enum Mismatch {
    /// A case whose arena digest differs between two reports.
    Digest {
        key: String,
        id: String,
        arena: usize,
        left: (String, String),
        right: (String, String),
        /// Differing chunks as element ranges, when both reports carry
        /// chunk digests of the same shape.
        chunks: Option<Vec<(usize, usize)>>,
    },
    /// A case one report has and another lacks.
    Missing {
        key: String,
        id: String,
        present_in: String,
        absent_from: String,
    },
    /// Different arena counts for the same key (corrupt report).
    Shape {
        key: String,
        left: String,
        right: String,
    },
    /// Anything else a case carries that differs: a rank or chunk digest,
    /// the chunk root, a length, the parameters, the sensitivity.
    Field {
        key: String,
        id: String,
        what: String,
        left: (String, String),
        right: (String, String),
    },
    /// The two sides hashed NaNs differently: their digests are not comparable.
    NanPolicy {
        left: (String, String),
        right: (String, String),
    },
    /// Two sides share no case: agreement between them would mean nothing.
    NothingShared { left: String, right: String },
    /// A report whose own run failed its checks: never a passing side.
    FailedRun { name: String, failures: Vec<String> },
}

impl std::fmt::Display for Mismatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Mismatch::Digest {
                key,
                id,
                arena,
                left,
                right,
                chunks,
            } => {
                write!(
                    f,
                    "case `{id}` ({key}) arena {arena}: {} has {}, {} has {}",
                    left.0, left.1, right.0, right.1
                )?;
                if let Some(c) = chunks {
                    let shown: Vec<String> =
                        c.iter().take(8).map(|(a, b)| format!("{a}..{b}")).collect();
                    let more = c.len().saturating_sub(8);
                    if !shown.is_empty() {
                        write!(f, "; differing elements in {}", shown.join(", "))?;
                    }
                    if more > 0 {
                        write!(f, " and {more} more chunk(s)")?;
                    }
                }
                Ok(())
            }
            Mismatch::Missing {
                key,
                id,
                present_in,
                absent_from,
            } => {
                write!(
                    f,
                    "case `{id}` ({key}) is in {present_in} but not in {absent_from}"
                )
            }
            Mismatch::Shape { key, left, right } => {
                write!(
                    f,
                    "case {key} has different arena counts in {left} and {right}"
                )
            }
            Mismatch::Field {
                key,
                id,
                what,
                left,
                right,
            } => write!(
                f,
                "case `{id}` ({key}) {what}: {} has {}, {} has {}",
                left.0, left.1, right.0, right.1
            ),
            Mismatch::NanPolicy { left, right } => write!(
                f,
                "{} used NaN policy `{}`, {} used `{}`: their digests are not comparable",
                left.0, left.1, right.0, right.1
            ),
            Mismatch::NothingShared { left, right } => write!(
                f,
                "{}: {left} and {right} share no case",
                super::NOTHING_CHECKED
            ),
            Mismatch::FailedRun { name, failures } => write!(
                f,
                "{name}: its own run FAILED its checks (summary.ok = false: {}); its digests cannot vouch for anything",
                failures.first().map_or("no failure recorded", String::as_str)
            ),
        }
    }
}

#[derive(Debug, Clone, Default)]
pub struct Comparison {
    /// Case keys compared in every report.
    pub compared: usize,
    pub mismatches: Vec<Mismatch>,
}

impl Comparison {
    pub fn ok(&self) -> bool {
        self.mismatches.is_empty()
    }
}

/// One side of a comparison: a report, or a golden file.
#[derive(Debug, Clone)]
pub enum Source {
    Report(Box<Report>),
    Golden(Golden),
}

impl Source {
    /// Read a report or a golden, whichever the file's `format` says.
    pub fn read(path: &Path) -> Result<Source, ReportError> {
        let golden = crate::input::read_capped(path, crate::input::MAX_REPORT_BYTES)
            .ok()
            .and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok())
            .is_some_and(|v| {
                v.get("format").and_then(|f| f.as_str()) == Some(super::GOLDEN_FORMAT)
            });
        if golden {
            Golden::read(path).map(Source::Golden)
        } else {
            Report::read(path).map(|r| Source::Report(Box::new(r)))
        }
    }

    pub fn nan_policy(&self) -> NanPolicy {
        match self {
            Source::Report(r) => r.nan_policy,
            Source::Golden(g) => g.nan_policy,
        }
    }

    /// The experiment a golden covers (a report covers all of its own).
    fn only_experiment(&self) -> Option<&str> {
        match self {
            Source::Report(_) => None,
            Source::Golden(g) => Some(&g.experiment),
        }
    }

    fn cases(&self, only: Option<&str>) -> BTreeMap<String, View<'_>> {
        match self {
            Source::Report(r) => r
                .cases
                .iter()
                .filter(|c| only.is_none_or(|e| e == c.experiment))
                .map(|c| {
                    (
                        c.key.clone(),
                        View {
                            id: c.id.clone(),
                            params: Some(&c.params),
                            digests: c.arenas.iter().map(|a| a.sha256).collect(),
                            sensitivity: Some((
                                c.sensitivity.changed,
                                c.sensitivity.checked,
                                &c.sensitivity.sample,
                            )),
                            arenas: Some(c.arenas.iter().collect()),
                            expect: Some(c.expect.as_ref()),
                        },
                    )
                })
                .collect(),
            Source::Golden(g) => g
                .cases
                .iter()
                .map(|c| {
                    (
                        c.key.clone(),
                        View {
                            id: c.id.clone(),
                            params: None,
                            digests: c.arenas.clone(),
                            sensitivity: c
                                .sensitivity
                                .as_ref()
                                .map(|s| (s.changed, s.checked, s.sample.as_str())),
                            arenas: None,
                            expect: None,
                        },
                    )
                })
                .collect(),
        }
    }
}

/// What a case carries on one side.
struct View<'a> {
    id: String,
    params: Option<&'a CaseParams>,
    digests: Vec<crate::digest::Sha256>,
    /// Order sensitivity: elements changed, checked, and the sample.
    sensitivity: Option<(u64, u64, &'a str)>,
    /// Full arena records (reports only).
    arenas: Option<Vec<&'a ArenaReport>>,
    /// The comparison with the case's `expect` file, or none (reports
    /// only: a golden carries no expect result).
    expect: Option<Option<&'a ExpectOutcome>>,
}

/// Compare every report against the first. `names` label reports in messages.
pub fn compare(reports: &[(String, Report)], allow_missing: bool) -> Comparison {
    let sources: Vec<(String, Source)> = reports
        .iter()
        .map(|(n, r)| (n.clone(), Source::Report(Box::new(r.clone()))))
        .collect();
    compare_sources(&sources, allow_missing)
}

/// Compare every source (report or golden) against the first. Where a
/// golden is involved, only the cases of its experiment are compared.
pub fn compare_sources(sources: &[(String, Source)], allow_missing: bool) -> Comparison {
    let mut out = Comparison::default();
    let Some((base_name, base)) = sources.first() else {
        return out;
    };
    for (name, s) in sources {
        if let Source::Report(r) = s {
            if !r.summary.ok {
                out.mismatches.push(Mismatch::FailedRun {
                    name: name.clone(),
                    failures: r.summary.failures.clone(),
                });
            }
        }
    }
    let mut compared_keys = std::collections::BTreeSet::new();
    for (name, other) in &sources[1..] {
        let mut shared = 0usize;
        if base.nan_policy() != other.nan_policy() {
            out.mismatches.push(Mismatch::NanPolicy {
                left: (base_name.clone(), base.nan_policy().to_string()),
                right: (name.clone(), other.nan_policy().to_string()),
            });
        }
        let only = other.only_experiment().or(base.only_experiment());
        let base_idx = base.cases(only);
        let idx = other.cases(only);
        for (key, mine) in &base_idx {
            match idx.get(key) {
                None => {
                    if !allow_missing {
                        out.mismatches.push(Mismatch::Missing {
                            key: key.clone(),
                            id: mine.id.clone(),
                            present_in: base_name.clone(),
                            absent_from: name.clone(),
                        });
                    }
                }
                Some(theirs) => {
                    shared += 1;
                    compared_keys.insert(key.clone());
                    compare_case(key, (base_name, mine), (name, theirs), &mut out);
                }
            }
        }
        if shared == 0 {
            out.mismatches.push(Mismatch::NothingShared {
                left: base_name.clone(),
                right: name.clone(),
            });
        }
        if !allow_missing {
            for (key, theirs) in &idx {
                if !base_idx.contains_key(key) {
                    out.mismatches.push(Mismatch::Missing {
                        key: key.clone(),
                        id: theirs.id.clone(),
                        present_in: name.clone(),
                        absent_from: base_name.clone(),
                    });
                }
            }
        }
    }
    out.compared = compared_keys.len();
    out
}

fn compare_case(key: &str, l: (&String, &View), r: (&String, &View), out: &mut Comparison) {
    let (ln, lv) = l;
    let (rn, rv) = r;
    let field = |what: String, a: String, b: String| Mismatch::Field {
        key: key.to_string(),
        id: lv.id.clone(),
        what,
        left: (ln.clone(), a),
        right: (rn.clone(), b),
    };
    if let (Some(a), Some(b)) = (lv.params, rv.params) {
        if a != b {
            let js = |p: &CaseParams| serde_json::to_string(p).unwrap_or_default();
            out.mismatches
                .push(field("parameters".into(), js(a), js(b)));
        }
    }
    // Sensitivity follows from the parameters alone (docs/SPEC.md §7).
    if let (Some(a), Some(b)) = (lv.sensitivity, rv.sensitivity) {
        if a != b {
            let say = |(c, k, s): (u64, u64, &str)| format!("{c} of {k} elements changed ({s})");
            out.mismatches
                .push(field("sensitivity".into(), say(a), say(b)));
        }
    }
    if let (Some(a), Some(b)) = (lv.expect, rv.expect) {
        compare_expect(a, b, &mut |what, x, y| {
            out.mismatches.push(field(what, x, y))
        });
    }
    if lv.digests.len() != rv.digests.len() {
        out.mismatches.push(Mismatch::Shape {
            key: key.to_string(),
            left: ln.clone(),
            right: rn.clone(),
        });
        return;
    }
    for (i, (a, b)) in lv.digests.iter().zip(&rv.digests).enumerate() {
        let full = lv
            .arenas
            .as_ref()
            .zip(rv.arenas.as_ref())
            .map(|(x, y)| (x[i], y[i]));
        if a != b {
            out.mismatches.push(Mismatch::Digest {
                key: key.to_string(),
                id: lv.id.clone(),
                arena: i,
                left: (ln.clone(), a.to_string()),
                right: (rn.clone(), b.to_string()),
                chunks: full.and_then(|(x, y)| differing_chunks(x, y)),
            });
        }
        let Some((x, y)) = full else { continue };
        if x.len != y.len {
            out.mismatches.push(field(
                format!("arena {i} length"),
                x.len.to_string(),
                y.len.to_string(),
            ));
        }
        // Where the arena digests differ, that one mismatch (localized by
        // chunk) says it; rank and chunk details matter where they agree.
        for (rank, (p, q)) in x.rank_sha256.iter().zip(&y.rank_sha256).enumerate() {
            if p != q && a == b {
                out.mismatches.push(field(
                    format!("arena {i} rank {rank} digest"),
                    p.to_string(),
                    q.to_string(),
                ));
            }
        }
        if x.rank_sha256.len() != y.rank_sha256.len() && a == b {
            out.mismatches.push(field(
                format!("arena {i} rank count"),
                x.rank_sha256.len().to_string(),
                y.rank_sha256.len().to_string(),
            ));
        }
        for (rank, (p, q)) in x.shard_sha256.iter().zip(&y.shard_sha256).enumerate() {
            if p != q && a == b {
                out.mismatches.push(field(
                    format!("arena {i} rank {rank} shard digest"),
                    p.to_string(),
                    q.to_string(),
                ));
            }
        }
        if x.ranks_identical != y.ranks_identical {
            out.mismatches.push(field(
                format!("arena {i} ranks_identical"),
                x.ranks_identical.to_string(),
                y.ranks_identical.to_string(),
            ));
        }
        // Chunk lists are compared when both sides carry them (older
        // reports may not): the digests differ exactly where chunks do.
        if !x.chunk_sha256.is_empty() && !y.chunk_sha256.is_empty() {
            if x.chunk_root != y.chunk_root && a == b {
                out.mismatches.push(field(
                    format!("arena {i} chunk_root"),
                    x.chunk_root.to_string(),
                    y.chunk_root.to_string(),
                ));
            }
            if a == b {
                if x.chunk_elems != y.chunk_elems || x.chunk_sha256.len() != y.chunk_sha256.len() {
                    out.mismatches.push(field(
                        format!("arena {i} chunking"),
                        format!("{} chunks of {}", x.chunk_sha256.len(), x.chunk_elems),
                        format!("{} chunks of {}", y.chunk_sha256.len(), y.chunk_elems),
                    ));
                } else {
                    for (k, (p, q)) in x.chunk_sha256.iter().zip(&y.chunk_sha256).enumerate() {
                        if p != q {
                            let (s, e) = chunk_range(k, x.chunk_elems, x.len);
                            out.mismatches.push(field(
                                format!("arena {i} chunk {k} (elements {s}..{e}) digest"),
                                p.to_string(),
                                q.to_string(),
                            ));
                        }
                    }
                }
            }
        }
    }
}

/// The two sides' `expect` results, field by field: the file's digest and
/// size, the verdict, and per arena the differing count, the largest ULP
/// distance, the distances' histogram and the differences listed. Its path is where the file was,
/// like a rank file's, and is not compared.
fn compare_expect(
    a: Option<&ExpectOutcome>,
    b: Option<&ExpectOutcome>,
    mismatch: &mut dyn FnMut(String, String, String),
) {
    let verdict = |e: Option<&ExpectOutcome>| match e {
        None => "no expect result".to_string(),
        Some(e) if e.equal => format!("equal to {} ({})", e.path, e.sha256.short(16)),
        Some(e) => format!(
            "differs from {} ({}) in {} element(s)",
            e.path,
            e.sha256.short(16),
            e.arenas.iter().map(|a| a.differing).sum::<usize>()
        ),
    };
    let (x, y) = match (a, b) {
        (Some(x), Some(y)) => (x, y),
        (None, None) => return,
        _ => return mismatch("expect".into(), verdict(a), verdict(b)),
    };
    if x.sha256 != y.sha256 || x.bytes != y.bytes {
        mismatch(
            "expect file".into(),
            format!("{} ({} bytes)", x.sha256, x.bytes),
            format!("{} ({} bytes)", y.sha256, y.bytes),
        );
    }
    if x.equal != y.equal {
        let say = |e: bool| if e { "equal" } else { "differs" }.to_string();
        mismatch("expect verdict".into(), say(x.equal), say(y.equal));
    }
    if x.arenas.len() != y.arenas.len() {
        mismatch(
            "expect arena count".into(),
            x.arenas.len().to_string(),
            y.arenas.len().to_string(),
        );
        return;
    }
    for (i, (p, q)) in x.arenas.iter().zip(&y.arenas).enumerate() {
        if p.differing != q.differing {
            mismatch(
                format!("expect arena {i} differing elements"),
                p.differing.to_string(),
                q.differing.to_string(),
            );
        }
        if p.max_ulp != q.max_ulp {
            let say = |u: Option<u64>| u.map_or("none".to_string(), |u| u.to_string());
            mismatch(
                format!("expect arena {i} max_ulp"),
                say(p.max_ulp),
                say(q.max_ulp),
            );
        }
        if p.ulp_histogram != q.ulp_histogram {
            mismatch(
                format!("expect arena {i} ulp_histogram"),
                format!("{:?}", p.ulp_histogram),
                format!("{:?}", q.ulp_histogram),
            );
        }
        if p.first != q.first {
            let say = |f: &[super::localize::ElementDiff]| {
                let v: Vec<String> = f
                    .iter()
                    .map(|d| format!("{}: 0x{:08x}/0x{:08x}", d.index, d.left, d.right))
                    .collect();
                format!("[{}]", v.join(", "))
            };
            mismatch(
                format!("expect arena {i} first differences"),
                say(&p.first),
                say(&q.first),
            );
        }
    }
}

/// Element ranges of the chunks whose digests differ, if both sides carry
/// comparable chunk lists.
fn differing_chunks(l: &ArenaReport, r: &ArenaReport) -> Option<Vec<(usize, usize)>> {
    let size = l.chunk_elems;
    if size == 0
        || size != r.chunk_elems
        || l.len != r.len
        || l.chunk_sha256.len() != r.chunk_sha256.len()
        || l.chunk_sha256.is_empty()
    {
        return None;
    }
    Some(
        l.chunk_sha256
            .iter()
            .zip(&r.chunk_sha256)
            .enumerate()
            .filter(|(_, (a, b))| a != b)
            .map(|(k, _)| chunk_range(k, size, l.len))
            .collect(),
    )
}

/// Elements `start..end` of chunk `k`; saturating, so that a chunk size no
/// checked report has can never wrap into a wrong range.
fn chunk_range(k: usize, size: usize, len: usize) -> (usize, usize) {
    let start = k.saturating_mul(size);
    (start, start.saturating_add(size).min(len))
}
