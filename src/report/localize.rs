//! Where two results differ: element-level comparison of dumped arenas
//! (index, both values, ULP distance, counts).

use super::ReportError;
use crate::dtype::Dtype;
use serde::Serialize;
use std::collections::BTreeMap;
use std::path::Path;

/// Distance in units in the last place between two f32 bit patterns, on the
/// ordered line where -0.0 and +0.0 are adjacent-equal. `None` if either is NaN.
pub fn ulp_distance(a: u32, b: u32) -> Option<u64> {
    ulp_distance_in(Dtype::F32, a, b)
}

/// [`ulp_distance`] between two bit patterns of `dtype`, counted in that
/// dtype's steps (one bf16 step is one, not the 65,536 float32 steps it
/// spans).
pub fn ulp_distance_in(dtype: Dtype, a: u32, b: u32) -> Option<u64> {
    if dtype.is_nan(a) || dtype.is_nan(b) {
        return None;
    }
    Some(dtype.ordinal(a).abs_diff(dtype.ordinal(b)))
}

/// The bits of `dtype` a float32 carrier holds: the carrier was widened
/// exactly from them, so nothing is rounded, and a NaN's payload (a
/// signalling one's too) comes back whole.
pub fn held_bits(dtype: Dtype, x: f32) -> u32 {
    let b = x.to_bits();
    let nan = b & 0x7FFF_FFFF > 0x7F80_0000;
    match dtype {
        Dtype::F32 => b,
        _ if !nan => dtype.narrow(x),
        Dtype::Bf16 => b >> 16,
        Dtype::F16 => ((b >> 16) & 0x8000) | 0x7C00 | ((b >> 13) & 0x3FF),
    }
}

