//! The two file formats a rank file may have, read as far as their headers:
//! which tensors, of which element type and length, at which byte offset.
//! The data itself is read by `super::read`.

use serde::{Deserialize, Serialize};
use std::os::unix::fs::FileExt;

/// The format, from the file name's extension.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Format {
    /// Every tensor of the file is an arena.
    Safetensors,
    /// The one array of the file is the one arena.
    Npy,
}

impl Format {
    pub fn of(path: &str) -> Option<Format> {
        let lower = path.to_ascii_lowercase();
        if lower.ends_with(".safetensors") {
            Some(Format::Safetensors)
        } else if lower.ends_with(".npy") {
            Some(Format::Npy)
        } else {
            None
        }
    }
    pub const fn name(self) -> &'static str {
        match self {
            Format::Safetensors => "safetensors",
            Format::Npy => "npy",
        }
    }
}

pub use crate::dtype::Dtype;

/// One tensor of a file: where its bytes are and how to read them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tensor {
    pub name: String,
    pub dtype: Dtype,
    pub shape: Vec<u64>,
    pub len: usize,
    /// Byte offset of the first element in the file.
    pub offset: u64,
    /// Stored big-endian (an npy `>f4`); safetensors is always little-endian.
    pub big_endian: bool,
}

/// Largest npy header read (numpy writes a few hundred bytes).
const MAX_NPY_HEADER: u64 = 1 << 20;

/// The tensors of an opened file of `size` bytes, sorted by name, or why
/// the file is not one foldprint can read. Every byte of the file must
/// belong to the header or a tensor: a truncated or padded file is refused.
pub fn tensors(file: &std::fs::File, size: u64, format: Format) -> Result<Vec<Tensor>, String> {
    match format {
        Format::Safetensors => safetensors(file, size),
        Format::Npy => npy(file, size),
    }
}

fn safetensors(file: &std::fs::File, size: u64) -> Result<Vec<Tensor>, String> {
    if size < 8 {
        return Err(format!(
            "truncated: {size} bytes, shorter than a safetensors header"
        ));
    }
    let (header_len, meta) = safetensors_header(file, size)?;
    let data_start = 8 + header_len as u64;
    let mut out = Vec::new();
    let mut data_bytes = 0u64;
    for (name, info) in meta.tensors() {
        let dtype = match info.dtype {
            safetensors::Dtype::F32 => Dtype::F32,
            safetensors::Dtype::BF16 => Dtype::Bf16,
            safetensors::Dtype::F16 => Dtype::F16,
            other => {
                return Err(format!(
                    "tensor `{name}` is {other:?}; foldprint reads F32, BF16 and F16"
                ))
            }
        };
        // The crate checked these; checked again here, so no size taken
        // from the file is ever computed with wrapping arithmetic.
        let (start, end) = (info.data_offsets.0 as u64, info.data_offsets.1 as u64);
        let len = info
            .shape
            .iter()
            .try_fold(1usize, |n, &d| n.checked_mul(d))
            .ok_or_else(|| too_many(&name, &info.shape))?;
        let bytes = (len as u64)
            .checked_mul(dtype.bytes() as u64)
            .ok_or_else(|| too_many(&name, &info.shape))?;
        let offset = data_start
            .checked_add(start)
            .filter(|_| end.checked_sub(start) == Some(bytes))
            .filter(|_| data_start.checked_add(end).is_some_and(|e| e <= size))
            .ok_or_else(|| {
                format!(
                    "tensor `{name}` declares bytes {start}..{end}, which do not hold its \
                     {len} elements of {dtype} inside the file's {size} bytes"
                )
            })?;
        data_bytes = data_bytes
            .checked_add(bytes)
            .ok_or_else(|| too_many(&name, &info.shape))?;
        out.push(Tensor {
            name,
            dtype,
            shape: info.shape.iter().map(|&d| d as u64).collect(),
            len,
            offset,
            big_endian: false,
        });
    }
    if out.is_empty() {
        return Err("holds no tensors".into());
    }
    // Every byte accounted for: the header, then the tensors, back to back.
    if data_start.checked_add(data_bytes) != Some(size) {
        return Err(format!(
            "its tensors hold {data_bytes} bytes after a {data_start}-byte header, the file has {size} bytes"
        ));
    }
    out.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(out)
}

/// Largest safetensors header read: the crate's own bound, past which
/// `read_metadata` refuses a header as too large.
const MAX_SAFETENSORS_HEADER: u64 = 100_000_000;

