//! Reading a rank file's bytes: its SHA-256, and a tensor straight into an
//! arena with positioned reads (safe to share one descriptor between
//! threads; no mapping, so a file truncated under us is an I/O error, not
//! a SIGBUS), or from the bytes the one pass kept ([`super::pass`]).

use super::format::{Dtype, Tensor};
use crate::digest::Sha256;
use crate::dtype::{widen_bf16, widen_f16};
use rayon::prelude::*;
use sha2::Digest;
use std::os::unix::fs::FileExt;

/// Elements read per positioned read (4 MiB of float32).
const BLOCK: usize = 1 << 20;

/// Where a tensor's bytes are read from: the open file, or the bytes the
/// one pass kept.
pub(super) trait Source: Sync {
    /// Exactly `buf.len()` bytes from offset `at`.
    fn fill_at(&self, buf: &mut [u8], at: u64) -> std::io::Result<()>;
    /// The `len` bytes at `at` where they lie, when they lie in one piece
    /// of memory (then a read of a few bytes costs no more than copying
    /// them, and a sample picks its values one by one).
    fn view(&self, _at: u64, _len: usize) -> Option<&[u8]> {
        None
    }
}

impl Source for std::fs::File {
    fn fill_at(&self, buf: &mut [u8], at: u64) -> std::io::Result<()> {
        self.read_exact_at(buf, at)
    }
}

impl Source for &[u8] {
    fn fill_at(&self, buf: &mut [u8], at: u64) -> std::io::Result<()> {
        let from = usize::try_from(at)
            .ok()
            .and_then(|a| self.get(a..a.checked_add(buf.len())?))
            .ok_or_else(|| {
                std::io::Error::new(
                    std::io::ErrorKind::UnexpectedEof,
                    "read past the bytes that were hashed",
                )
            })?;
        buf.copy_from_slice(from);
        Ok(())
    }
    fn view(&self, at: u64, len: usize) -> Option<&[u8]> {
        let at = usize::try_from(at).ok()?;
        self.get(at..at.checked_add(len)?)
    }
}

/// SHA-256 of the file's first `size` bytes.
pub(super) fn hash(file: &std::fs::File, size: u64) -> std::io::Result<Sha256> {
    let mut h = sha2::Sha256::new();
    let mut buf = vec![0u8; 4 << 20];
    let mut at = 0u64;
    while at < size {
        let n = (size - at).min(buf.len() as u64) as usize;
        file.read_exact_at(&mut buf[..n], at)?;
        h.update(&buf[..n]);
        at += n as u64;
    }
    Ok(Sha256::from_bytes(h.finalize().into()))
}

/// One element of `t` from its stored bytes.
fn widen(t: &Tensor, b: &[u8]) -> f32 {
    match (t.dtype, t.big_endian) {
        (Dtype::F32, false) => f32::from_le_bytes([b[0], b[1], b[2], b[3]]),
        (Dtype::F32, true) => f32::from_be_bytes([b[0], b[1], b[2], b[3]]),
        // The widening docs/SPEC.md defines: exact, a NaN's payload kept
        // bit for bit (a signalling NaN stays one), as the devices widen.
        (Dtype::Bf16, false) => f32::from_bits(widen_bf16(u16::from_le_bytes([b[0], b[1]]))),
        (Dtype::Bf16, true) => f32::from_bits(widen_bf16(u16::from_be_bytes([b[0], b[1]]))),
        (Dtype::F16, false) => f32::from_bits(widen_f16(u16::from_le_bytes([b[0], b[1]]))),
        (Dtype::F16, true) => f32::from_bits(widen_f16(u16::from_be_bytes([b[0], b[1]]))),
    }
}

/// Elements `first .. first + dst.len()` of `t` into `dst`.
fn block(
    file: &(impl Source + ?Sized),
    t: &Tensor,
    first: usize,
    dst: &mut [f32],
    scratch: &mut Vec<u8>,
) -> std::io::Result<()> {
    let width = t.dtype.bytes();
    let at = t.offset + (first * width) as u64;
    if t.dtype == Dtype::F32 && !t.big_endian {
        // Little-endian float32: the stored bytes are the arena's, so they
        // go straight into it, then are fixed up on a big-endian host.
        // SAFETY: any 4 bytes are a valid f32; the byte view covers exactly
        // `dst` and ends before `dst` is used again.
        let bytes = unsafe {
            std::slice::from_raw_parts_mut(
                dst.as_mut_ptr().cast::<u8>(),
                std::mem::size_of_val(dst),
            )
        };
        file.fill_at(bytes, at)?;
        if cfg!(target_endian = "big") {
            for v in dst.iter_mut() {
                *v = f32::from_bits(u32::from_le(v.to_bits()));
            }
        }
        return Ok(());
    }
    scratch.resize(dst.len() * width, 0);
    file.fill_at(scratch, at)?;
    for (d, b) in dst.iter_mut().zip(scratch.chunks_exact(width)) {
        *d = widen(t, b);
    }
    Ok(())
}

/// All of `t` into `dst`, blocks read in parallel.
pub(super) fn tensor(
    file: &(impl Source + ?Sized),
    t: &Tensor,
    dst: &mut [f32],
) -> std::io::Result<()> {
    if dst.len() != t.len {
        return Err(std::io::Error::other(format!(
            "{} elements asked for, the tensor has {}",
            dst.len(),
            t.len
        )));
    }
    range(file, t, 0, dst)
}