/// `bits` of `dtype` in hex, as wide as the dtype (`0x3f800000`, `0x3f80`).
pub fn hex_bits(dtype: Dtype, bits: u32) -> String {
    match dtype {
        Dtype::F32 => format!("0x{bits:08x}"),
        Dtype::Bf16 | Dtype::F16 => format!("0x{bits:04x}"),
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ElementDiff {
    pub index: usize,
    pub left: u32,
    pub right: u32,
    pub ulp: Option<u64>,
}

fn is_f32(d: &Dtype) -> bool {
    d.is_f32()
}

#[derive(Debug, Clone, Serialize)]
pub struct FileDiff {
    pub name: String,
    /// The elements' dtype (both sides'); left out for float32.
    #[serde(skip_serializing_if = "is_f32")]
    pub dtype: Dtype,
    /// Left's and right's dtypes when they differ: then nothing is
    /// compared element by element.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dtypes: Option<(Dtype, Dtype)>,
    /// Elements compared (the shorter length) and lengths of both files.
    pub lens: (usize, usize),
    pub differing: usize,
    pub max_ulp: Option<u64>,
    pub first: Vec<ElementDiff>,
    /// The compared pairs' ULP distances per power-of-two bucket (see
    /// [`BitsDiff::histogram`]); for `foldprint plot`, not in the JSON.
    #[serde(skip)]
    pub histogram: Vec<u64>,
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct DumpComparison {
    pub identical: usize,
    pub differing: Vec<FileDiff>,
    /// Files listed in only one SHA256SUMS.
    pub unmatched: Vec<String>,
}

/// SHA256SUMS of a dump directory, after checking it against the files:
/// each listed file must exist and hash to its line, and no other file may
/// be there (`sha256sum -c` catches the first two; a dump directory that
/// lies is corrupt input, not a comparison result).
fn read_sums(dir: &Path) -> Result<BTreeMap<String, crate::digest::Sha256>, ReportError> {
    let sums = read_sums_file(dir)?;
    for (name, hash) in &sums {
        let path = dir.join(name);
        let bytes =
            crate::dumpdir::read_dump_file(&path, None).map_err(|source| ReportError::Io {
                path: path.clone(),
                source,
            })?;
        let actual = crate::digest::Sha256::of(&bytes);
        if actual != *hash {
            return Err(ReportError::Dump {
                path,
                message: format!("SHA-256 is {actual} but SHA256SUMS says {hash}"),
            });
        }
    }
    let entries = std::fs::read_dir(dir).map_err(|source| ReportError::Io {
        path: dir.to_path_buf(),
        source,
    })?;
    for entry in entries {
        let entry = entry.map_err(|source| ReportError::Io {
            path: dir.to_path_buf(),
            source,
        })?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if !crate::dumpdir::is_bookkeeping(&name) && !sums.contains_key(&name) {
            return Err(ReportError::Dump {
                path: dir.join(&name),
                message: "not listed in SHA256SUMS".into(),
            });
        }
    }
    Ok(sums)
}

fn read_sums_file(dir: &Path) -> Result<BTreeMap<String, crate::digest::Sha256>, ReportError> {
    let path = dir.join("SHA256SUMS");
    let text = crate::input::read_capped(&path, crate::input::MAX_REPORT_BYTES)
        .and_then(|b| {
            String::from_utf8(b)
                .map_err(|_| std::io::Error::new(std::io::ErrorKind::InvalidData, "not UTF-8"))
        })
        .map_err(|source| ReportError::Io {
            path: path.clone(),
            source,
        })?;
    let mut out = BTreeMap::new();
    for (i, line) in text.lines().enumerate() {
        let malformed = || ReportError::Dump {
            path: path.clone(),
            message: format!("line {} is not `<sha256>  <file>`", i + 1),
        };
        let (hash, name) = line.split_once("  ").ok_or_else(malformed)?;
        let hash: crate::digest::Sha256 = hash.parse().map_err(|_| malformed())?;
        if name.is_empty() || name.contains('/') {
            return Err(malformed());
        }
        if out.insert(name.to_string(), hash).is_some() {
            return Err(ReportError::Dump {
                path: path.clone(),
                message: format!("line {}: {name} is listed twice", i + 1),
            });
        }
    }
    Ok(out)
}

/// The dtype of every file of dump directory `dir` (float32 unless its
/// manifest says otherwise; a directory without a manifest is float32).
fn dtypes_of(dir: &Path) -> Result<BTreeMap<String, Dtype>, ReportError> {
    let manifest = dir.join(crate::dumpdir::MANIFEST);
    if std::fs::symlink_metadata(&manifest).is_err() {
        return Ok(BTreeMap::new());
    }
    crate::dumpdir::manifest_dtypes(dir).map_err(|message| ReportError::Dump {
        path: manifest,
        message,
    })
}

/// A dump file's elements as bits of `dtype`.
fn read_elems(path: &Path, dtype: Dtype) -> Result<Vec<u32>, ReportError> {
    let bytes = crate::dumpdir::read_dump_file(path, None).map_err(|source| ReportError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    let width = dtype.bytes();
    if bytes.len() % width != 0 {
        return Err(ReportError::Dump {
            path: path.to_path_buf(),
            message: format!(
                "{} bytes is not a whole number of {dtype} values",
                bytes.len()
            ),
        });
    }
    let mut out = Vec::new();
    // Fallible: under a memory limit this is exit 3, not an abort.
    out.try_reserve_exact(bytes.len() / width)
        .map_err(|_| ReportError::Io {
            path: path.to_path_buf(),
            source: std::io::Error::new(std::io::ErrorKind::OutOfMemory, "out of memory"),
        })?;
    match width {
        4 => out.extend(
            bytes
                .chunks_exact(4)
                .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]])),
        ),
        _ => out.extend(
            bytes
                .chunks_exact(2)
                .map(|c| u32::from(u16::from_le_bytes([c[0], c[1]]))),
        ),
    }
    Ok(out)
}

/// The power-of-two bucket of a ULP distance: 0 for a distance of 0 (the
/// bits differ, the values do not: -0 and +0), else k for distances
/// 2^(k-1) ..= 2^k - 1 (1; 2-3; 4-7; ...), the distance's bit length.
pub fn ulp_bucket(ulp: u64) -> usize {
    (u64::BITS - ulp.leading_zeros()) as usize
}

