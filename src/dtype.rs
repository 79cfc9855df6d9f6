//! Element types a case reduces in, and the two conversions mixed precision
//! rests on: widening a 16-bit value to float32 (exact) and narrowing a
//! float32 once to the dtype (round to nearest, ties to even; overflow to
//! infinity). Both are integer operations on bits, written out so that the
//! CUDA kernels (`gpu/kernels/dtype.cuh`) and `tools/verify_spec.py` can
//! mirror them line for line, and tested against independent
//! implementations on every input.
//!
//! A 16-bit arena is carried on the host as float32 values that are exactly
//! the dtype's values (`widen(narrow(x))`); its bytes, digests and dumps are
//! the dtype's.

use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

/// An arena's element type.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum Dtype {
    /// IEEE 754 binary32.
    #[default]
    F32,
    /// bfloat16: the top 16 bits of a binary32.
    Bf16,
    /// IEEE 754 binary16.
    F16,
}

pub const ALL_DTYPES: [Dtype; 3] = [Dtype::F32, Dtype::Bf16, Dtype::F16];

impl Dtype {
    pub const fn name(self) -> &'static str {
        match self {
            Dtype::F32 => "f32",
            Dtype::Bf16 => "bf16",
            Dtype::F16 => "f16",
        }
    }

    /// Bytes per element.
    pub const fn bytes(self) -> usize {
        match self {
            Dtype::F32 => 4,
            Dtype::Bf16 | Dtype::F16 => 2,
        }
    }

    pub const fn is_f32(self) -> bool {
        matches!(self, Dtype::F32)
    }

    /// The NaN a `canonical` NaN policy hashes, in the dtype's bits.
    pub const fn canonical_nan(self) -> u32 {
        match self {
            Dtype::F32 => 0x7FC0_0000,
            Dtype::Bf16 => 0x7FC0,
            Dtype::F16 => 0x7E00,
        }
    }

    /// Whether `bits` (the dtype's, in the low bits) are a NaN.
    pub const fn is_nan(self, bits: u32) -> bool {
        match self {
            Dtype::F32 => bits & 0x7FFF_FFFF > 0x7F80_0000,
            Dtype::Bf16 => bits & 0x7FFF > 0x7F80,
            Dtype::F16 => bits & 0x7FFF > 0x7C00,
        }
    }

    /// The dtype's bits of a float32, rounded once (the identity for f32).
    #[inline(always)]
    pub fn narrow(self, x: f32) -> u32 {
        let b = x.to_bits();
        match self {
            Dtype::F32 => b,
            Dtype::Bf16 => u32::from(narrow_bf16(b)),
            Dtype::F16 => u32::from(narrow_f16(b)),
        }
    }

    /// The float32 of the dtype's bits, exactly.
    #[inline(always)]
    pub fn widen(self, bits: u32) -> f32 {
        match self {
            Dtype::F32 => f32::from_bits(bits),
            Dtype::Bf16 => f32::from_bits(widen_bf16(bits as u16)),
            Dtype::F16 => f32::from_bits(widen_f16(bits as u16)),
        }
    }

    /// `x` rounded to the dtype and carried as float32.
    #[inline(always)]
    pub fn quantize(self, x: f32) -> f32 {
        match self {
            Dtype::F32 => x,
            _ => self.widen(self.narrow(x)),
        }
    }

    /// [`Dtype::quantize`] over a slice, in place.
    pub fn quantize_all(self, values: &mut [f32]) {
        if !self.is_f32() {
            for v in values {
                *v = self.quantize(*v);
            }
        }
    }

    /// Whether `x` is exactly a value of the dtype (so narrowing loses
    /// nothing; a NaN counts when its payload survives).
    pub fn holds(self, x: f32) -> bool {
        self.widen(self.narrow(x)).to_bits() == x.to_bits()
    }

    /// The little-endian bytes of the dtype's bits.
    #[inline(always)]
    pub fn put_le(self, bits: u32, out: &mut Vec<u8>) {
        match self {
            Dtype::F32 => out.extend_from_slice(&bits.to_le_bytes()),
            Dtype::Bf16 | Dtype::F16 => out.extend_from_slice(&(bits as u16).to_le_bytes()),
        }
    }

    /// Position of `bits` on the dtype's number line: adjacent values are
    /// one apart, and -0 and +0 are both 0. For ULP distances.
    pub fn ordinal(self, bits: u32) -> i64 {
        let (sign, magnitude) = match self {
            Dtype::F32 => (bits & 0x8000_0000 != 0, bits & 0x7FFF_FFFF),
            Dtype::Bf16 | Dtype::F16 => (bits & 0x8000 != 0, bits & 0x7FFF),
        };
        if sign {
            -i64::from(magnitude)
        } else {
            i64::from(magnitude)
        }
    }
}

