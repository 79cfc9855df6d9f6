//! `expect`: a framework's reduced result (e.g. what
//! `torch.distributed.all_reduce` left in each rank's gradients) compared
//! bit for bit with the case's, arena by arena, with the differing
//! elements counted and their ULP distances.

use super::localize::{diff_bits, ElementDiff};
use crate::addends::{AddendError, ExpectFile};
use crate::digest::Sha256;
use serde::{Deserialize, Serialize};

/// Differences listed per arena, at most.
pub const FIRST_KEPT: usize = 8;

/// The comparison, as the report records it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExpectOutcome {
    /// As the experiment wrote it.
    pub path: String,
    pub sha256: Sha256,
    pub bytes: u64,
    /// Every arena equal bit for bit.
    pub equal: bool,
    pub arenas: Vec<ExpectArena>,
}

/// One arena: `left` in `first` is this case's result, `right` the file's.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExpectArena {
    pub index: usize,
    pub len: usize,
    pub differing: usize,
    /// Largest distance in units in the last place (NaNs left out).
    pub max_ulp: Option<u64>,
    pub first: Vec<ElementDiff>,
}

impl ExpectOutcome {
    /// Compare `results` (the case's reduced arenas, rank 0's copy) with
    /// the file.
    pub fn compare(file: &ExpectFile, results: &[&[f32]]) -> Result<ExpectOutcome, AddendError> {
        let mut arenas = Vec::with_capacity(results.len());
        for (index, ours) in results.iter().enumerate() {
            let theirs = file.read(index)?;
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<u32>>();
            let d = diff_bits(&bits(ours), &bits(&theirs), FIRST_KEPT);
            arenas.push(ExpectArena {
                index,
                len: ours.len(),
                differing: d.differing,
                max_ulp: d.max_ulp,
                first: d.first,
            });
        }
        let facts = file.facts();
        Ok(ExpectOutcome {
            path: file.path().to_string(),
            sha256: facts.sha256,
            bytes: facts.bytes,
            equal: arenas.iter().all(|a| a.differing == 0),
            arenas,
        })
    }

    /// The failure it is, when it is one.
    pub fn failure(&self, case: &str) -> Option<String> {
        if self.equal {
            return None;
        }
        let parts: Vec<String> = self
            .arenas
            .iter()
            .filter(|a| a.differing > 0)
            .map(|a| {
                format!(
                    "arena {}: {} of {} elements{}",
                    a.index,
                    a.differing,
                    a.len,
                    a.max_ulp
                        .map_or(String::new(), |u| format!(", up to {u} ULP"))
                )
            })
            .collect();
        Some(format!(
            "case `{case}`: differs from expect {}: {}",
            self.path,
            parts.join("; ")
        ))
    }

    /// Whether `equal` and each arena's count follow from what it lists.
    pub fn consistent(&self, lens: &[usize]) -> Result<(), String> {
        let have: Vec<usize> = self.arenas.iter().map(|a| a.len).collect();
        let indices = self.arenas.iter().enumerate().all(|(i, a)| a.index == i);
        if have != lens || !indices {
            return Err(format!(
                "expect.arenas have {have:?} elements, the case's arenas {lens:?}"
            ));
        }
        for a in &self.arenas {
            if a.differing > a.len || a.first.len() > a.differing.min(FIRST_KEPT) {
                return Err(format!(
                    "expect.arenas[{}]: {} differing of {} elements with {} listed",
                    a.index,
                    a.differing,
                    a.len,
                    a.first.len()
                ));
            }
        }
        if self.equal != self.arenas.iter().all(|a| a.differing == 0) {
            return Err("expect.equal does not follow from its arenas".into());
        }
        Ok(())
    }
}
