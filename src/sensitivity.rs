//! Order sensitivity: how many elements change bits when the fold order is
//! reversed. A case whose data cannot see reordering proves nothing about
//! delivery-order immunity, so the report flags it.
//!
//! Computed on the host from the addends alone, the generator's or the
//! rank files' (it never looks at a backend's output), over every element
//! when the case is small and a fixed stride sample otherwise. A 16-bit
//! case is judged on its result: both folds run in float32 and are
//! rounded once to the dtype, and only bits of the dtype count.

use crate::addends::AddendError;
use crate::data::Lane;
use crate::dtype::Dtype;
use crate::experiment::{Addends, Case};
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

/// The sample of a case: every `stride`-th element of each arena.
pub fn stride(case: &Case) -> u64 {
    case.total_len().div_ceil(SAMPLE_CAP).max(1)
}

/// How many elements of an arena of `n` the sample takes.
pub fn picks(n: usize, stride: u64) -> u64 {
    (n as u64).div_ceil(stride)
}

/// The sensitivity of `case`, from the generator or the rank files (read
/// here: every rank's file must be open in this process).
pub fn measure(case: &Case) -> Result<Sensitivity, AddendError> {
    let _ieee = crate::fpenv::IeeeMode::enter();
    let stride = stride(case);
    let world = case.world();
    let dtype = case.dtype();
    let mut counts = Vec::new();
    for (a, &n) in case.arenas().iter().enumerate() {
        let picks = picks(n, stride);
        counts.push(match case.addends() {
            Addends::Generated { seed, distribution } => {
                let lanes: Vec<Lane> = (0..world as u32)
                    .map(|r| Lane::new(*distribution, *seed, r, a as u32))
                    .collect();
                count(world, picks, dtype, |r, p| lanes[r].value(p * stride))
            }
            Addends::Files(f) => {
                let samples = (0..world)
                    .into_par_iter()
                    .map(|r| f.sample(r, a, stride, picks))
                    .collect::<Result<Vec<_>, _>>()?;
                count(world, picks, dtype, |r, p| samples[r][p as usize])
            }
        });
    }
    Ok(of_counts(&counts, stride))
}

/// The sensitivity of rank samples gathered elsewhere: for each arena,
/// each rank's values at the sample's positions.
pub fn of_samples(case: &Case, samples: &[Vec<Vec<f32>>]) -> Sensitivity {
    let counts: Vec<(u64, u64)> = samples
        .iter()
        .map(|ranks| {
            let picks = ranks.first().map_or(0, |r| r.len() as u64);
            count(ranks.len(), picks, case.dtype(), |r, p| {
                ranks[r][p as usize]
            })
        })
        .collect();
    of_counts(&counts, stride(case))
}

/// (changed, checked) over `picks` positions whose rank values `value` gives.
/// In a 16-bit dtype the addends are the dtype's (the generator's value
/// rounded once; a sample already in the dtype stays as it is) and both
/// chains are compared as the dtype's bits, as the digests see them: a
/// difference the one rounding erases cannot show in any digest.
fn count(
    world: usize,
    picks: u64,
    dtype: Dtype,
    value: impl Fn(usize, u64) -> f32 + Sync,
) -> (u64, u64) {
    let reversed: Vec<usize> = (0..world).rev().collect();
    (0..picks)
        .into_par_iter()
        .fold(
            || (0u64, 0u64, vec![0f32; world]),
            |(c, k, mut slots), p| {
                for (r, s) in slots.iter_mut().enumerate() {
                    *s = dtype.quantize(value(r, p));
                }
                let fwd = dtype.narrow(fold_fixed(&slots));
                let rev = dtype.narrow(fold_in_order(&slots, &reversed));
                let same = fwd == rev || (dtype.is_nan(fwd) && dtype.is_nan(rev));
                (c + u64::from(!same), k + 1, slots)
            },
        )
        .map(|(c, k, _)| (c, k))
        .reduce(|| (0, 0), |x, y| (x.0 + y.0, x.1 + y.1))
}

