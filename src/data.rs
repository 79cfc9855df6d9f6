//! The deterministic addend generator: `value(seed, rank, arena, index)`.
//!
//! Integer operations only (xor, shift, wrapping multiply/add, and exact
//! int -> f32 conversions of integers below 2^24), so a GPU kernel or a
//! third party can reproduce every bit from docs/SPEC.md. Each value is a
//! pure function of its coordinates: nothing is materialized that a caller
//! does not ask for.

use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

/// The odd constant that spaces element counters (2^64 / golden ratio).
pub const GAMMA: u64 = 0x9E37_79B9_7F4A_7C15;

/// The canonical quiet NaN every NaN is mapped to under the default policy.
pub const CANONICAL_NAN_BITS: u32 = 0x7FC0_0000;

/// The bits of +infinity; every f32 whose magnitude bits exceed them is a NaN.
pub const INFINITY_BITS: u32 = 0x7F80_0000;

/// Whether f32 `bits` are a NaN, of either sign and any payload.
pub const fn is_nan_bits(bits: u32) -> bool {
    bits & !0x8000_0000 > INFINITY_BITS
}

/// The two multipliers of [`mix64`] (the device generator gets them from here).
pub const MIX64_M1: u64 = 0xBF58_476D_1CE4_E5B9;
pub const MIX64_M2: u64 = 0x94D0_49BB_1331_11EB;

/// SplitMix64's finalizer: a bijective 64-bit mixer.
#[inline(always)]
pub const fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(MIX64_M1);
    z = (z ^ (z >> 27)).wrapping_mul(MIX64_M2);
    z ^ (z >> 31)
}

/// Xored into the seed so that seed 0 does not start from the mixer's fixed point.
pub const SEED_SALT: u64 = 0x666F_6C64_7072_696E; // "foldprin"

/// The per-(seed, rank, arena) stream key; computed once per lane.
#[inline]
pub const fn lane_key(seed: u64, rank: u32, arena: u32) -> u64 {
    mix64(mix64(mix64(seed ^ SEED_SALT) ^ rank as u64) ^ arena as u64)
}

/// The 64 raw bits for element `index` of a lane.
#[inline(always)]
pub const fn element_bits(key: u64, index: u64) -> u64 {
    mix64(key.wrapping_add(index.wrapping_mul(GAMMA)))
}

/// How the 64 raw bits become one f32 addend.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "kebab-case")]
pub enum Distribution {
    /// Sign and mantissa random, exponent spread over 2^-12 .. 2^11 (24 binades).
    #[default]
    MixedMagnitude,
    /// Multiples of 2^-24 in [-1, 1).
    Uniform,
    /// Rank pairs (2k, 2k+1) carry +L and nearly -L (L in 2^10 .. 2^21): the
    /// true sum is small while partial sums are large.
    Cancellation,
    /// Three quarters subnormal, the rest in the lowest normal binades.
    SubnormalHeavy,
    /// Mixed-magnitude with +inf, -inf, NaN (random payload) and +-0.0 mixed in.
    Specials,
    /// Integers in [-2^15, 2^15): sums are exact in any order for W <= 256.
    ExactIntegers,
}

pub const ALL_DISTRIBUTIONS: [Distribution; 6] = [
    Distribution::MixedMagnitude,
    Distribution::Uniform,
    Distribution::Cancellation,
    Distribution::SubnormalHeavy,
    Distribution::Specials,
    Distribution::ExactIntegers,
];

impl Distribution {
    pub const fn name(self) -> &'static str {
        match self {
            Distribution::MixedMagnitude => "mixed-magnitude",
            Distribution::Uniform => "uniform",
            Distribution::Cancellation => "cancellation",
            Distribution::SubnormalHeavy => "subnormal-heavy",
            Distribution::Specials => "specials",
            Distribution::ExactIntegers => "exact-integers",
        }
    }

    /// Stable small integer used by the device generator.
    pub const fn code(self) -> u32 {
        match self {
            Distribution::MixedMagnitude => 0,
            Distribution::Uniform => 1,
            Distribution::Cancellation => 2,
            Distribution::SubnormalHeavy => 3,
            Distribution::Specials => 4,
            Distribution::ExactIntegers => 5,
        }
    }
}

impl fmt::Display for Distribution {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Distribution {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        ALL_DISTRIBUTIONS
            .iter()
            .copied()
            .find(|d| d.name() == s)
            .ok_or_else(|| {
                let names: Vec<_> = ALL_DISTRIBUTIONS.iter().map(|d| d.name()).collect();
                format!(
                    "unknown distribution `{s}` (expected one of: {})",
                    names.join(", ")
                )
            })
    }
}

