//! Order sensitivity: how many elements change bits when the fold order is
//! reversed. A case whose data cannot see reordering proves nothing about
//! delivery-order immunity, so the report flags it.
//!
//! Computed on the host from the generator alone (it never looks at a
//! backend's output), over every element when the case is small and a
//! fixed stride sample otherwise.

use crate::data::Lane;
use crate::experiment::Case;
use crate::fold::{fold_fixed, fold_in_order};
use rayon::prelude::*;
use serde::{Deserialize, Serialize};

/// Elements checked at most per case.
pub const SAMPLE_CAP: u64 = 1 << 20;
/// Below this fraction a case is reported as weakly sensitive.
pub const WEAK_BELOW: f64 = 0.01;

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Sensitivity {
    /// Elements whose reversed-order fold differs in bits (NaNs compare equal).
    pub changed: u64,
    pub checked: u64,
    pub fraction: f64,
    /// `every element` or `stride S`.
    pub sample: String,
    pub verdict: Verdict,
}

/// What a case's data can show about fold order. In reports: `sensitive`,
/// `weak` or `blind`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Verdict {
    /// At least [`WEAK_BELOW`] of the checked elements change bits.
    Sensitive,
    /// Some elements change bits, fewer than [`WEAK_BELOW`] of them.
    Weak,
    /// No checked element changes bits: agreement across orders proves nothing.
    Blind,
}

impl Verdict {
    /// The verdict of `changed` elements, a `fraction` of those checked.
    pub fn of(changed: u64, fraction: f64) -> Verdict {
        if changed == 0 {
            Verdict::Blind
        } else if fraction < WEAK_BELOW {
            Verdict::Weak
        } else {
            Verdict::Sensitive
        }
    }

    /// The word a report uses for it.
    pub const fn name(self) -> &'static str {
        match self {
            Verdict::Sensitive => "sensitive",
            Verdict::Weak => "weak",
            Verdict::Blind => "blind",
        }
    }
}

impl std::fmt::Display for Verdict {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.pad(self.name())
    }
}

pub fn measure(case: &Case) -> Sensitivity {
    let total = case.total_len();
    let stride = total.div_ceil(SAMPLE_CAP).max(1);
    let world = case.world();
    let reversed: Vec<usize> = (0..world).rev().collect();
    let mut changed = 0u64;
    let mut checked = 0u64;
    for (a, &n) in case.arenas().iter().enumerate() {
        let lanes: Vec<Lane> = (0..world as u32)
            .map(|r| Lane::new(case.distribution(), case.seed(), r, a as u32))
            .collect();
        let picks = (n as u64).div_ceil(stride);
        let (c, k) = (0..picks)
            .into_par_iter()
            .fold(
                || (0u64, 0u64, vec![0f32; world]),
                |(c, k, mut slots), p| {
                    let i = p * stride;
                    for (s, l) in slots.iter_mut().zip(&lanes) {
                        *s = l.value(i);
                    }
                    let fwd = fold_fixed(&slots);
                    let rev = fold_in_order(&slots, &reversed);
                    let same = fwd.to_bits() == rev.to_bits() || (fwd.is_nan() && rev.is_nan());
                    (c + u64::from(!same), k + 1, slots)
                },
            )
            .map(|(c, k, _)| (c, k))
            .reduce(|| (0, 0), |x, y| (x.0 + y.0, x.1 + y.1));
        changed += c;
        checked += k;
    }
    let fraction = if checked == 0 {
        0.0
    } else {
        changed as f64 / checked as f64
    };
    Sensitivity {
        changed,
        checked,
        fraction,
        sample: if stride == 1 {
            "every element".into()
        } else {
            format!("stride {stride}")
        },
        verdict: Verdict::of(changed, fraction),
    }
}

/// Most element-adds [`sequences_differ`] spends (elements x W x sequences).
pub const SEQUENCE_CHECK_CAP: u64 = 1 << 26;

/// Whether the data of a case with these parameters can tell the fold
/// sequences `seqs` apart: `Some(true)` when some element folds to other
/// bits under two of them, `Some(false)` when every element was checked and
/// none does (agreement is then a coincidence of the data, not a blind
/// harness), `None` when that was not worked out (too large, or a sequence
/// that is not a permutation of the ranks).
pub fn sequences_differ(p: &crate::experiment::CaseParams, seqs: &[Vec<usize>]) -> Option<bool> {
    let world = p.world;
    let total: u64 = p.arenas.iter().map(|&n| n as u64).sum();
    let work = total
        .saturating_mul(world as u64)
        .saturating_mul(seqs.len() as u64);
    let permutation = |s: &Vec<usize>| {
        let mut seen = vec![false; world];
        s.len() == world
            && s.iter()
                .all(|&r| r < world && !std::mem::replace(&mut seen[r], true))
    };
    if seqs.len() < 2 || work > SEQUENCE_CHECK_CAP || !seqs.iter().all(permutation) {
        return None;
    }
    let scale = p.mean.then(|| crate::fold::mean_scale(world));
    let bits = |v: f32| {
        let v = scale.map_or(v, |k| v * k);
        // NaNs compare equal, as in the digests' default policy.
        if v.is_nan() {
            u32::MAX
        } else {
            v.to_bits()
        }
    };
    for (a, &n) in p.arenas.iter().enumerate() {
        let lanes: Vec<Lane> = (0..world as u32)
            .map(|r| Lane::new(p.distribution, p.seed, r, a as u32))
            .collect();
        let mut slots = vec![0f32; world];
        for i in 0..n as u64 {
            for (s, l) in slots.iter_mut().zip(&lanes) {
                *s = l.value(i);
            }
            let first = bits(fold_in_order(&slots, &seqs[0]));
            if seqs[1..]
                .iter()
                .any(|q| bits(fold_in_order(&slots, q)) != first)
            {
                return Some(true);
            }
        }
    }
    Some(false)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn verdicts_follow_the_counts() {
        assert_eq!(Verdict::of(0, 0.0), Verdict::Blind);
        assert_eq!(Verdict::of(1, 0.5 * WEAK_BELOW), Verdict::Weak);
        assert_eq!(Verdict::of(1, WEAK_BELOW), Verdict::Sensitive);
    }

    #[test]
    fn verdicts_serialize_as_their_names() {
        for v in [Verdict::Sensitive, Verdict::Weak, Verdict::Blind] {
            let json = serde_json::to_string(&v).unwrap();
            assert_eq!(json, format!("\"{}\"", v.name()));
            assert_eq!(serde_json::from_str::<Verdict>(&json).unwrap(), v);
            assert_eq!(format!("{v:<10}|"), format!("{:<10}|", v.name()));
        }
        let err = serde_json::from_str::<Verdict>("\"blnd\"").unwrap_err();
        assert!(
            err.to_string()
                .contains("unknown variant `blnd`, expected one of `sensitive`, `weak`, `blind`"),
            "{err}"
        );
    }
}
