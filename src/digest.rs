//! Digests: SHA-256 over a reduced arena's little-endian f32 bytes, after
//! the NaN policy is applied. Dumps write exactly the hashed bytes.

use serde::{Deserialize, Serialize};
use sha2::{Digest as _, Sha256 as Hasher};
use std::fmt;
use std::str::FromStr;

use crate::data::{is_nan_bits, CANONICAL_NAN_BITS, INFINITY_BITS};
use crate::dtype::Dtype;

/// A SHA-256 digest. Written as 64 lowercase hex digits, the only form a
/// report, golden or SHA256SUMS line may hold: reading any other spelling
/// fails, so two digests compare as bytes, never as strings.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct Sha256([u8; 32]);

impl Sha256 {
    /// The digest of `bytes`.
    pub fn of(bytes: &[u8]) -> Self {
        Self::from_hasher(Hasher::new().chain_update(bytes))
    }

    fn from_hasher(h: Hasher) -> Self {
        Sha256(h.finalize().into())
    }

    pub const fn from_bytes(bytes: [u8; 32]) -> Self {
        Sha256(bytes)
    }

    pub const fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }

    /// The first `n` hex digits (for tables and messages).
    pub fn short(&self, n: usize) -> String {
        let mut s = self.to_string();
        s.truncate(n);
        s
    }
}

impl fmt::Display for Sha256 {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&hex::encode(self.0))
    }
}

impl fmt::Debug for Sha256 {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Sha256({self})")
    }
}

/// A string that is not a digest as foldprint writes it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("`{0}` is not a SHA-256 digest (64 lowercase hex digits)")]
pub struct NotADigest(pub String);

impl FromStr for Sha256 {
    type Err = NotADigest;
    fn from_str(s: &str) -> Result<Self, NotADigest> {
        let lower_hex = s
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
        let mut out = [0u8; 32];
        match hex::decode_to_slice(s, &mut out) {
            Ok(()) if lower_hex => Ok(Sha256(out)),
            _ => Err(NotADigest(
                s.chars().take(80).flat_map(char::escape_debug).collect(),
            )),
        }
    }
}

impl Serialize for Sha256 {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Sha256 {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = std::borrow::Cow::<str>::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// What happens to NaN bit patterns before hashing. CPUs propagate NaN
/// payloads, GPUs return their own canonical NaN: hashing raw payloads
/// would make every `specials` case differ across backends for no
/// numerical reason.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Default)]
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

    /// [`NanPolicy::apply`] to bits of `dtype`: its canonical NaN.
    #[inline(always)]
    pub fn apply_in(self, dtype: Dtype, bits: u32) -> u32 {
        match self {
            NanPolicy::Canonical if dtype.is_nan(bits) => dtype.canonical_nan(),
            _ => bits,
        }
    }