/// Refused unless elements `first .. first + len` lie in `t`.
fn within(t: &Tensor, first: usize, len: usize) -> std::io::Result<()> {
    if first.checked_add(len).is_none_or(|end| end > t.len) {
        return Err(std::io::Error::other(format!(
            "elements {first}.. (+{len}) asked for, the tensor has {}",
            t.len
        )));
    }
    Ok(())
}

/// Elements `first .. first + dst.len()` of `t` into `dst`, blocks read
/// in parallel.
pub(super) fn range(
    file: &(impl Source + ?Sized),
    t: &Tensor,
    first: usize,
    dst: &mut [f32],
) -> std::io::Result<()> {
    within(t, first, dst.len())?;
    dst.par_chunks_mut(BLOCK)
        .enumerate()
        .try_for_each_init(Vec::new, |scratch, (k, chunk)| {
            block(file, t, first + k * BLOCK, chunk, scratch)
        })
}

/// Elements `first .. first + dst.len()` of the 16-bit tensor `t` as a
/// case carries them ([`crate::dtype::carried_bits16`]: the stored patterns, a
/// signalling NaN made quiet), in the host's byte order, blocks in
/// parallel.
pub(super) fn range_bits16(
    file: &(impl Source + ?Sized),
    t: &Tensor,
    first: usize,
    dst: &mut [u16],
) -> std::io::Result<()> {
    if t.dtype.bytes() != 2 {
        return Err(std::io::Error::other(format!(
            "16-bit elements asked for, the tensor holds {}",
            t.dtype
        )));
    }
    within(t, first, dst.len())?;
    dst.par_chunks_mut(BLOCK)
        .enumerate()
        .try_for_each(|(k, chunk)| {
            let at = t.offset + ((first + k * BLOCK) * 2) as u64;
            // SAFETY: any 2 bytes are a valid u16; the byte view covers
            // exactly `chunk` and ends before `chunk` is used again.
            let bytes = unsafe {
                std::slice::from_raw_parts_mut(
                    chunk.as_mut_ptr().cast::<u8>(),
                    std::mem::size_of_val(chunk),
                )
            };
            file.fill_at(bytes, at)?;
            if t.big_endian != cfg!(target_endian = "big") {
                for v in chunk.iter_mut() {
                    *v = v.swap_bytes();
                }
            }
            carry_all(t.dtype, chunk);
            Ok(())
        })
}

/// [`crate::dtype::carried_bits16`] on every pattern of `v`, in a loop without branches
/// (the compiler vectorizes it: half a gigabyte of bf16 went up at a
/// fifth of float32's speed one pattern at a time). A NaN is a pattern
/// whose magnitude lies above infinity's; its quiet bit is set.
fn carry_all(dtype: Dtype, v: &mut [u16]) {
    let (inf, quiet) = match dtype {
        Dtype::Bf16 => (0x7F80u16, 0x0040u16),
        Dtype::F16 => (0x7C00, 0x0200),
        Dtype::F32 => return,
    };
    for h in v.iter_mut() {
        *h |= u16::from(*h & 0x7FFF > inf) * quiet;
    }
}

/// Elements `0, stride, 2 stride ...` of `t`, `picks` of them.
pub(super) fn sample(
    file: &(impl Source + ?Sized),
    t: &Tensor,
    stride: u64,
    picks: u64,
) -> std::io::Result<Vec<f32>> {
    let stride = stride.max(1) as usize;
    if stride == 1 {
        let mut all = vec![0f32; t.len];
        tensor(file, t, &mut all)?;
        all.truncate(picks as usize);
        return Ok(all);
    }
    let picks = picks as usize;
    if file.view(t.offset, 0).is_some() {
        // Kept bytes: each pick is a copy of its own few bytes.
        let mut out = vec![0f32; picks];
        out.par_chunks_mut(BLOCK / 16)
            .enumerate()
            .try_for_each_init(Vec::new, |scratch, (k, dst)| {
                let width = t.dtype.bytes();
                for (p, d) in dst.iter_mut().enumerate() {
                    let first = (k * (BLOCK / 16) + p) * stride;
                    let at = t.offset + (first * width) as u64;
                    match file.view(at, width) {
                        Some(b) => *d = widen(t, b),
                        None => block(file, t, first, std::slice::from_mut(d), scratch)?,
                    }
                }
                Ok::<(), std::io::Error>(())
            })?;
        return Ok(out);
    }
    // Read in spans of whole strides (one read per span, not per pick),
    // in parallel, keeping every stride-th value.
    let per_span = (BLOCK / stride).max(1);
    let mut out = vec![0f32; picks];
    out.par_chunks_mut(per_span)
        .enumerate()
        .try_for_each_init(Vec::new, |scratch, (k, dst)| {
            let first = k * per_span * stride;
            let len = ((dst.len() - 1) * stride + 1).min(t.len - first);
            let mut span = vec![0f32; len];
            block(file, t, first, &mut span, scratch)?;
            for (p, d) in dst.iter_mut().enumerate() {
                *d = span[p * stride];
            }
            Ok::<(), std::io::Error>(())
        })?;
    Ok(out)
}