#[inline(always)]
const fn f32_from_parts(sign: u64, exponent: u64, mantissa: u64) -> u32 {
    ((sign as u32) << 31) | ((exponent as u32) << 23) | (mantissa as u32 & 0x007F_FFFF)
}

#[inline(always)]
fn mixed_magnitude_bits(u: u64) -> u32 {
    // 24 binades: biased exponent 115..=138, i.e. 2^-12 .. 2^11.
    let e = 115 + ((((u >> 32) & 0xFF) * 24) >> 8);
    f32_from_parts(u >> 63, e, u)
}

/// One addend's bits; `rank` only matters for `cancellation`, whose pairs
/// share a magnitude drawn from the lane of the even rank.
#[inline(always)]
pub fn addend_bits(dist: Distribution, u: u64, pair_u: u64, rank: u32) -> u32 {
    match dist {
        Distribution::MixedMagnitude => mixed_magnitude_bits(u),
        Distribution::Uniform => {
            let i = (u >> 39) as i32 - (1 << 24);
            (i as f32 * (1.0 / 16_777_216.0)).to_bits()
        }
        Distribution::Cancellation => {
            // The pair's shared magnitude L: exponent 2^10 .. 2^20, full mantissa.
            let e = 137 + ((((pair_u >> 32) & 0xFF) * 11) >> 8);
            if rank & 1 == 0 {
                f32_from_parts(0, e, pair_u)
            } else {
                // -L with its low 8 mantissa bits redrawn: the pair sums to a
                // few ulps of L, while partial sums stay large.
                f32_from_parts(1, e, (pair_u & !0xFF) | (u & 0xFF))
            }
        }
        Distribution::SubnormalHeavy => {
            let sel = (u >> 32) & 3;
            let e = if sel == 3 { 1 + ((u >> 34) & 3) } else { 0 };
            f32_from_parts(u >> 63, e, u)
        }
        Distribution::Specials => match (u >> 32) & 63 {
            0 => 0x7F80_0000, // +inf
            1 => 0xFF80_0000, // -inf
            // Quiet NaN with a random sign and payload: CPUs propagate it,
            // GPUs do not, hence the NaN policy at hashing time.
            2 => ((u >> 63) as u32) << 31 | 0x7FC0_0000 | (u as u32 & 0x003F_FFFF),
            3 => 0x8000_0000, // -0.0
            4 => 0x0000_0000, // +0.0
            _ => mixed_magnitude_bits(u),
        },
        Distribution::ExactIntegers => ((((u >> 48) as i32) - (1 << 15)) as f32).to_bits(),
    }
}

/// Everything needed to generate one rank's lane of one arena.
#[derive(Debug, Clone, Copy)]
pub struct Lane {
    pub dist: Distribution,
    pub rank: u32,
    key: u64,
    pair_key: u64,
}

impl Lane {
    pub fn new(dist: Distribution, seed: u64, rank: u32, arena: u32) -> Self {
        Lane {
            dist,
            rank,
            key: lane_key(seed, rank, arena),
            pair_key: lane_key(seed, rank & !1, arena),
        }
    }

    #[inline(always)]
    pub fn bits(&self, index: u64) -> u32 {
        let u = element_bits(self.key, index);
        let pair_u = if self.dist == Distribution::Cancellation {
            element_bits(self.pair_key, index)
        } else {
            0
        };
        addend_bits(self.dist, u, pair_u, self.rank)
    }

    #[inline(always)]
    pub fn value(&self, index: u64) -> f32 {
        f32::from_bits(self.bits(index))
    }

    /// Fill `out` with elements `start .. start + out.len()`. The match on
    /// the distribution is hoisted out of the loop so each arm vectorizes.
    pub fn fill(&self, start: u64, out: &mut [f32]) {
        #[inline(always)]
        fn run(out: &mut [f32], start: u64, key: u64, f: impl Fn(u64, u64) -> u32) {
            for (i, o) in out.iter_mut().enumerate() {
                let idx = start + i as u64;
                *o = f32::from_bits(f(element_bits(key, idx), idx));
            }
        }
        let (key, pair_key, rank) = (self.key, self.pair_key, self.rank);
        match self.dist {
            Distribution::MixedMagnitude => run(out, start, key, |u, _| mixed_magnitude_bits(u)),
            Distribution::Cancellation => run(out, start, key, |u, idx| {
                addend_bits(
                    Distribution::Cancellation,
                    u,
                    element_bits(pair_key, idx),
                    rank,
                )
            }),
            d @ (Distribution::Uniform
            | Distribution::SubnormalHeavy
            | Distribution::Specials
            | Distribution::ExactIntegers) => {
                run(out, start, key, |u, _| addend_bits(d, u, 0, rank))
            }
        }
    }
}