fn of_counts(counts: &[(u64, u64)], stride: u64) -> Sensitivity {
    let changed: u64 = counts.iter().map(|c| c.0).sum();
    let checked: u64 = counts.iter().map(|c| c.1).sum();
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
    // Only the generator's addends can be remade from a report.
    let (Some(seed), Some(distribution)) = (p.seed, p.distribution) else {
        return None;
    };
    let scale = p.mean.then(|| crate::fold::mean_scale(world));
    let dtype = p.dtype.unwrap_or_default();
    let bits = |v: f32| {
        // The digests' bits: scaled, then rounded once to the dtype.
        let b = dtype.narrow(scale.map_or(v, |k| v * k));
        // NaNs compare equal, as in the digests' default policy.
        if dtype.is_nan(b) {
            u32::MAX
        } else {
            b
        }
    };
    for (a, &n) in p.arenas.iter().enumerate() {
        let lanes: Vec<Lane> = (0..world as u32)
            .map(|r| Lane::new(distribution, seed, r, a as u32))
            .collect();
        let mut slots = vec![0f32; world];
        for i in 0..n as u64 {
            for (s, l) in slots.iter_mut().zip(&lanes) {
                *s = dtype.quantize(l.value(i));
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

    /// The elements where the CPU oracle's fixed-order result and its
    /// descending arrival-order result differ as the digests see them
    /// (the dtype's bits, any NaN equal to any NaN).
    fn oracle_count(case: &Case) -> u64 {
        use crate::backend::{cpu::CpuBackend, Backend, RunOptions};
        use crate::experiment::DeliveryOrder;
        let opts = RunOptions {
            nan_policy: crate::digest::NanPolicy::Canonical,
            keep_values: true,
        };
        let values = |c: &Case| {
            CpuBackend::new().run_case(c, &opts).unwrap().arenas[0]
                .values
                .clone()
                .unwrap()
        };
        let fwd = values(case);
        let rev = values(
            &case
                .clone()
                .with_contract(crate::fold::Contract::ArrivalOrder)
                .with_order(DeliveryOrder::Descending)
                .unwrap(),
        );
        let d = case.dtype();
        fwd.iter()
            .zip(&rev)
            .filter(|(x, y)| {
                let (x, y) = (d.narrow(**x), d.narrow(**y));
                x != y && !(d.is_nan(x) && d.is_nan(y))
            })
            .count() as u64
    }

    #[test]
    fn a_16_bit_case_counts_what_its_digests_can_see() {
        // W = 64: with float32 accumulation and one rounding, smaller
        // worlds of this data are blind in bf16 (docs/SPEC.md §8.7).
        let mut changed = Vec::new();
        for dtype in [Dtype::F32, Dtype::Bf16, Dtype::F16] {
            let case = Case::builder(64, [20011])
                .seed(4)
                .dtype(Some(dtype))
                .build()
                .unwrap();
            let s = measure(&case).unwrap();
            assert_eq!(s.checked, 20011);
            assert_eq!(s.changed, oracle_count(&case), "{dtype}");
            let seqs = vec![(0..64).collect(), (0..64).rev().collect()];
            assert_eq!(
                sequences_differ(&case.params(), &seqs),
                Some(s.changed > 0),
                "{dtype}"
            );
            changed.push(s.changed);
        }
        // The one rounding hides most reorderings: counting float32 bits
        // in a 16-bit case would report far more.
        assert!(changed[1] > 0 && changed[2] > 0, "{changed:?}");
        assert!(
            changed[1] < changed[0] && changed[2] < changed[0],
            "{changed:?}"
        );
    }

    #[test]
    fn a_16_bit_case_counts_only_orders_its_rounded_result_tells_apart() {
        // 1 + 2^-24 + 2^-24: ascending rounds both halves away (1), reversed
        // keeps them (1 + 2^-23); bf16 and f16 round both to 1.
        let small = f32::from_bits(0x3380_0000);
        let absorbed = [1.0, small, small];
        let c = |dtype, v: [f32; 3]| count(3, 1, dtype, |r, _| v[r]);
        assert_eq!(c(Dtype::F32, absorbed), (1, 1));
        assert_eq!(c(Dtype::Bf16, absorbed), (0, 1));
        assert_eq!(c(Dtype::F16, absorbed), (0, 1));
        // Control: 2^15 + 2^-9 - 2^15 is 0 ascending (the tie goes to the
        // even 2^15) and 2^-9 reversed, values every dtype holds.
        let cancel = [32768.0, f32::from_bits(0x3B00_0000), -32768.0];
        for d in [Dtype::F32, Dtype::Bf16, Dtype::F16] {
            assert!(cancel.iter().all(|x| d.holds(*x)));
            assert_eq!(c(d, cancel), (1, 1), "{d}");
        }
    }

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
