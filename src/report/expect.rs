//! `expect`: a framework's reduced result (e.g. what
//! `torch.distributed.all_reduce` left in each rank's gradients) compared
//! bit for bit with the case's, arena by arena, in the case's dtype, with
//! the differing elements counted and their ULP distances in that dtype.

use super::localize::{
    diff_bits_in, held_bits, hex_bits, ulp_bucket, ulp_distance_in, ElementDiff,
};
use crate::addends::{AddendError, ExpectFile};
use crate::digest::{NanPolicy, Sha256};
use crate::dtype::Dtype;
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
    /// The differing elements that are not NaN, counted per power-of-two
    /// bucket of their ULP distance: `[0]` distance 0 (-0 against +0),
    /// `[k]` distances 2^(k-1) ..= 2^k - 1; no trailing zero, and absent
    /// when there is no such element (so an equal arena's record is as
    /// before). The NaN differences are `differing` less its sum.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ulp_histogram: Vec<u64>,
}

impl ExpectOutcome {
    /// Compare `results` (the case's reduced arenas, rank 0's copy) with
    /// the file, both as bits of the case's `dtype` under the run's NaN
    /// policy, as the digests are (canonical: every NaN equals every NaN;
    /// the differences listed are the dtype's bits as hashed).
    pub fn compare(
        file: &ExpectFile,
        results: &[&[f32]],
        dtype: Dtype,
        policy: NanPolicy,
    ) -> Result<ExpectOutcome, AddendError> {
        let mut arenas = Vec::with_capacity(results.len());
        for (index, ours) in results.iter().enumerate() {
            let theirs = file.read(index)?;
            let bits = |v: &[f32]| {
                v.iter()
                    .map(|x| policy.apply_in(dtype, held_bits(dtype, *x)))
                    .collect::<Vec<u32>>()
            };
            let d = diff_bits_in(dtype, &bits(ours), &bits(&theirs), FIRST_KEPT);
            arenas.push(ExpectArena {
                index,
                len: ours.len(),
                differing: d.differing,
                max_ulp: d.max_ulp,
                first: d.first,
                ulp_histogram: d.histogram,
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

    /// The failure it is, when it is one (ULPs counted in `dtype`).
    pub fn failure(&self, case: &str, dtype: Dtype) -> Option<String> {
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
                    a.max_ulp.map_or(String::new(), |u| if dtype.is_f32() {
                        format!(", up to {u} ULP")
                    } else {
                        format!(", up to {u} ULP of {dtype}")
                    })
                )
            })
            .collect();
        Some(format!(
            "case `{case}`: differs from expect {}: {}",
            self.path,
            parts.join("; ")
        ))
    }

    /// Every way the block contradicts itself, the case's arena lengths
    /// `lens`, its `dtype` or its NaN policy: whatever can be recomputed
    /// from the block must agree (a forged count, distance or verdict is
    /// refused).
    pub fn problems(&self, lens: &[usize], dtype: Dtype, policy: NanPolicy) -> Vec<String> {
        let mut out = Vec::new();
        let have: Vec<usize> = self.arenas.iter().map(|a| a.len).collect();
        let indices = self.arenas.iter().enumerate().all(|(i, a)| a.index == i);
        if have != lens || !indices {
            out.push(format!(
                "expect.arenas have {have:?} elements, the case's arenas {lens:?}"
            ));
            return out;
        }
        for a in &self.arenas {
            let at = format!("expect.arenas[{}]", a.index);
            let listed = a.first.len();
            if a.differing > a.len || listed != a.differing.min(FIRST_KEPT) {
                out.push(format!(
                    "{at}: {} differing of {} elements with {listed} listed (a run lists the first {} differences, up to {FIRST_KEPT})",
                    a.differing, a.len, a.differing.min(FIRST_KEPT)
                ));
            }
            let mut last = None;
            for (k, d) in a.first.iter().enumerate() {
                let at = format!("{at}.first[{k}]");
                if d.index >= a.len {
                    out.push(format!(
                        "{at}: index {} is past the arena's {} elements",
                        d.index, a.len
                    ));
                }
                if last.is_some_and(|l| d.index <= l) {
                    out.push(format!(
                        "{at}: index {} does not follow {} (differences are listed in ascending order)",
                        d.index,
                        last.unwrap_or_default()
                    ));
                }
                last = Some(d.index);
                let widest = if dtype.is_f32() { u32::MAX } else { 0xFFFF };
                if d.left > widest || d.right > widest {
                    out.push(format!(
                        "{at}: 0x{:x} and 0x{:x} are not both {dtype} bits, the case's dtype",
                        d.left, d.right
                    ));
                    continue;
                }
                let (l, r) = (hex_bits(dtype, d.left), hex_bits(dtype, d.right));
                if policy.apply_in(dtype, d.left) == policy.apply_in(dtype, d.right) {
                    out.push(format!(
                        "{at}: {l} and {r} are equal under NaN policy `{policy}`, yet listed as a difference"
                    ));
                }
                let ulp = ulp_distance_in(dtype, d.left, d.right);
                if d.ulp != ulp {
                    let say =
                        |u: Option<u64>| u.map_or("none (NaN)".to_string(), |u| u.to_string());
                    out.push(format!(
                        "{at}: ULP distance {} but {l} and {r} are {} apart",
                        say(d.ulp),
                        say(ulp)
                    ));
                }
            }
            // The largest distance: at least every listed one, and exactly
            // theirs when every difference is listed.
            let listed_max = a.first.iter().filter_map(|d| d.ulp).max();
            let bad_max = if listed == a.differing {
                a.max_ulp != listed_max
            } else {
                a.max_ulp < listed_max
            };
            if bad_max {
                out.push(format!(
                    "{at}: max_ulp {} does not follow from its differences (listed: {})",
                    a.max_ulp.map_or("null".into(), |u| u.to_string()),
                    listed_max.map_or("none".into(), |u| u.to_string())
                ));
            }
            histogram_problems(a, &at, &mut out);
        }
        if self.equal != self.arenas.iter().all(|a| a.differing == 0) {
            out.push("expect.equal does not follow from its arenas".into());
        }
        out
    }
}

/// The ULP histogram against the arena's other fields. Absent with
/// distances to count is a report written before histograms were kept:
/// accepted, and `plot` says it cannot draw it.
fn histogram_problems(a: &ExpectArena, at: &str, out: &mut Vec<String>) {
    let h = &a.ulp_histogram;
    if h.is_empty() {
        return;
    }
    let mut bad = |m: String| out.push(format!("{at}.ulp_histogram {h:?}: {m}"));
    if h.last() == Some(&0) {
        bad("ends in an empty bucket (a run leaves them out)".into());
    }
    let sum = h.iter().try_fold(0u64, |s, &c| s.checked_add(c));
    let nan = sum.and_then(|s| (a.differing as u64).checked_sub(s));
    let Some(nan) = nan else {
        return bad(format!(
            "counts more elements than the {} differing",
            a.differing
        ));
    };
    match a.max_ulp {
        Some(m) if ulp_bucket(m) + 1 != h.len() => bad(format!(
            "its last bucket is {}, max_ulp {m} is in bucket {}",
            h.len() - 1,
            ulp_bucket(m)
        )),
        None => bad("counts distances, max_ulp says there are none".into()),
        _ => {}
    }
    // The listed differences are some of those counted, every one of
    // them when all are listed.
    let mut listed = vec![0u64; h.len()];
    let mut listed_nan = 0u64;
    for d in &a.first {
        match d.ulp.map(ulp_bucket) {
            Some(k) if k < listed.len() => listed[k] += 1,
            Some(_) => {} // past the last bucket: max_ulp's check says it
            None => listed_nan += 1,
        }
    }
    let short = listed.iter().zip(h).any(|(l, c)| l > c) || listed_nan > nan;
    let all = a.first.len() == a.differing;
    if short || (all && (listed != *h || listed_nan != nan)) {
        bad(format!(
            "does not hold the listed differences (per bucket {listed:?}, {listed_nan} NaN)"
        ));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn outcome(first: Vec<ElementDiff>, differing: usize, max_ulp: Option<u64>) -> ExpectOutcome {
        ExpectOutcome {
            path: "e.safetensors".into(),
            sha256: Sha256::of(b"e"),
            bytes: 1,
            equal: differing == 0,
            arenas: vec![ExpectArena {
                index: 0,
                len: 4,
                differing,
                max_ulp,
                first,
                ulp_histogram: Vec::new(),
            }],
        }
    }

    fn pair(index: usize, left: u32, right: u32) -> ElementDiff {
        ElementDiff {
            index,
            left,
            right,
            ulp: ulp_distance_in(Dtype::F32, left, right),
        }
    }

    #[test]
    fn nan_pairs_are_differences_only_where_the_policy_keeps_payloads() {
        let (x86, quiet) = (0xffc0_0000u32, 0x7fc0_0000u32);
        let e = outcome(vec![pair(0, x86, quiet)], 1, None);
        assert_eq!(
            e.problems(&[4], Dtype::F32, NanPolicy::Preserve),
            Vec::<String>::new()
        );
        assert_eq!(
            e.problems(&[4], Dtype::F32, NanPolicy::Canonical),
            vec!["expect.arenas[0].first[0]: 0xffc00000 and 0x7fc00000 are equal under NaN policy `canonical`, yet listed as a difference".to_string()]
        );
    }

    #[test]
    fn max_ulp_follows_from_the_listed_differences() {
        let one = 1.0f32.to_bits();
        let listed = vec![pair(1, one, one + 2), pair(3, one, one + 5)];
        assert!(outcome(listed.clone(), 2, Some(5))
            .problems(&[4], Dtype::F32, NanPolicy::Canonical)
            .is_empty());
        for wrong in [None, Some(4), Some(6)] {
            let p =
                outcome(listed.clone(), 2, wrong).problems(&[4], Dtype::F32, NanPolicy::Canonical);
            assert_eq!(p.len(), 1, "{wrong:?}: {p:?}");
            assert!(p[0].contains("max_ulp"), "{p:?}");
        }
        // Out of order, or twice the same element.
        let p = outcome(vec![listed[1].clone(), listed[0].clone()], 2, Some(5)).problems(
            &[4],
            Dtype::F32,
            NanPolicy::Canonical,
        );
        assert!(p[0].contains("does not follow 3"), "{p:?}");
    }

    #[test]
    fn the_ulp_histogram_follows_from_the_listed_differences() {
        let one = 1.0f32.to_bits();
        // Distances 2 (bucket 2) and 5 (bucket 3), and a NaN pair.
        let listed = vec![
            pair(0, one, one + 2),
            pair(1, one, one + 5),
            pair(2, one, 0x7fc0_0001),
        ];
        let with = |h: Vec<u64>, differing: usize| {
            let mut e = outcome(listed.clone(), differing, Some(5));
            e.arenas[0].ulp_histogram = h;
            e.problems(&[4], Dtype::F32, NanPolicy::Preserve)
        };
        assert_eq!(with(vec![0, 0, 1, 1], 3), Vec::<String>::new());
        // Older reports carry none.
        assert_eq!(with(vec![], 3), Vec::<String>::new());
        let wrong: [(Vec<u64>, usize, &str); 5] = [
            (vec![0, 0, 2, 1], 3, "does not hold the listed"),
            (vec![0, 1, 0, 1], 3, "does not hold the listed"),
            (vec![0, 0, 1, 1, 0], 3, "ends in an empty bucket"),
            (vec![0, 0, 1, 1, 1], 4, "max_ulp 5 is in bucket 3"),
            (vec![3, 0, 1, 1], 4, "more elements than the 4 differing"),
        ];
        for (h, differing, said) in wrong {
            let p = with(h.clone(), differing);
            assert!(p.iter().any(|m| m.contains(said)), "{h:?}: {p:?}");
        }
    }
}
