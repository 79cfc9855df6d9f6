//! Cross-report agreement by case key.

use super::{ArenaReport, Report};
use std::collections::BTreeMap;

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
                    write!(f, "; differing elements in {}", shown.join(", "))?;
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

/// Compare every report against the first. `names` label reports in messages.
pub fn compare(reports: &[(String, Report)], allow_missing: bool) -> Comparison {
    let mut out = Comparison::default();
    let Some((base_name, base)) = reports.first() else {
        return out;
    };
    fn index(r: &Report) -> BTreeMap<String, (String, Vec<&ArenaReport>)> {
        r.cases
            .iter()
            .map(|c| (c.key.clone(), (c.id.clone(), c.arenas.iter().collect())))
            .collect()
    }
    let base_idx = index(base);
    let mut compared_keys = std::collections::BTreeSet::new();
    for (name, other) in &reports[1..] {
        let idx = index(other);
        for (key, (id, digests)) in &base_idx {
            match idx.get(key) {
                None => {
                    if !allow_missing {
                        out.mismatches.push(Mismatch::Missing {
                            key: key.clone(),
                            id: id.clone(),
                            present_in: base_name.clone(),
                            absent_from: name.clone(),
                        });
                    }
                }
                Some((_, theirs)) => {
                    compared_keys.insert(key.clone());
                    if theirs.len() != digests.len() {
                        out.mismatches.push(Mismatch::Shape {
                            key: key.clone(),
                            left: base_name.clone(),
                            right: name.clone(),
                        });
                        continue;
                    }
                    for (a, (l, r)) in digests.iter().zip(theirs).enumerate() {
                        if l.sha256 != r.sha256 {
                            out.mismatches.push(Mismatch::Digest {
                                key: key.clone(),
                                id: id.clone(),
                                arena: a,
                                left: (base_name.clone(), l.sha256.clone()),
                                right: (name.clone(), r.sha256.clone()),
                                chunks: differing_chunks(l, r),
                            });
                        }
                    }
                }
            }
        }
        if !allow_missing {
            for (key, (id, _)) in &idx {
                if !base_idx.contains_key(key) {
                    out.mismatches.push(Mismatch::Missing {
                        key: key.clone(),
                        id: id.clone(),
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
            .map(|(k, _)| (k * size, ((k + 1) * size).min(l.len)))
            .collect(),
    )
}