    #[inline(always)]
    pub fn apply(self, bits: u32) -> u32 {
        match self {
            NanPolicy::Canonical if is_nan_bits(bits) => CANONICAL_NAN_BITS,
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

/// Read through [`FromStr`], so a report's unknown policy is named as one.
impl<'de> Deserialize<'de> for NanPolicy {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = std::borrow::Cow::<str>::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// Streaming SHA-256 of an arena's values under a NaN policy: float32 as
/// is, a 16-bit dtype's values (carried as float32) as the dtype's bytes.
pub struct ArenaHasher {
    sha: Hasher,
    policy: NanPolicy,
    dtype: Dtype,
    buf: Vec<u8>,
    /// Per-chunk digests (localization), when asked for.
    chunks: Option<ChunkState>,
    /// Time spent looking for NaNs (so `bench` can show what it costs).
    scan: std::time::Duration,
}

struct ChunkState {
    sha: Hasher,
    /// Bytes per chunk: `CHUNK_ELEMS` elements of the dtype.
    leaf: usize,
    /// Bytes already in the current chunk.
    filled: usize,
    done: Vec<Sha256>,
}

const STAGE: usize = 16 * 1024;

impl ChunkState {
    fn feed(&mut self, mut bytes: &[u8]) {
        while !bytes.is_empty() {
            let take = (self.leaf - self.filled).min(bytes.len());
            self.sha.update(&bytes[..take]);
            self.filled += take;
            bytes = &bytes[take..];
            if self.filled == self.leaf {
                let full = std::mem::take(&mut self.sha);
                self.done.push(Sha256::from_hasher(full));
                self.filled = 0;
            }
        }
    }

    /// [`ChunkState::feed`] with the whole chunks hashed in parallel.
    fn feed_parallel(&mut self, bytes: &[u8]) {
        use rayon::prelude::*;
        let head = if self.filled > 0 {
            (self.leaf - self.filled).min(bytes.len())
        } else {
            0
        };
        self.feed(&bytes[..head]);
        let rest = &bytes[head..];
        let whole = rest.len() / self.leaf * self.leaf;
        let digests: Vec<Sha256> = rest[..whole]
            .par_chunks(self.leaf)
            .map(Sha256::of)
            .collect();
        self.done.extend(digests);
        self.feed(&rest[whole..]);
    }
}

/// Elements per localization chunk (256 KiB of f32, 128 KiB of a 16-bit
/// dtype).
pub const CHUNK_ELEMS: usize = 1 << 16;

/// An arena's digest plus the digests of its fixed-size chunks.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ChunkedDigest {
    pub sha256: Sha256,
    /// SHA-256 of each `CHUNK_ELEMS`-element chunk of the hashed bytes (the
    /// last one may be shorter); empty for an empty arena.
    pub chunks: Vec<Sha256>,
}

/// SHA-256 over the concatenated raw chunk digests: one value that commits
/// to the whole list (a report's `chunk_root`).
pub fn chunk_root(chunks: &[Sha256]) -> Sha256 {
    let mut h = Hasher::new();
    for c in chunks {
        h.update(c.as_bytes());
    }
    Sha256::from_hasher(h)
}

impl ArenaHasher {
    pub fn new(policy: NanPolicy) -> Self {
        Self::of(Dtype::F32, policy)
    }

    /// A hasher of `dtype`'s bytes.
    pub fn of(dtype: Dtype, policy: NanPolicy) -> Self {
        ArenaHasher {
            sha: Hasher::new(),
            policy,
            dtype,
            buf: Vec::with_capacity(STAGE * 4),
            chunks: None,
            scan: std::time::Duration::ZERO,
        }
    }

    /// Also keep a digest per `CHUNK_ELEMS` elements (costs a second pass
    /// of SHA-256 over the same bytes).
    pub fn with_chunks(policy: NanPolicy) -> Self {
        Self::with_chunks_of(Dtype::F32, policy)
    }

    /// [`ArenaHasher::with_chunks`] of `dtype`'s bytes.
    pub fn with_chunks_of(dtype: Dtype, policy: NanPolicy) -> Self {
        let mut h = Self::of(dtype, policy);
        h.chunks = Some(ChunkState {
            sha: Hasher::new(),
            leaf: CHUNK_ELEMS * dtype.bytes(),
            filled: 0,
            done: Vec::new(),
        });
        h
    }

    fn feed(sha: &mut Hasher, chunks: &mut Option<ChunkState>, bytes: &[u8]) {
        match chunks {
            None => sha.update(bytes),
            // Large spans: the arena stream on this thread, the whole chunks
            // side by side on the pool. The stream is the sequential floor.
            Some(c) if bytes.len() >= 2 * c.leaf => {
                rayon::join(|| sha.update(bytes), || c.feed_parallel(bytes));
            }
            Some(c) => {
                sha.update(bytes);
                c.feed(bytes);
            }
        }
    }

    /// [`ArenaHasher::update`] for values already known to hold no NaN (a
    /// device looked): hashed where they lie, without a scan. Values that
    /// do hold one would be hashed with their payloads, so a wrong claim
    /// shows as a digest that differs from the CPU oracle's.
    pub fn update_nan_free(&mut self, values: &[f32]) {
        if cfg!(target_endian = "little") && self.dtype.is_f32() {
            self.feed_in_place(values);
        } else {
            self.update(values);
        }
    }

    /// Hash `values`' in-memory bytes (the hashed bytes on a little-endian
    /// host when no NaN needs canonicalising): no copy.
    fn feed_in_place(&mut self, values: &[f32]) {
        // SAFETY: f32 has no padding and any byte pattern is a valid u8.
        let bytes = unsafe {
            std::slice::from_raw_parts(values.as_ptr().cast::<u8>(), size_of_val(values))
        };
        Self::feed(&mut self.sha, &mut self.chunks, bytes);
    }

    pub fn update(&mut self, values: &[f32]) {
        if !self.dtype.is_f32() {
            let (dtype, policy) = (self.dtype, self.policy);
            for stage in values.chunks(STAGE) {
                self.buf.clear();
                for v in stage {
                    dtype.put_le(policy.apply_in(dtype, dtype.narrow(*v)), &mut self.buf);
                }
                Self::feed(&mut self.sha, &mut self.chunks, &self.buf);
            }
            return;
        }
        let in_place = cfg!(target_endian = "little")
            && (self.policy == NanPolicy::Preserve || {
                let t = std::time::Instant::now();
                let clean = !has_nan(values);
                self.scan += t.elapsed();
                clean
            });
        if in_place {
            self.feed_in_place(values);
            return;
        }
        for stage in values.chunks(STAGE) {
            self.buf.clear();
            for v in stage {
                self.buf
                    .extend_from_slice(&self.policy.apply(v.to_bits()).to_le_bytes());
            }
            Self::feed(&mut self.sha, &mut self.chunks, &self.buf);
        }
    }

    /// A 16-bit dtype's values as their bits (what a device holds),
    /// hashed under the policy.
    pub fn update_bits16(&mut self, bits: &[u16]) {
        debug_assert!(!self.dtype.is_f32());
        let (dtype, policy) = (self.dtype, self.policy);
        for stage in bits.chunks(STAGE) {
            self.buf.clear();
            for &b in stage {
                dtype.put_le(policy.apply_in(dtype, u32::from(b)), &mut self.buf);
            }
            Self::feed(&mut self.sha, &mut self.chunks, &self.buf);
        }
    }

    /// Time spent so far looking for NaNs (canonical policy only).
    pub fn scan_time(&self) -> std::time::Duration {
        self.scan
    }

    pub fn finish(self) -> Sha256 {
        Sha256::from_hasher(self.sha)
    }

    /// The digest and, if `with_chunks`, the chunk digests.
    pub fn finish_chunked(self) -> ChunkedDigest {
        let chunks = match self.chunks {
            None => Vec::new(),
            Some(mut c) => {
                if c.filled > 0 {
                    c.done.push(Sha256::from_hasher(c.sha));
                }
                c.done
            }
        };
        ChunkedDigest {
            sha256: Sha256::from_hasher(self.sha),
            chunks,
        }
    }
}

/// Branch-free NaN scan (a max over magnitudes) so it vectorizes.
fn has_nan(values: &[f32]) -> bool {
    values
        .iter()
        .map(|v| v.to_bits() & !0x8000_0000)
        .fold(0, u32::max)
        > INFINITY_BITS
}

/// Digest and chunk digests of one arena under `policy`.
pub fn digest_chunked(values: &[f32], policy: NanPolicy) -> ChunkedDigest {
    let mut h = ArenaHasher::with_chunks(policy);
    h.update(values);
    h.finish_chunked()
}

/// SHA-256 (hex) of one arena under `policy`.
pub fn digest_arena(values: &[f32], policy: NanPolicy) -> Sha256 {
    digest_arena_as(values, Dtype::F32, policy)
}

/// SHA-256 of one arena of `dtype` (carried as float32) under `policy`.
pub fn digest_arena_as(values: &[f32], dtype: Dtype, policy: NanPolicy) -> Sha256 {
    let mut h = ArenaHasher::of(dtype, policy);
    h.update(values);
    h.finish()
}

/// The exact bytes that are hashed (for dumps).
pub fn hashed_bytes(values: &[f32], policy: NanPolicy) -> Vec<u8> {
    hashed_bytes_as(values, Dtype::F32, policy)
}

/// The exact bytes hashed for an arena of `dtype` (carried as float32).
pub fn hashed_bytes_as(values: &[f32], dtype: Dtype, policy: NanPolicy) -> Vec<u8> {
    let mut out = Vec::with_capacity(values.len() * dtype.bytes());
    for v in values {
        dtype.put_le(policy.apply_in(dtype, dtype.narrow(*v)), &mut out);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_16_bit_arena_hashes_its_own_bytes_and_chunks_by_elements() {
        let d = Dtype::Bf16;
        let n = 2 * CHUNK_ELEMS + 5;
        let values: Vec<f32> = (0..n).map(|i| d.quantize(i as f32 * 0.37)).collect();
        let bytes = hashed_bytes_as(&values, d, NanPolicy::Canonical);
        assert_eq!(bytes.len(), 2 * n);
        assert_eq!(
            digest_arena_as(&values, d, NanPolicy::Canonical),
            Sha256::of(&bytes)
        );
        let mut h = ArenaHasher::with_chunks_of(d, NanPolicy::Canonical);
        h.update(&values);
        let c = h.finish_chunked();
        assert_eq!(c.chunks.len(), 3);
        assert_eq!(
            c.chunks[1],
            Sha256::of(&bytes[2 * CHUNK_ELEMS..4 * CHUNK_ELEMS])
        );
        // The device's bits hash the same as the carried values.
        let bits: Vec<u16> = values.iter().map(|v| d.narrow(*v) as u16).collect();
        let mut b = ArenaHasher::with_chunks_of(d, NanPolicy::Canonical);
        b.update_bits16(&bits);
        assert_eq!(b.finish_chunked(), c);
        // NaNs: canonical is bf16's 0x7FC0 whatever the payload or sign.
        let nan = [f32::from_bits(0xFFC1_0000), f32::from_bits(0x7F81_0000)];
        assert_eq!(
            hashed_bytes_as(&nan, d, NanPolicy::Canonical),
            [0xC0, 0x7F, 0xC0, 0x7F]
        );
        assert_eq!(
            hashed_bytes_as(&nan, d, NanPolicy::Preserve),
            [0xC1, 0xFF, 0xC1, 0x7F]
        );
        assert_eq!(
            hashed_bytes_as(&nan, Dtype::F16, NanPolicy::Canonical),
            [0x00, 0x7E, 0x00, 0x7E]
        );
        // Control: the f32 bytes of the same values differ.
        assert_ne!(
            digest_arena(&values, NanPolicy::Canonical),
            Sha256::of(&bytes)
        );
    }

    #[test]
    fn empty_arena_hashes_to_sha256_of_nothing() {
        assert_eq!(
            digest_arena(&[], NanPolicy::Canonical).to_string(),
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
    fn chunk_digests_cover_the_hashed_bytes_in_order() {
        let v: Vec<f32> = (0..(2 * CHUNK_ELEMS + 5)).map(|i| i as f32).collect();
        let mut h = ArenaHasher::with_chunks(NanPolicy::Canonical);
        // Uneven updates must not move chunk boundaries.
        h.update(&v[..1000]);
        h.update(&v[1000..CHUNK_ELEMS + 7]);
        h.update(&v[CHUNK_ELEMS + 7..]);
        let d = h.finish_chunked();
        assert_eq!(d.sha256, digest_arena(&v, NanPolicy::Canonical));
        assert_eq!(d.chunks.len(), 3);
        let bytes = hashed_bytes(&v, NanPolicy::Canonical);
        for (k, c) in d.chunks.iter().enumerate() {
            let lo = k * CHUNK_ELEMS * 4;
            let hi = ((k + 1) * CHUNK_ELEMS * 4).min(bytes.len());
            assert_eq!(*c, Sha256::of(&bytes[lo..hi]));
        }
        assert!(digest_chunked(&[], NanPolicy::Canonical).chunks.is_empty());
        // One flipped element changes exactly its chunk.
        let mut w = v.clone();
        w[CHUNK_ELEMS + 3] = -w[CHUNK_ELEMS + 3];
        let e = digest_chunked(&w, NanPolicy::Canonical);
        let differ: Vec<usize> = (0..3).filter(|&k| d.chunks[k] != e.chunks[k]).collect();
        assert_eq!(differ, vec![1]);
    }

    #[test]
    fn nan_free_updates_hash_the_same_bytes_and_a_false_claim_shows() {
        let v: Vec<f32> = (0..(CHUNK_ELEMS + 77))
            .map(|i| (i as f32).sin() * 3.5)
            .collect();
        for policy in [NanPolicy::Canonical, NanPolicy::Preserve] {
            let mut h = ArenaHasher::with_chunks(policy);
            h.update_nan_free(&v[..500]);
            h.update(&v[500..600]);
            h.update_nan_free(&v[600..]);
            assert_eq!(h.finish_chunked(), digest_chunked(&v, policy));
        }
        // Negative control: on a little-endian host a NaN payload hashed as
        // "NaN-free" is not canonicalised, so the digest differs from the
        // canonical one. A big-endian host must swap bytes anyway, so it
        // always takes the canonicalising path.
        let mut w = v.clone();
        w[9] = f32::from_bits(0x7FC0_0ABC);
        let mut h = ArenaHasher::new(NanPolicy::Canonical);
        h.update_nan_free(&w);
        let canonical = digest_arena(&w, NanPolicy::Canonical);
        if cfg!(target_endian = "little") {
            assert_ne!(h.finish(), canonical);
        } else {
            assert_eq!(h.finish(), canonical);
        }
    }

    #[test]
    fn a_digest_reads_back_only_in_the_form_it_is_written() {
        let d = Sha256::of(b"abc");
        let hex = "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad";
        assert_eq!(d.to_string(), hex);
        assert_eq!(serde_json::to_string(&d).unwrap(), format!("\"{hex}\""));
        assert_eq!(
            serde_json::from_str::<Sha256>(&format!("\"{hex}\"")).unwrap(),
            d
        );
        assert_eq!(d.short(8), "ba7816bf");
        // Negative controls: every other spelling is refused, by name.
        for bad in [
            hex.to_uppercase(),
            hex[..63].to_string(),
            format!("{hex}0"),
            format!("g{}", &hex[1..]),
            String::new(),
        ] {
            let err = bad.parse::<Sha256>().unwrap_err();
            assert_eq!(
                err.to_string(),
                format!("`{bad}` is not a SHA-256 digest (64 lowercase hex digits)")
            );
            assert!(serde_json::from_str::<Sha256>(&format!("\"{bad}\"")).is_err());
        }
        // A control character is shown escaped, and a long string cut short.
        let err = "a\u{1b}b"
            .repeat(40)
            .parse::<Sha256>()
            .unwrap_err()
            .to_string();
        assert!(err.starts_with("`a\\u{1b}b"), "{err}");
        // 120 characters in, 80 shown (each ESC as 6).
        assert!(!err.contains('\u{1b}') && err.len() < 300, "{err}");
    }

    #[test]
    fn streaming_equals_one_shot() {
        let v: Vec<f32> = (0..100_000).map(|i| i as f32 * 0.37).collect();
        let mut h = ArenaHasher::new(NanPolicy::Canonical);
        h.update(&v[..12345]);
        h.update(&v[12345..]);
        assert_eq!(
            h.finish(),
            Sha256::of(&hashed_bytes(&v, NanPolicy::Canonical))
        );
    }

    #[test]
    fn parallel_chunk_digests_equal_the_sequential_ones() {
        let n = 5 * CHUNK_ELEMS + 9;
        let mut v: Vec<f32> = (0..n).map(|i| (i as f32).sqrt() * 1.7).collect();
        v[3 * CHUNK_ELEMS + 1] = f32::from_bits(0x7FC0_1234); // a NaN payload
        for policy in [NanPolicy::Canonical, NanPolicy::Preserve] {
            let bytes = hashed_bytes(&v, policy);
            let expect: Vec<Sha256> = bytes.chunks(CHUNK_ELEMS * 4).map(Sha256::of).collect();
            // A partial chunk first, then spans long enough to go parallel.
            for cuts in [
                vec![1000, 4 * CHUNK_ELEMS + 3],
                vec![0, n],
                vec![7, 2 * CHUNK_ELEMS + 7],
            ] {
                let mut h = ArenaHasher::with_chunks(policy);
                let mut at = 0;
                for &c in cuts.iter().chain([n].iter()) {
                    h.update(&v[at..c.max(at)]);
                    at = c.max(at);
                }
                let d = h.finish_chunked();
                assert_eq!(d.sha256, Sha256::of(&bytes), "{policy} {cuts:?}");
                assert_eq!(d.chunks, expect, "{policy} {cuts:?}");
            }
        }
        // Negative control: one flipped sign changes exactly one chunk.
        let mut w = v.clone();
        w[4 * CHUNK_ELEMS] = -w[4 * CHUNK_ELEMS];
        let (a, b) = (
            digest_chunked(&v, NanPolicy::Canonical),
            digest_chunked(&w, NanPolicy::Canonical),
        );
        let differ: Vec<usize> = (0..a.chunks.len())
            .filter(|&k| a.chunks[k] != b.chunks[k])
            .collect();
        assert_eq!(differ, vec![4]);
    }
}
