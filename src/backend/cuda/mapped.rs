//! Provenance of the CUDA libraries this process actually mapped: read from
//! /proc/self/maps (what the loader resolved, not what a name suggests) and
//! hashed from disk, so a report proves which binary ran.

use sha2::{Digest as _, Sha256};
use std::collections::{BTreeMap, HashMap};
use std::io::Read as _;
use std::sync::{Mutex, OnceLock};

pub use crate::environment::LoadedLibrary;

/// Classify a mapped file name; `None` for libraries we do not track.
fn family_of(file_name: &str) -> Option<&'static str> {
    // Order matters: `libnvrtc-builtins` also starts with `libnvrtc`.
    const FAMILIES: [(&str, &str); 9] = [
        ("libnvrtc-builtins", "nvrtc-builtins"),
        ("libnvrtc.so", "nvrtc"),
        ("libcuda.so", "cuda"),
        ("libnvidia-ptxjitcompiler.so", "nvidia-ptxjitcompiler"),
        ("libnvidia-nvvm.so", "nvidia-nvvm"),
        ("libnvidia-gpucomp.so", "nvidia-gpucomp"),
        ("libnvidia-ml.so", "nvidia-ml"),
        ("libnccl.so", "nccl"),
        ("libnccl-net", "nccl"),
    ];
    FAMILIES
        .iter()
        .find(|(prefix, _)| file_name.starts_with(prefix))
        .map(|&(_, fam)| fam)
}

/// Distinct tracked library paths currently mapped, in first-seen order.
pub fn mapped_paths() -> Vec<(&'static str, String)> {
    let Ok(maps) = std::fs::read_to_string("/proc/self/maps") else {
        return Vec::new();
    };
    parse_maps(&maps)
}

fn parse_maps(maps: &str) -> Vec<(&'static str, String)> {
    let mut seen = Vec::<(&'static str, String)>::new();
    for line in maps.lines() {
        // address perms offset dev inode path (path may hold spaces)
        let mut fields = line.splitn(6, ' ');
        let path = fields.nth(5).map(str::trim_start).unwrap_or("");
        if !path.starts_with('/') {
            continue;
        }
        let path = path.strip_suffix(" (deleted)").unwrap_or(path);
        let name = path.rsplit('/').next().unwrap_or(path);
        if let Some(fam) = family_of(name) {
            if !seen.iter().any(|(_, p)| p == path) {
                seen.push((fam, path.to_string()));
            }
        }
    }
    seen
}

/// The first mapped path of a family (e.g. where `libcuda` resolved to).
pub fn mapped_path_of(family: &str) -> Option<String> {
    mapped_paths()
        .into_iter()
        .find(|(f, _)| *f == family)
        .map(|(_, p)| p)
}

/// Every tracked library now mapped, with its SHA-256 (cached per path:
/// libcuda is ~100 MB and the answer cannot change within a process).
pub fn loaded_libraries() -> Vec<LoadedLibrary> {
    mapped_paths()
        .into_iter()
        .map(|(family, path)| {
            let (sha256, bytes) = file_sha256(&path);
            LoadedLibrary {
                family: family.to_string(),
                path,
                sha256,
                bytes,
            }
        })
        .collect()
}

type HashCache = Mutex<HashMap<String, (Option<String>, Option<u64>)>>;

/// SHA-256 and size of one file, hashed once per process.
pub(crate) fn file_sha256(path: &str) -> (Option<String>, Option<u64>) {
    static CACHE: OnceLock<HashCache> = OnceLock::new();
    let cache = CACHE.get_or_init(|| Mutex::new(HashMap::new()));
    if let Ok(map) = cache.lock() {
        if let Some(v) = map.get(path) {
            return v.clone();
        }
    }
    let computed = hash_file(path);
    if let Ok(mut map) = cache.lock() {
        map.insert(path.to_string(), computed.clone());
    }
    computed
}

fn hash_file(path: &str) -> (Option<String>, Option<u64>) {
    let Ok(mut f) = std::fs::File::open(path) else {
        return (None, None);
    };
    let mut sha = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    let mut total = 0u64;
    loop {
        match f.read(&mut buf) {
            Ok(0) => break,
            Ok(k) => {
                sha.update(&buf[..k]);
                total += k as u64;
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(_) => return (None, None),
        }
    }
    (Some(hex::encode(sha.finalize())), Some(total))
}

/// CUDA_*, NCCL_* and LD_LIBRARY_PATH as this process sees them.
pub fn relevant_env() -> BTreeMap<String, String> {
    std::env::vars_os()
        .filter_map(|(k, v)| Some((k.into_string().ok()?, v.to_string_lossy().into_owned())))
        .filter(|(k, _)| k.starts_with("CUDA_") || k.starts_with("NCCL_") || k == "LD_LIBRARY_PATH")
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn maps_lines_are_classified_and_deduplicated() {
        let maps = "\
7f00-7f01 r--p 00000000 08:01 11 /usr/lib/x86_64-linux-gnu/libcuda.so.580.159.04
7f01-7f02 r-xp 00001000 08:01 11 /usr/lib/x86_64-linux-gnu/libcuda.so.580.159.04
7f02-7f03 r--p 00000000 08:01 12 /opt/nv/lib/libnvrtc.so.13.0.88
7f03-7f04 r--p 00000000 08:01 13 /opt/nv/lib/libnvrtc-builtins.so.13.0
7f04-7f05 r--p 00000000 08:01 14 /tmp/dir with space/libnccl.so.2
7f05-7f06 rw-p 00000000 00:00 0 [heap]
7f06-7f07 r--p 00000000 08:01 15 /usr/lib/libc.so.6
";
        let got = parse_maps(maps);
        assert_eq!(
            got,
            vec![
                (
                    "cuda",
                    "/usr/lib/x86_64-linux-gnu/libcuda.so.580.159.04".to_string()
                ),
                ("nvrtc", "/opt/nv/lib/libnvrtc.so.13.0.88".to_string()),
                (
                    "nvrtc-builtins",
                    "/opt/nv/lib/libnvrtc-builtins.so.13.0".to_string()
                ),
                ("nccl", "/tmp/dir with space/libnccl.so.2".to_string()),
            ]
        );
    }
}