impl fmt::Display for Dtype {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(self.name())
    }
}

impl FromStr for Dtype {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        ALL_DTYPES
            .iter()
            .copied()
            .find(|d| d.name() == s)
            .ok_or_else(|| format!("unknown dtype `{s}` (expected f32, bf16 or f16)"))
    }
}

/// A stored 16-bit pattern of `dtype` as a case carries it: narrowing its
/// exact widening, which is the pattern itself except that a signalling
/// NaN gets the quiet bit (`narrow(widen(h))`, without the two steps).
pub const fn carried_bits16(dtype: Dtype, h: u16) -> u16 {
    match dtype {
        Dtype::Bf16 if h & 0x7F80 == 0x7F80 && h & 0x007F != 0 => h | 0x0040,
        Dtype::F16 if h & 0x7C00 == 0x7C00 && h & 0x03FF != 0 => h | 0x0200,
        _ => h,
    }
}

/// bfloat16 is the top half of a binary32: widening appends 16 zero bits.
#[inline(always)]
pub const fn widen_bf16(h: u16) -> u32 {
    (h as u32) << 16
}

/// binary32 to bfloat16, nearest-even. A NaN keeps its sign and the top
/// of its payload and is made quiet, so it stays a NaN.
#[inline(always)]
pub const fn narrow_bf16(b: u32) -> u16 {
    if b & 0x7FFF_FFFF > 0x7F80_0000 {
        return ((b >> 16) | 0x0040) as u16;
    }
    // Adding 0x7FFF plus the kept part's lowest bit rounds half to even; a
    // carry out of the fraction steps the exponent, up to infinity.
    ((b + 0x7FFF + ((b >> 16) & 1)) >> 16) as u16
}

/// binary16 to binary32, exactly.
#[inline(always)]
pub const fn widen_f16(h: u16) -> u32 {
    let sign = ((h & 0x8000) as u32) << 16;
    let exp = ((h >> 10) & 0x1F) as u32;
    let frac = (h & 0x3FF) as u32;
    if exp == 0x1F {
        // Infinity, or a NaN whose payload moves up unchanged.
        return sign | 0x7F80_0000 | (frac << 13);
    }
    if exp != 0 {
        return sign | ((exp + 112) << 23) | (frac << 13);
    }
    if frac == 0 {
        return sign;
    }
    // Subnormal: frac * 2^-24, normal in binary32. `top` is the position of
    // frac's leading one (0..=9).
    let top = 31 - frac.leading_zeros();
    sign | ((top + 103) << 23) | ((frac << (23 - top)) & 0x7F_FFFF)
}