/// One addend, by its coordinates (the spec's `value(seed, rank, arena, index)`).
pub fn value(dist: Distribution, seed: u64, rank: u32, arena: u32, index: u64) -> f32 {
    Lane::new(dist, seed, rank, arena).value(index)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fold::{fold_fixed, fold_in_order};

    #[test]
    fn nan_bits_are_the_ieee_nans_and_nothing_else() {
        for bits in [
            0x7FC0_0000,
            0xFFC0_0000,
            0x7F80_0001,
            0xFFFF_FFFF,
            0x7FC0_0ABC,
        ] {
            assert!(is_nan_bits(bits), "{bits:#x}");
            assert!(f32::from_bits(bits).is_nan());
        }
        // Infinities, the largest finite values and zeros are not NaNs.
        for bits in [
            0x7F80_0000,
            0xFF80_0000,
            0x7F7F_FFFF,
            0xFF7F_FFFF,
            0,
            0x8000_0000,
        ] {
            assert!(!is_nan_bits(bits), "{bits:#x}");
            assert!(!f32::from_bits(bits).is_nan());
        }
    }

    fn reversed_changed(dist: Distribution, world: usize, n: u64) -> f64 {
        let lanes: Vec<Lane> = (0..world as u32)
            .map(|r| Lane::new(dist, 1, r, 0))
            .collect();
        let rev: Vec<usize> = (0..world).rev().collect();
        let mut slots = vec![0f32; world];
        let mut changed = 0;
        for i in 0..n {
            for (s, l) in slots.iter_mut().zip(&lanes) {
                *s = l.value(i);
            }
            let a = fold_fixed(&slots);
            let b = fold_in_order(&slots, &rev);
            if a.to_bits() != b.to_bits() && !(a.is_nan() && b.is_nan()) {
                changed += 1;
            }
        }
        changed as f64 / n as f64
    }

    #[test]
    fn distributions_have_the_promised_order_sensitivity() {
        // The default data must expose reordering in at least 30% of sums at W = 8.
        assert!(reversed_changed(Distribution::MixedMagnitude, 8, 50_000) >= 0.30);
        for d in [
            Distribution::Uniform,
            Distribution::Cancellation,
            Distribution::SubnormalHeavy,
            Distribution::Specials,
        ] {
            assert!(reversed_changed(d, 8, 50_000) > 0.05, "{d}");
        }
        // Exact integers are the control that no order can change.
        assert_eq!(
            reversed_changed(Distribution::ExactIntegers, 64, 50_000),
            0.0
        );
    }

    #[test]
    fn distributions_produce_what_they_promise() {
        let n = 20_000u64;
        let lane = |d, r| Lane::new(d, 9, r, 0);
        let sub = (0..n)
            .filter(|&i| {
                lane(Distribution::SubnormalHeavy, 0)
                    .value(i)
                    .is_subnormal()
            })
            .count();
        assert!(sub as u64 > n / 2, "subnormal-heavy: {sub} of {n}");
        let sp = lane(Distribution::Specials, 3);
        assert!((0..n).any(|i| sp.value(i).is_nan()));
        assert!((0..n).any(|i| sp.value(i) == f32::INFINITY));
        assert!((0..n).any(|i| sp.value(i) == f32::NEG_INFINITY));
        assert!((0..n).any(|i| sp.bits(i) == 0x8000_0000));
        for i in 0..n {
            let x = lane(Distribution::ExactIntegers, 5).value(i);
            assert!(x.fract() == 0.0 && x.abs() <= 32768.0);
            let u = lane(Distribution::Uniform, 1).value(i);
            assert!((-1.0..1.0).contains(&u));
            // Cancellation pairs: rank 1 is nearly the negation of rank 0.
            let (a, b) = (
                lane(Distribution::Cancellation, 0).value(i),
                lane(Distribution::Cancellation, 1).value(i),
            );
            assert!(a > 0.0 && b < 0.0 && (a + b).abs() <= a * 1e-4, "{a} {b}");
        }
        let mm: std::collections::BTreeSet<u32> = (0..n)
            .map(|i| (lane(Distribution::MixedMagnitude, 0).bits(i) >> 23) & 0xFF)
            .collect();
        assert_eq!(mm.len(), 24, "mixed-magnitude binades");
    }

    #[test]
    fn fill_matches_value_for_every_distribution() {
        for d in ALL_DISTRIBUTIONS {
            let l = Lane::new(d, 4, 3, 1);
            let mut buf = vec![0f32; 1000];
            l.fill(12345, &mut buf);
            for (i, v) in buf.iter().enumerate() {
                assert_eq!(v.to_bits(), l.bits(12345 + i as u64), "{d} at {i}");
            }
        }
    }
}
