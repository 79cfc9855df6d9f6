//! Rank files for tests, written byte by byte as the formats define them
//! (safetensors: an 8-byte little-endian header length, a JSON header, the
//! data; npy 1.0: magic, version, header dict padded with spaces to a
//! multiple of 64 bytes, the data), so a test can also write a broken one.

#![allow(dead_code)]

use foldprint::data::{Distribution, Lane};
use std::path::Path;

/// Element types as the files name them.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Dt {
    F32,
    Bf16,
    F16,
}

/// One tensor: its name, type, shape and raw little-endian bytes.
pub struct T {
    pub name: String,
    pub dt: Dt,
    pub shape: Vec<usize>,
    pub bytes: Vec<u8>,
}

impl T {
    pub fn f32(name: &str, shape: &[usize], values: &[f32]) -> T {
        T {
            name: name.into(),
            dt: Dt::F32,
            shape: shape.to_vec(),
            bytes: values.iter().flat_map(|v| v.to_le_bytes()).collect(),
        }
    }
    pub fn bf16(name: &str, shape: &[usize], bits: &[u16]) -> T {
        T {
            name: name.into(),
            dt: Dt::Bf16,
            shape: shape.to_vec(),
            bytes: bits.iter().flat_map(|v| v.to_le_bytes()).collect(),
        }
    }
    pub fn f16(name: &str, shape: &[usize], bits: &[u16]) -> T {
        T {
            name: name.into(),
            dt: Dt::F16,
            shape: shape.to_vec(),
            bytes: bits.iter().flat_map(|v| v.to_le_bytes()).collect(),
        }
    }
}

/// The bytes of a safetensors file holding `tensors` (in this order).
pub fn safetensors_bytes(tensors: &[T]) -> Vec<u8> {
    let mut header = String::from("{");
    let mut off = 0usize;
    for (i, t) in tensors.iter().enumerate() {
        let dt = match t.dt {
            Dt::F32 => "F32",
            Dt::Bf16 => "BF16",
            Dt::F16 => "F16",
        };
        let shape: Vec<String> = t.shape.iter().map(|d| d.to_string()).collect();
        if i > 0 {
            header.push(',');
        }
        header.push_str(&format!(
            "{}:{{\"dtype\":\"{dt}\",\"shape\":[{}],\"data_offsets\":[{off},{}]}}",
            serde_json::to_string(&t.name).unwrap(),
            shape.join(","),
            off + t.bytes.len()
        ));
        off += t.bytes.len();
    }
    header.push('}');
    while header.len() % 8 != 0 {
        header.push(' ');
    }
    let mut out = (header.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(header.as_bytes());
    for t in tensors {
        out.extend_from_slice(&t.bytes);
    }
    out
}

pub fn write_safetensors(path: &Path, tensors: &[T]) {
    std::fs::write(path, safetensors_bytes(tensors)).unwrap();
}

/// An npy 1.0 file of `descr` (`<f4`, `>f4`, `<f2` ...), C order.
pub fn write_npy(path: &Path, descr: &str, shape: &[usize], data: &[u8]) {
    let dims: Vec<String> = shape.iter().map(|d| d.to_string()).collect();
    let tuple = if dims.len() == 1 {
        format!("({},)", dims[0])
    } else {
        format!("({})", dims.join(", "))
    };
    let mut dict = format!("{{'descr': '{descr}', 'fortran_order': False, 'shape': {tuple}, }}");
    while (10 + dict.len() + 1) % 64 != 0 {
        dict.push(' ');
    }
    dict.push('\n');
    let mut out = b"\x93NUMPY\x01\x00".to_vec();
    out.extend_from_slice(&(dict.len() as u16).to_le_bytes());
    out.extend_from_slice(dict.as_bytes());
    out.extend_from_slice(data);
    std::fs::write(path, out).unwrap();
}

/// Order-sensitive addends (the generator's mixed magnitudes) for rank
/// `rank`'s tensor `tensor`.
pub fn mixed(seed: u64, rank: usize, tensor: u32, n: usize) -> Vec<f32> {
    let lane = Lane::new(Distribution::MixedMagnitude, seed, rank as u32, tensor);
    (0..n as u64).map(|i| lane.value(i)).collect()
}

/// The fixed-order sum by its definition: rank 0's value, plus rank 1's,
/// plus rank 2's ... in float32, one rounding per add.
pub fn rank_order_sum(ranks: &[Vec<f32>]) -> Vec<f32> {
    (0..ranks[0].len())
        .map(|i| {
            let mut acc = ranks[0][i];
            for r in &ranks[1..] {
                acc += r[i];
            }
            acc
        })
        .collect()
}

/// W rank files `dir/rank{r}.safetensors`, each with the tensors `b` (7
/// elements) and `w` (a 3 x `n` matrix) of mixed magnitudes, and
/// `dir/expected.safetensors` holding their rank-order sums. Returns the
/// addends as `[tensor][rank]`, tensors in name order (`b`, `w`).
pub fn grads(dir: &Path, world: usize, n: usize) -> Vec<Vec<Vec<f32>>> {
    let mut b = Vec::new();
    let mut w = Vec::new();
    for r in 0..world {
        let vb = mixed(11, r, 0, 7);
        let vw = mixed(11, r, 1, 3 * n);
        write_safetensors(
            &dir.join(format!("rank{r}.safetensors")),
            &[T::f32("w", &[3, n], &vw), T::f32("b", &[7], &vb)],
        );
        b.push(vb);
        w.push(vw);
    }
    write_safetensors(
        &dir.join("expected.safetensors"),
        &[
            T::f32("b", &[7], &rank_order_sum(&b)),
            T::f32("w", &[3, n], &rank_order_sum(&w)),
        ],
    );
    vec![b, w]
}

/// A 16-bit value's float32, by the `half` crate (independent of
/// foldprint's conversions).
pub fn widen16(dt: Dt, h: u16) -> f32 {
    match dt {
        Dt::Bf16 => half::bf16::from_bits(h).to_f32(),
        Dt::F16 => half::f16::from_bits(h).to_f32(),
        Dt::F32 => panic!("widen16 of f32"),
    }
}

/// `x` rounded to nearest-even in a 16-bit type, by the `half` crate.
pub fn narrow16(dt: Dt, x: f32) -> u16 {
    match dt {
        Dt::Bf16 => half::bf16::from_f32(x).to_bits(),
        Dt::F16 => half::f16::from_f32(x).to_bits(),
        Dt::F32 => panic!("narrow16 to f32"),
    }
}

/// Order-sensitive 16-bit addends: [`mixed`] (2^-12 .. 2^11, normal in
/// both types) rounded to `dt`.
pub fn mixed16(dt: Dt, seed: u64, rank: usize, tensor: u32, n: usize) -> Vec<u16> {
    mixed(seed, rank, tensor, n)
        .iter()
        .map(|&x| narrow16(dt, x))
        .collect()
}

/// The 16-bit fixed-order result by its definition: every addend widened,
/// rank 0's plus rank 1's plus ... in float32, then rounded once to `dt`.
pub fn rank_order_sum16(dt: Dt, ranks: &[Vec<u16>]) -> Vec<u16> {
    let wide: Vec<Vec<f32>> = ranks
        .iter()
        .map(|r| r.iter().map(|&h| widen16(dt, h)).collect())
        .collect();
    rank_order_sum(&wide)
        .iter()
        .map(|&s| narrow16(dt, s))
        .collect()
}

/// Little-endian bytes of 16-bit values (what a dump of them holds).
pub fn le16(bits: &[u16]) -> Vec<u8> {
    bits.iter().flat_map(|b| b.to_le_bytes()).collect()
}