/// binary32 to binary16, nearest-even, overflow to infinity, subnormals
/// kept. A NaN keeps its sign and the top of its payload and is made quiet.
#[inline(always)]
pub const fn narrow_f16(b: u32) -> u16 {
    let sign = ((b >> 16) & 0x8000) as u16;
    let a = b & 0x7FFF_FFFF;
    if a > 0x7F80_0000 {
        return sign | 0x7C00 | 0x0200 | ((a >> 13) & 0x3FF) as u16;
    }
    // 65520 is halfway between the largest finite (65504) and 2^16: a tie
    // that goes to the even neighbour, which is infinity.
    if a >= 0x477F_F000 {
        return sign | 0x7C00;
    }
    if a >= 0x3880_0000 {
        // Normal: rebias the exponent (127 -> 15) and drop 13 fraction bits.
        let h = (a >> 13) - 0x1_C000;
        let rest = a & 0x1FFF;
        let up = rest > 0x1000 || (rest == 0x1000 && h & 1 == 1);
        return sign | (h + up as u32) as u16;
    }
    // At most 2^-25 (half the smallest subnormal, a tie to even zero).
    if a <= 0x3300_0000 {
        return sign;
    }
    // Subnormal: the value in units of 2^-24 is the 24-bit significand
    // shifted right by 126 - exponent (14..=24 here); round what falls off.
    let exp = a >> 23;
    let sig = (a & 0x7F_FFFF) | 0x80_0000;
    let shift = 126 - exp;
    let h = sig >> shift;
    let rest = sig & ((1 << shift) - 1);
    let half = 1 << (shift - 1);
    let up = rest > half || (rest == half && h & 1 == 1);
    sign | (h + up as u32) as u16
}

#[cfg(test)]
mod carried_tests {
    use super::*;

