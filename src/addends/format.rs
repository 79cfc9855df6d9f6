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

/// Element types read as addends: float32 as is, the 16-bit ones widened
/// to float32 (exactly: every bfloat16 and float16 value is a float32).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Dtype {
    F32,
    Bf16,
    F16,
}

impl Dtype {
    pub const fn name(self) -> &'static str {
        match self {
            Dtype::F32 => "f32",
            Dtype::Bf16 => "bf16",
            Dtype::F16 => "f16",
        }
    }
    pub const fn bytes(self) -> usize {
        match self {
            Dtype::F32 => 4,
            Dtype::Bf16 | Dtype::F16 => 2,
        }
    }
}

impl std::fmt::Display for Dtype {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.pad(self.name())
    }
}

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
    // SAFETY: a read-only private mapping of a regular file we opened; only
    // the header bytes are read through it (the crate checks the sizes it
    // declares against the file's length without touching the data), and
    // it is unmapped before this function returns.
    let map = unsafe { memmap2::Mmap::map(file) }.map_err(|e| format!("cannot map it: {e}"))?;
    let (header_len, meta) = safetensors::SafeTensors::read_metadata(&map)
        .map_err(|e| format!("not a valid safetensors file: {}", safetensors_problem(&e)))?;
    let data_start = 8 + header_len as u64;
    let mut out = Vec::new();
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
        let len: usize = info.shape.iter().product();
        out.push(Tensor {
            name,
            dtype,
            shape: info.shape.iter().map(|&d| d as u64).collect(),
            len,
            offset: data_start + info.data_offsets.0 as u64,
            big_endian: false,
        });
    }
    if out.is_empty() {
        return Err("holds no tensors".into());
    }
    out.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(out)
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