/// The smallest and largest distance bucket `k` holds.
pub fn ulp_bucket_range(k: usize) -> (u64, u64) {
    match k {
        0 => (0, 0),
        _ => (1u64 << (k - 1), ((1u128 << k) - 1) as u64),
    }
}

/// Where two equally long bit sequences differ.
#[derive(Debug, Clone, Default)]
pub struct BitsDiff {
    pub differing: usize,
    /// Largest ULP distance over the differing pairs that are not NaN.
    pub max_ulp: Option<u64>,
    /// The first `keep` differences.
    pub first: Vec<ElementDiff>,
    /// Differing pairs that are not NaN, counted per [`ulp_bucket`]; no
    /// trailing empty bucket (empty when no such pair). The pairs with a
    /// NaN are `differing` less its sum.
    pub histogram: Vec<u64>,
}

/// Element by element over the shorter of `left` and `right`.
pub fn diff_bits(left: &[u32], right: &[u32], keep: usize) -> BitsDiff {
    diff_bits_in(Dtype::F32, left, right, keep)
}

/// [`diff_bits`] of bit patterns of `dtype`, distances in its steps.
pub fn diff_bits_in(dtype: Dtype, left: &[u32], right: &[u32], keep: usize) -> BitsDiff {
    let mut d = BitsDiff::default();
    for (i, (&x, &y)) in left.iter().zip(right).enumerate() {
        if x != y {
            d.differing += 1;
            let ulp = ulp_distance_in(dtype, x, y);
            d.max_ulp = d.max_ulp.max(ulp);
            if let Some(u) = ulp {
                let k = ulp_bucket(u);
                if d.histogram.len() <= k {
                    d.histogram.resize(k + 1, 0);
                }
                d.histogram[k] += 1;
            }
            if d.first.len() < keep {
                d.first.push(ElementDiff {
                    index: i,
                    left: x,
                    right: y,
                    ulp,
                });
            }
        }
    }
    d
}