    /// On every 16-bit pattern of both dtypes, the shortcut is the two
    /// conversions; and it does change a signalling NaN (negative control).
    #[test]
    fn carried_bits_are_narrowing_the_widening_on_every_pattern() {
        for h in 0..=u16::MAX {
            assert_eq!(
                carried_bits16(Dtype::Bf16, h),
                narrow_bf16(widen_bf16(h)),
                "{h:#06x}"
            );
            assert_eq!(
                carried_bits16(Dtype::F16, h),
                narrow_f16(widen_f16(h)),
                "{h:#06x}"
            );
        }
        assert_ne!(carried_bits16(Dtype::Bf16, 0x7F81), 0x7F81);
        assert_ne!(carried_bits16(Dtype::F16, 0x7C01), 0x7C01);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rayon::prelude::*;

    /// Every float32 pattern, split by its top 16 bits for the pool; the
    /// first disagreement is reported.
    fn every_f32(check: impl Fn(u32) -> Option<String> + Sync) {
        let bad = (0u32..=0xFFFF)
            .into_par_iter()
            .find_map_any(|hi| (0u32..=0xFFFF).find_map(|lo| check((hi << 16) | lo)));
        assert_eq!(bad, None);
    }

    #[test]
    fn bf16_narrowing_equals_an_independent_implementation_on_every_f32() {
        every_f32(|b| {
            let ours = narrow_bf16(b);
            let theirs = half::bf16::from_f32(f32::from_bits(b)).to_bits();
            (ours != theirs).then(|| format!("{b:#010x}: {ours:#06x} != {theirs:#06x}"))
        });
    }

    #[test]
    fn f16_narrowing_equals_an_independent_implementation_on_every_f32() {
        every_f32(|b| {
            let ours = narrow_f16(b);
            let theirs = half::f16::from_f32(f32::from_bits(b)).to_bits();
            (ours != theirs).then(|| format!("{b:#010x}: {ours:#06x} != {theirs:#06x}"))
        });
    }

    #[test]
    fn widening_is_exact_on_every_16_bit_pattern() {
        for h in 0..=u16::MAX {
            // The independent widenings quiet a signalling NaN (as x86's
            // conversion does); ours keeps every bit of the payload.
            let pairs = [
                (
                    Dtype::Bf16,
                    widen_bf16(h),
                    half::bf16::from_bits(h).to_f32(),
                ),
                (Dtype::F16, widen_f16(h), half::f16::from_bits(h).to_f32()),
            ];
            for (d, ours, theirs) in pairs {
                if d.is_nan(u32::from(h)) {
                    assert_eq!(ours | 0x0040_0000, theirs.to_bits(), "{d} {h:#06x}");
                    assert!(f32::from_bits(ours).is_nan(), "{d} {h:#06x}");
                } else {
                    assert_eq!(ours, theirs.to_bits(), "{d} {h:#06x}");
                }
            }
            assert_eq!(widen_bf16(h) >> 16, u32::from(h));
            // Narrowing gives back every value, NaNs made quiet.
            for (d, quiet) in [(Dtype::Bf16, 0x0040u32), (Dtype::F16, 0x0200)] {
                let back = d.narrow(d.widen(u32::from(h)));
                let want = if d.is_nan(u32::from(h)) {
                    u32::from(h) | quiet
                } else {
                    u32::from(h)
                };
                assert_eq!(back, want, "{d} {h:#06x}");
            }
        }
    }

    /// The rules the spec names, on hand-picked bits, so a reader sees each.
    #[test]
    fn ties_go_to_even_overflow_to_infinity_and_subnormals_survive() {
        // bf16: 1 + 2^-8 is a tie between 1 and 1 + 2^-7: even is 1.
        assert_eq!(narrow_bf16(0x3F80_8000), 0x3F80);
        assert_eq!(narrow_bf16(0x3F81_8000), 0x3F82);
        assert_eq!(narrow_bf16(0x3F80_8001), 0x3F81);
        // Truncation would keep 0x3F80 here: nearest is 0x3F81.
        assert_eq!(narrow_bf16(0x3F80_C000), 0x3F81);
        assert_eq!(narrow_bf16(f32::MAX.to_bits()), 0x7F80);
        assert_eq!(narrow_bf16(0x0000_8001), 0x0001); // subnormal rounds up
        assert_eq!(narrow_bf16(0xFFC1_2345), 0xFFC1); // NaN keeps sign, payload
        assert_eq!(narrow_bf16(0x7F80_0001), 0x7FC0); // signalling made quiet
                                                      // f16
        assert_eq!(narrow_f16(65504f32.to_bits()), 0x7BFF);
        assert_eq!(narrow_f16(65519.99f32.to_bits()), 0x7BFF);
        assert_eq!(narrow_f16(65520f32.to_bits()), 0x7C00);
        assert_eq!(narrow_f16((-1e9f32).to_bits()), 0xFC00);
        assert_eq!(narrow_f16(2f32.powi(-24).to_bits()), 0x0001);
        assert_eq!(narrow_f16(2f32.powi(-25).to_bits()), 0x0000); // tie to 0
        assert_eq!(narrow_f16((1.5 * 2f32.powi(-25)).to_bits()), 0x0001);
        assert_eq!(narrow_f16((3.0 * 2f32.powi(-25)).to_bits()), 0x0002); // tie to even
        assert_eq!(narrow_f16((1.0 + 2f32.powi(-10)).to_bits()), 0x3C01);
        assert_eq!(narrow_f16((1.0 + 2f32.powi(-11)).to_bits()), 0x3C00); // tie to even
        assert_eq!(narrow_f16(0x7F80_0001), 0x7E00);
        assert_eq!(Dtype::F16.canonical_nan(), 0x7E00);
        assert!(Dtype::F16.is_nan(0x7E00) && !Dtype::F16.is_nan(0x7C00));
    }

    #[test]
    fn ordinals_count_representable_steps() {
        for d in [Dtype::Bf16, Dtype::F16] {
            let one = d.narrow(1.0);
            assert_eq!(d.ordinal(one + 1) - d.ordinal(one), 1);
            assert_eq!(d.ordinal(0x8000), d.ordinal(0));
            assert_eq!(d.ordinal(0x8001) - d.ordinal(0x0001), -2);
        }
        assert_eq!(Dtype::F32.ordinal(0x8000_0001), -1);
    }

    #[test]
    fn names_round_trip_and_unknown_ones_are_refused() {
        for d in ALL_DTYPES {
            assert_eq!(d.name().parse::<Dtype>(), Ok(d));
        }
        assert_eq!(
            "fp16".parse::<Dtype>(),
            Err("unknown dtype `fp16` (expected f32, bf16 or f16)".to_string())
        );
    }
}
