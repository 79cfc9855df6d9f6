//! Digests: SHA-256 over a reduced arena's little-endian f32 bytes, after
//! the NaN policy is applied. Dumps write exactly the hashed bytes.

use serde::{Deserialize, Serialize};
use sha2::{Digest as _, Sha256};
use std::fmt;
use std::str::FromStr;

use crate::data::CANONICAL_NAN_BITS;

/// What happens to NaN bit patterns before hashing. CPUs propagate NaN
/// payloads, GPUs return their own canonical NaN: hashing raw payloads
/// would make every `specials` case differ across backends for no
/// numerical reason.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "kebab-case")]
pub enum NanPolicy {
    /// Every NaN becomes 0x7FC00000 before hashing (the default).
    #[default]
    Canonical,
    /// Hash NaN payloads as produced.
    Preserve,
}

impl NanPolicy {
    pub const fn name(self) -> &'static str {
        match self {
            NanPolicy::Canonical => "canonical",
            NanPolicy::Preserve => "preserve",
        }
    }

    #[inline(always)]
    pub fn apply(self, bits: u32) -> u32 {
        match self {
            NanPolicy::Canonical if bits & 0x7FFF_FFFF > 0x7F80_0000 => CANONICAL_NAN_BITS,
            _ => bits,
        }
    }
}

impl fmt::Display for NanPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for NanPolicy {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "canonical" => Ok(NanPolicy::Canonical),
            "preserve" => Ok(NanPolicy::Preserve),
            _ => Err(format!(
                "unknown NaN policy `{s}` (expected canonical or preserve)"
            )),
        }
    }
}

/// Streaming SHA-256 of f32 values under a NaN policy.
pub struct ArenaHasher {
    sha: Sha256,
    policy: NanPolicy,
    buf: Vec<u8>,
}

const STAGE: usize = 16 * 1024;

impl ArenaHasher {
    pub fn new(policy: NanPolicy) -> Self {
        ArenaHasher {
            sha: Sha256::new(),
            policy,
            buf: Vec::with_capacity(STAGE * 4),
        }
    }

    pub fn update(&mut self, values: &[f32]) {
        for chunk in values.chunks(STAGE) {
            let clean = self.policy == NanPolicy::Preserve || !has_nan(chunk);
            if clean && cfg!(target_endian = "little") {
                // The in-memory bytes already are the hashed bytes: no copy.
                // SAFETY: f32 has no padding and any byte pattern is a valid u8.
                let bytes = unsafe {
                    std::slice::from_raw_parts(
                        chunk.as_ptr().cast::<u8>(),
                        std::mem::size_of_val(chunk),
                    )
                };
                self.sha.update(bytes);
                continue;
            }
            self.buf.clear();
            for v in chunk {
                self.buf
                    .extend_from_slice(&self.policy.apply(v.to_bits()).to_le_bytes());
            }
            self.sha.update(&self.buf);
        }
    }

    pub fn finish(self) -> String {
        hex::encode(self.sha.finalize())
    }
}

/// Branch-free NaN scan (a max over magnitudes) so it vectorizes.
fn has_nan(values: &[f32]) -> bool {
    values
        .iter()
        .map(|v| v.to_bits() & 0x7FFF_FFFF)
        .fold(0, u32::max)
        > 0x7F80_0000
}

/// SHA-256 (hex) of one arena under `policy`.
pub fn digest_arena(values: &[f32], policy: NanPolicy) -> String {
    let mut h = ArenaHasher::new(policy);
    h.update(values);
    h.finish()
}

/// The exact bytes that are hashed (for dumps).
pub fn hashed_bytes(values: &[f32], policy: NanPolicy) -> Vec<u8> {
    let mut out = Vec::with_capacity(values.len() * 4);
    for v in values {
        out.extend_from_slice(&policy.apply(v.to_bits()).to_le_bytes());
    }
    out
}

/// SHA-256 of raw bytes (hex).
pub fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_arena_hashes_to_sha256_of_nothing() {
        assert_eq!(
            digest_arena(&[], NanPolicy::Canonical),
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
    }

    #[test]
    fn canonical_policy_merges_nan_payloads_and_preserve_does_not() {
        let a = [f32::from_bits(0x7FC0_0001), 1.0];
        let b = [f32::from_bits(0xFFFF_FFFF), 1.0];
        assert_eq!(
            digest_arena(&a, NanPolicy::Canonical),
            digest_arena(&b, NanPolicy::Canonical)
        );
        assert_ne!(
            digest_arena(&a, NanPolicy::Preserve),
            digest_arena(&b, NanPolicy::Preserve)
        );
        // Infinities are not NaNs.
        assert_eq!(NanPolicy::Canonical.apply(0x7F80_0000), 0x7F80_0000);
        assert_eq!(NanPolicy::Canonical.apply(0xFF80_0000), 0xFF80_0000);
    }

    #[test]
    fn streaming_equals_one_shot() {
        let v: Vec<f32> = (0..100_000).map(|i| i as f32 * 0.37).collect();
        let mut h = ArenaHasher::new(NanPolicy::Canonical);
        h.update(&v[..12345]);
        h.update(&v[12345..]);
        assert_eq!(
            h.finish(),
            sha256_hex(&hashed_bytes(&v, NanPolicy::Canonical))
        );
    }
}