/// Compare two `--dump` directories file by file; `keep` first differences per file.
pub fn compare_dumps(a: &Path, b: &Path, keep: usize) -> Result<DumpComparison, ReportError> {
    let (sa, sb) = (read_sums(a)?, read_sums(b)?);
    let (da, db) = (dtypes_of(a)?, dtypes_of(b)?);
    let dtype = |m: &BTreeMap<String, Dtype>, name: &str| m.get(name).copied().unwrap_or_default();
    let mut out = DumpComparison::default();
    for (name, ha) in &sa {
        let Some(hb) = sb.get(name) else {
            out.unmatched
                .push(format!("{name} (only in {})", a.display()));
            continue;
        };
        if ha == hb {
            out.identical += 1;
            continue;
        }
        let (ta, tb) = (dtype(&da, name), dtype(&db, name));
        let (va, vb) = (
            read_elems(&a.join(name), ta)?,
            read_elems(&b.join(name), tb)?,
        );
        if ta != tb {
            // Other element types: every element differs, none is compared.
            out.differing.push(FileDiff {
                name: name.clone(),
                dtype: ta,
                dtypes: Some((ta, tb)),
                lens: (va.len(), vb.len()),
                differing: va.len().max(vb.len()),
                max_ulp: None,
                first: Vec::new(),
                histogram: Vec::new(),
            });
            continue;
        }
        let bits = diff_bits_in(ta, &va, &vb, keep);
        out.differing.push(FileDiff {
            name: name.clone(),
            dtype: ta,
            dtypes: None,
            lens: (va.len(), vb.len()),
            differing: bits.differing + va.len().abs_diff(vb.len()),
            max_ulp: bits.max_ulp,
            first: bits.first,
            histogram: bits.histogram,
        });
    }
    for name in sb.keys().filter(|n| !sa.contains_key(*n)) {
        out.unmatched
            .push(format!("{name} (only in {})", b.display()));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_16_bit_value_comes_back_whole_from_its_carrier() {
        // Every pattern, NaN payloads (signalling ones too) and subnormals.
        for d in [Dtype::Bf16, Dtype::F16] {
            for h in 0..=0xFFFFu32 {
                assert_eq!(held_bits(d, d.widen(h)), h, "{d} {h:#06x}");
            }
        }
        // Control: a float32 that is not a bf16 value is rounded, not kept.
        assert_eq!(held_bits(Dtype::Bf16, f32::from_bits(0x3F80_8001)), 0x3F81);
        assert_eq!(
            held_bits(Dtype::F32, f32::from_bits(0x7F80_0001)),
            0x7F80_0001
        );
    }

    #[test]
    fn ulp_distances_count_the_dtypes_own_steps() {
        // 1.0 and its third neighbour up; -0 and +0; across zero; NaN.
        assert_eq!(ulp_distance_in(Dtype::Bf16, 0x3F80, 0x3F83), Some(3));
        assert_eq!(ulp_distance_in(Dtype::F16, 0x3C00, 0x3C03), Some(3));
        assert_eq!(ulp_distance_in(Dtype::Bf16, 0x8000, 0x0000), Some(0));
        assert_eq!(ulp_distance_in(Dtype::F16, 0x8001, 0x0001), Some(2));
        assert_eq!(ulp_distance_in(Dtype::Bf16, 0x7FC0, 0x3F80), None);
        assert_eq!(ulp_distance_in(Dtype::F16, 0x7E00, 0x3C00), None);
        // Infinity is one step past the largest finite value.
        assert_eq!(ulp_distance_in(Dtype::F16, 0x7BFF, 0x7C00), Some(1));
        // Control: the same bf16 step read as float32 bits is 65,536.
        assert_eq!(ulp_distance(0x3F80_0000, 0x3F81_0000), Some(65536));
        let d = diff_bits_in(
            Dtype::Bf16,
            &[0x3F80, 0x4000, 0x7FC0],
            &[0x3F82, 0x4000, 0x7FC1],
            8,
        );
        assert_eq!((d.differing, d.max_ulp, d.first.len()), (2, Some(2), 2));
        assert_eq!(d.first[1].ulp, None);
        // One pair 2 steps apart (bucket 2-3); the NaN pair in none.
        assert_eq!(d.histogram, vec![0, 0, 1]);
    }

    #[test]
    fn ulp_buckets_are_powers_of_two() {
        let cases = [
            (0, 0),
            (1, 1),
            (2, 2),
            (3, 2),
            (4, 3),
            (7, 3),
            (8, 4),
            (1 << 32, 33),
            (u64::MAX, 64),
        ];
        for (ulp, k) in cases {
            assert_eq!(ulp_bucket(ulp), k, "{ulp}");
            let (lo, hi) = ulp_bucket_range(k);
            assert!(lo <= ulp && ulp <= hi, "{ulp} in {k}: {lo}..={hi}");
        }
        assert_eq!(ulp_bucket_range(3), (4, 7));
        assert_eq!(ulp_bucket_range(64), (1 << 63, u64::MAX));
    }

    #[test]
    fn ulp_distance_on_the_ordered_line() {
        assert_eq!(ulp_distance(1.0f32.to_bits(), 1.0f32.to_bits()), Some(0));
        assert_eq!(
            ulp_distance(
                1.0f32.to_bits(),
                f32::from_bits(1.0f32.to_bits() + 3).to_bits()
            ),
            Some(3)
        );
        assert_eq!(ulp_distance(0.0f32.to_bits(), (-0.0f32).to_bits()), Some(0));
        assert_eq!(
            ulp_distance(f32::from_bits(1).to_bits(), (-f32::from_bits(1)).to_bits()),
            Some(2)
        );
        assert_eq!(ulp_distance(f32::NAN.to_bits(), 1.0f32.to_bits()), None);
    }
}