/// The header's length and what it declares, read with positioned reads,
/// never through a mapping: a file cut short meanwhile by someone else is
/// then a read error, where a mapping's pages past the new end would kill
/// the process with SIGBUS. The crate's `read_metadata` judges the header
/// alone, so its errors are the ones it gives for the whole file.
fn safetensors_header(
    file: &std::fs::File,
    size: u64,
) -> Result<(usize, safetensors::tensor::Metadata), String> {
    use safetensors::{SafeTensorError, SafeTensors};
    let invalid =
        |e: &SafeTensorError| format!("not a valid safetensors file: {}", safetensors_problem(e));
    let cannot_read = |e: std::io::Error| format!("cannot read its header: {e}");
    let mut prefix = [0u8; 8];
    file.read_exact_at(&mut prefix, 0).map_err(cannot_read)?;
    let n = u64::from_le_bytes(prefix);
    let Some(end) = n
        .checked_add(8)
        .filter(|&end| n <= MAX_SAFETENSORS_HEADER && end <= size)
    else {
        // Too large or past the end: the length alone tells the crate which.
        let e = SafeTensors::read_metadata(&prefix)
            .err()
            .unwrap_or(SafeTensorError::InvalidHeaderLength);
        return Err(invalid(&e));
    };
    let mut head = vec![0u8; end as usize];
    file.read_exact_at(&mut head, 0).map_err(cannot_read)?;
    offsets_fit(&head)?;
    let meta = match SafeTensors::read_metadata(&head) {
        Ok((_, meta)) => meta,
        // A valid header whose tensors' bytes follow it, which `head` lacks.
        Err(SafeTensorError::MetadataIncompleteBuffer) => serde_json::from_slice(&head[8..])
            .map_err(|e| format!("not a valid safetensors file: {e}"))?,
        Err(e) => return Err(invalid(&e)),
    };
    // What the crate checks of the whole file: the tensors end at its end.
    if end.checked_add(meta.data_len() as u64) != Some(size) {
        return Err(invalid(&SafeTensorError::MetadataIncompleteBuffer));
    }
    Ok((n as usize, meta))
}

fn too_many(name: &str, shape: &[usize]) -> String {
    format!("tensor `{name}` has shape {shape:?}: more bytes than a file can hold")
}

/// Refuses a tensor declared to end so far out that the crate's sum of
/// header and data sizes would pass 2^64 (a panic under overflow checks,
/// a wrapped sum without); any other offset is left to the crate. A
/// header the crate cannot read is left to it too.
fn offsets_fit(head: &[u8]) -> Result<(), String> {
    let Some(n) = head
        .get(..8)
        .map(|b| u64::from_le_bytes(b.try_into().unwrap_or_default()))
    else {
        return Ok(());
    };
    let Some(header) = usize::try_from(n)
        .ok()
        .and_then(|n| head.get(8..)?.get(..n))
    else {
        return Ok(());
    };
    let Ok(serde_json::Value::Object(tensors)) = serde_json::from_slice(header) else {
        return Ok(());
    };
    let room = (usize::MAX as u64).saturating_sub(n.saturating_add(8));
    for (name, t) in &tensors {
        let offsets = t.get("data_offsets").and_then(|o| o.as_array());
        if let Some(end) = offsets
            .into_iter()
            .flatten()
            .filter_map(|o| o.as_u64())
            .find(|&o| o > room)
        {
            return Err(format!(
                "tensor `{name}` declares data up to byte {end}: more than a file can hold"
            ));
        }
    }
    Ok(())
}

/// An npy header's shape, refused when its dimensions multiply past 2^64
/// (npyz multiplies them unchecked: wrapped, a huge shape would pass as a
/// small or empty array). Read with the parser npyz itself uses; a header
/// it cannot parse is left to npyz to report.
fn shape_fits(head: &[u8]) -> Result<(), String> {
    use py_literal::Value;
    let text = match head.get(..8) {
        Some([0x93, b'N', b'U', b'M', b'P', b'Y', 1, _]) => head
            .get(8..10)
            .map(|b| u16::from_le_bytes([b[0], b[1]]) as usize)
            .and_then(|n| head.get(10..10 + n)),
        Some([0x93, b'N', b'U', b'M', b'P', b'Y', 2 | 3, _]) => head
            .get(8..12)
            .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as usize)
            .and_then(|n| head.get(12..12usize.checked_add(n)?)),
        _ => None,
    };
    let Some(text) = text
        .and_then(|t| std::str::from_utf8(t).ok())
        .map(|t| t.strip_suffix('\n').unwrap_or(t))
    else {
        return Ok(());
    };
    let Ok(Value::Dict(dict)) = text.parse::<Value>() else {
        return Ok(());
    };
    let shape = dict.iter().find_map(|(k, v)| match (k, v) {
        (Value::String(k), Value::Tuple(d) | Value::List(d)) if k == "shape" => Some(d),
        _ => None,
    });
    let Some(shape) = shape else { return Ok(()) };
    // npyz refuses a dimension that is not an integer in 0 ..= 2^64 - 1.
    let Some(dims) = shape
        .iter()
        .map(|d| match d {
            Value::Integer(i) => u64::try_from(i).ok(),
            _ => None,
        })
        .collect::<Option<Vec<u64>>>()
    else {
        return Ok(());
    };
    // Every partial product npyz forms (its strides too) is at most the
    // product of the nonzero dimensions.
    let fits = dims
        .iter()
        .filter(|&&d| d != 0)
        .try_fold(1u64, |n, &d| n.checked_mul(d))
        .is_some();
    if fits {
        Ok(())
    } else {
        Err(format!(
            "its header declares shape ({}): more elements than a file can hold",
            dims.iter()
                .map(u64::to_string)
                .collect::<Vec<_>>()
                .join(", ")
        ))
    }
}

/// The crate's error in words a user can act on.
fn safetensors_problem(e: &safetensors::SafeTensorError) -> String {
    use safetensors::SafeTensorError as E;
    match e {
        E::MetadataIncompleteBuffer => {
            "its length does not match the tensors its header declares (truncated, or bytes after the last tensor)".into()
        }
        E::InvalidHeaderLength | E::HeaderTooSmall => {
            "truncated: the header length is past the end of the file".into()
        }
        other => other.to_string(),
    }
}

fn npy(file: &std::fs::File, size: u64) -> Result<Vec<Tensor>, String> {
    let mut head = vec![0u8; size.min(MAX_NPY_HEADER) as usize];
    file.read_exact_at(&mut head, 0)
        .map_err(|e| format!("cannot read its header: {e}"))?;
    shape_fits(&head)?;
    let mut cursor = std::io::Cursor::new(&head[..]);
    let npy = npyz::NpyFile::new(&mut cursor).map_err(|e| {
        if size < 10 {
            format!("truncated: {size} bytes, shorter than an npy header")
        } else {
            format!("not a valid npy file: {e}")
        }
    })?;
    let header = npy.header().clone();
    drop(npy);
    let offset = cursor.position();
    if header.order() == npyz::Order::Fortran {
        return Err("is in Fortran order; save it C-contiguous (numpy.ascontiguousarray)".into());
    }
    let npyz::DType::Plain(ts) = header.dtype() else {
        return Err("holds a structured array; foldprint reads plain float arrays".into());
    };
    let big_endian = ts.endianness() == npyz::Endianness::Big;
    let dtype = match (ts.type_char(), ts.size_field()) {
        (npyz::TypeChar::Float, 4) => Dtype::F32,
        (npyz::TypeChar::Float, 2) => Dtype::F16,
        _ => {
            return Err(format!(
                "holds `{ts}` elements; foldprint reads float32 (`<f4`, `>f4`) and float16 (`<f2`)"
            ))
        }
    };
    let len = usize::try_from(header.len()).map_err(|_| "too many elements".to_string())?;
    let need = (len as u64)
        .checked_mul(dtype.bytes() as u64)
        .and_then(|b| b.checked_add(offset))
        .ok_or("too many elements")?;
    if need != size {
        return Err(format!(
            "{}: its header declares {len} elements ({need} bytes in all), the file has {size} bytes",
            if need > size {
                "truncated"
            } else {
                "bytes after the array"
            }
        ));
    }
    Ok(vec![Tensor {
        name: "array".into(),
        dtype,
        shape: header.shape().to_vec(),
        len,
        offset,
        big_endian,
    }])
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::time::{Duration, Instant};

    /// A safetensors file of one float32 tensor of `n` elements.
    fn safetensors_bytes(n: usize) -> Vec<u8> {
        let mut header = format!(
            "{{\"g\":{{\"dtype\":\"F32\",\"shape\":[{n}],\"data_offsets\":[0,{}]}}}}",
            4 * n
        );
        while header.len() % 8 != 0 {
            header.push(' ');
        }
        let mut b = (header.len() as u64).to_le_bytes().to_vec();
        b.extend_from_slice(header.as_bytes());
        b.extend((0..n).flat_map(|i| (i as f32).to_le_bytes()));
        b
    }

    /// A file cut short by another process while its header is read is an
    /// error (or, read before the cut, the tensors), never SIGBUS: the
    /// header is read with positioned reads, not through a mapping, whose
    /// pages past the new end kill the reader.
    #[test]
    fn a_file_truncated_while_its_header_is_read_is_an_error_not_a_signal() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("r0.safetensors");
        let bytes = safetensors_bytes(4096);
        std::fs::write(&path, &bytes).unwrap();
        let file = std::fs::File::open(&path).unwrap();
        let size = bytes.len() as u64;
        let stop = AtomicBool::new(false);
        let (mut read, mut refused, mut tries) = (0u32, 0u32, 0u32);
        std::thread::scope(|s| {
            s.spawn(|| {
                let w = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
                while !stop.load(Ordering::Relaxed) {
                    w.set_len(0).unwrap();
                    w.write_all_at(&bytes, 0).unwrap();
                }
            });
            // Until the cut has been seen both ways (or a generous bound
            // on a loaded machine), so the race is known to be exercised.
            let started = Instant::now();
            while tries < 20_000 || (read == 0 || refused == 0) {
                if started.elapsed() > Duration::from_secs(60) {
                    break;
                }
                tries += 1;
                match tensors(&file, size, Format::Safetensors) {
                    Ok(t) => {
                        assert_eq!(t.len(), 1);
                        assert_eq!(t[0].len, 4096);
                        read += 1;
                    }
                    Err(_) => refused += 1,
                }
            }
            stop.store(true, Ordering::Relaxed);
        });
        assert!(
            read > 0 && refused > 0,
            "{read} read, {refused} refused of {tries}"
        );
    }
}
