//! Compiled kernels on disk, so a warm start skips NVRTC:
//! `$XDG_CACHE_HOME/foldprint/kernels` (else `~/.cache/foldprint/kernels`).
//!
//! An entry is keyed by the SHA-256 of everything that decides its bytes:
//! the program name, the source NVRTC compiles (generated `#define`s
//! included), the SHA-256 of the NVRTC library file that would compile it,
//! the option list, the target and whether the target was named. It is
//! written atomically (temporary file, fsync, rename) and carries the
//! SHA-256 of its image, so a truncated or altered entry is detected and
//! compiled again, never loaded. `--no-kernel-cache` (and every child run of
//! `audit`) compiles fresh and leaves the cache alone.

use super::super::cache_dir;
use super::super::error::GpuError;
use super::super::mapped::HashMemo;
use super::nvrtc::Image;
use super::target::ResolvedTarget;
use serde::{Deserialize, Serialize};
use sha2::{Digest as _, Sha256};
use std::path::{Path, PathBuf};

/// First line of every entry; a new layout gets a new line (and so misses).
const MAGIC: &[u8] = b"foldprint kernel cache entry v1\n";

/// Where the cache lives for this process, if anywhere: `kernels` in
/// foldprint's cache directory ([`cache_dir::root`]).
pub fn default_dir() -> Option<PathBuf> {
    Some(cache_dir::root()?.join("kernels"))
}

/// Everything that decides a compiled image's bytes.
#[derive(Debug, Clone, Copy)]
pub struct KeyParts<'a> {
    pub program: &'a str,
    /// The source exactly as NVRTC gets it.
    pub source: &'a str,
    /// SHA-256 (hex) of the NVRTC library file.
    pub nvrtc_sha256: crate::digest::Sha256,
    /// The option list exactly as NVRTC gets it.
    pub options: &'a [String],
    pub target: ResolvedTarget,
    /// The target was named by the caller (a flag check may refuse instead
    /// of falling back to PTX).
    pub explicit: bool,
}

/// The entry's key: SHA-256 (hex) over length-prefixed fields, so no two
/// different inputs can run together into the same bytes.
pub fn key(p: &KeyParts) -> String {
    let mut h = Sha256::new();
    let mut field = |bytes: &[u8]| {
        h.update((bytes.len() as u64).to_le_bytes());
        h.update(bytes);
    };
    field(MAGIC);
    field(p.program.as_bytes());
    field(p.source.as_bytes());
    // As hex: the keys of existing caches stay valid.
    field(p.nvrtc_sha256.to_string().as_bytes());
    field(&(p.options.len() as u64).to_le_bytes());
    for o in p.options {
        field(o.as_bytes());
    }
    field(p.target.kind.as_bytes());
    field(&p.target.arch.to_le_bytes());
    field(&[p.explicit as u8]);
    hex::encode(h.finalize())
}

/// What an entry says about its image, before the image's bytes.
#[derive(Debug, Serialize, Deserialize)]
struct Header {
    key: String,
    program: String,
    target_kind: String,
    target_arch: u32,
    options: Vec<String>,
    nvrtc_version: (i32, i32),
    log: String,
    note: Option<String>,
    data_len: usize,
    /// SHA-256 of the image bytes that follow (all of them).
    data_sha256: String,
}

/// What a lookup found.
#[derive(Debug)]
pub enum Lookup {
    Hit(Image),
    Miss,
    /// An entry exists but cannot be trusted (why); it will be replaced.
    Corrupt(String),
}

/// One cache directory.
#[derive(Debug, Clone)]
pub struct DiskCache {
    dir: PathBuf,
}

impl DiskCache {
    pub fn at(dir: impl Into<PathBuf>) -> Self {
        DiskCache { dir: dir.into() }
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The file-hash memo that goes with this cache: `file-sha256` beside
    /// its directory (`$XDG_CACHE_HOME/foldprint/file-sha256` for the default).
    pub fn file_memo(&self) -> HashMemo {
        let base = match self.dir.parent() {
            Some(p) if !p.as_os_str().is_empty() => p,
            _ => &self.dir,
        };
        HashMemo::at(base.join("file-sha256"))
    }

    /// The entry file of `key`.
    pub fn entry_path(&self, key: &str) -> PathBuf {
        self.dir.join(format!("{key}.bin"))
    }

    /// Read and check the entry of `key` for `program`.
    pub fn get(&self, key: &str, program: &'static str) -> Lookup {
        let path = self.entry_path(key);
        let bytes = match std::fs::read(&path) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Lookup::Miss,
            Err(e) => return Lookup::Corrupt(format!("{}: {e}", path.display())),
        };
        match decode(&bytes, key, program) {
            Ok(image) => Lookup::Hit(image),
            Err(why) => Lookup::Corrupt(format!("{}: {why}", path.display())),
        }
    }

    /// Store `image` under `key`, atomically.
    pub fn put(&self, key: &str, image: &Image) -> Result<PathBuf, GpuError> {
        std::fs::create_dir_all(&self.dir).map_err(|source| GpuError::Io {
            what: format!("cannot create {}", self.dir.display()),
            source,
        })?;
        let path = self.entry_path(key);
        crate::atomic::write(&path, &encode(key, image)).map_err(|source| GpuError::Io {
            what: format!("cannot write {}", path.display()),
            source,
        })?;
        Ok(path)
    }
}

fn encode(key: &str, image: &Image) -> Vec<u8> {
    let header = Header {
        key: key.to_string(),
        program: image.program.to_string(),
        target_kind: image.target.kind.to_string(),
        target_arch: image.target.arch,
        options: image.options.clone(),
        nvrtc_version: image.nvrtc_version,
        log: image.log.clone(),
        note: image.note.clone(),
        data_len: image.data.len(),
        data_sha256: hex::encode(Sha256::digest(&image.data)),
    };
    // serde_json escapes newlines inside strings: the header is one line.
    let json = serde_json::to_vec(&header).expect("a header of strings and integers serializes");
    let mut out = Vec::with_capacity(MAGIC.len() + json.len() + 1 + image.data.len());
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&json);
    out.push(b'\n');
    out.extend_from_slice(&image.data);
    out
}

/// Why an entry is not trusted: it is compiled again, and the note says why.
#[derive(Debug)]
struct Untrusted(String);

impl std::fmt::Display for Untrusted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

fn untrusted(why: impl Into<String>) -> Untrusted {
    Untrusted(why.into())
}

fn decode(bytes: &[u8], key: &str, program: &'static str) -> Result<Image, Untrusted> {
    let rest = bytes
        .strip_prefix(MAGIC)
        .ok_or_else(|| untrusted("not a foldprint kernel cache entry (v1)"))?;
    let nl = rest
        .iter()
        .position(|&b| b == b'\n')
        .ok_or_else(|| untrusted("header is cut short"))?;
    let header: Header = serde_json::from_slice(&rest[..nl])
        .map_err(|e| untrusted(format!("header unreadable: {e}")))?;
    let data = &rest[nl + 1..];
    if header.key != key {
        return Err(untrusted(format!("holds key {}, not {key}", header.key)));
    }
    if header.program != program {
        return Err(untrusted(format!(
            "holds {}, not {program}",
            header.program
        )));
    }
    if data.len() != header.data_len {
        return Err(untrusted(format!(
            "image is {} bytes, the header says {} (truncated?)",
            data.len(),
            header.data_len
        )));
    }
    let digest = hex::encode(Sha256::digest(data));
    if digest != header.data_sha256 {
        return Err(untrusted(format!(
            "image SHA-256 {digest} differs from the recorded {}",
            header.data_sha256
        )));
    }
    let kind = match header.target_kind.as_str() {
        "cubin" => "cubin",
        "ptx" => "ptx",
        other => return Err(untrusted(format!("unknown target kind `{other}`"))),
    };
    let mut image = Image {
        program,
        target: ResolvedTarget {
            kind,
            arch: header.target_arch,
        },
        options: header.options,
        nvrtc_version: header.nvrtc_version,
        sha256: String::new(),
        bytes: 0,
        log: header.log,
        note: header.note,
        data: data.to_vec(),
    };
    let (n, sha) = {
        let hashed = image.hashed_bytes();
        (hashed.len(), hex::encode(Sha256::digest(hashed)))
    };
    image.bytes = n;
    image.sha256 = sha;
    Ok(image)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn image(data: &[u8]) -> Image {
        Image {
            program: "foldprint_fold",
            target: ResolvedTarget {
                kind: "cubin",
                arch: 90,
            },
            options: vec!["--ftz=false".into(), "-arch=sm_90".into()],
            nvrtc_version: (12, 8),
            sha256: hex::encode(Sha256::digest(data)),
            bytes: data.len(),
            log: "line one\nline two".into(),
            note: Some("a note".into()),
            data: data.to_vec(),
        }
    }

    fn parts<'a>(options: &'a [String]) -> KeyParts<'a> {
        KeyParts {
            program: "foldprint_fold",
            source: "__global__ void k() {}",
            nvrtc_sha256: crate::digest::Sha256::from_bytes([0xaa; 32]),
            options,
            target: ResolvedTarget {
                kind: "cubin",
                arch: 90,
            },
            explicit: false,
        }
    }

    #[test]
    fn the_key_changes_with_every_input() {
        let opts = vec!["--ftz=false".to_string(), "-arch=sm_90".to_string()];
        let base = parts(&opts);
        let k0 = key(&base);
        assert_eq!(k0.len(), 64);
        assert_eq!(
            k0,
            key(&parts(&opts)),
            "the key is a function of its inputs"
        );
        let other_opts = vec!["--ftz=true".to_string(), "-arch=sm_90".to_string()];
        let joined = vec!["--ftz=false-arch=sm_90".to_string()];
        let variants = [
            KeyParts {
                program: "foldprint_generate",
                ..base
            },
            KeyParts {
                source: "__global__ void k() { }",
                ..base
            },
            KeyParts {
                nvrtc_sha256: crate::digest::Sha256::from_bytes([0xab; 32]),
                ..base
            },
            KeyParts {
                options: &other_opts,
                ..base
            },
            // Fields are length-prefixed: joining two options is another key.
            KeyParts {
                options: &joined,
                ..base
            },
            KeyParts {
                target: ResolvedTarget {
                    kind: "ptx",
                    arch: 90,
                },
                ..base
            },
            KeyParts {
                target: ResolvedTarget {
                    kind: "cubin",
                    arch: 80,
                },
                ..base
            },
            KeyParts {
                explicit: true,
                ..base
            },
        ];
        let mut seen = vec![k0];
        for v in &variants {
            let k = key(v);
            assert!(!seen.contains(&k), "{v:?} collides");
            seen.push(k);
        }
    }

    #[test]
    fn an_entry_round_trips() {
        let dir = tempfile::tempdir().unwrap();
        let cache = DiskCache::at(dir.path().join("kernels"));
        let img = image(b"\x7fELF fake cubin bytes");
        assert!(matches!(cache.get("k1", "foldprint_fold"), Lookup::Miss));
        let path = cache.put("k1", &img).unwrap();
        assert_eq!(path, cache.entry_path("k1"));
        let Lookup::Hit(back) = cache.get("k1", "foldprint_fold") else {
            panic!("no hit")
        };
        assert_eq!(back.data, img.data);
        assert_eq!(back.sha256, img.sha256);
        assert_eq!(back.bytes, img.bytes);
        assert_eq!(back.target, img.target);
        assert_eq!(back.options, img.options);
        assert_eq!(back.log, img.log);
        assert_eq!(back.note, img.note);
        assert_eq!(back.nvrtc_version, img.nvrtc_version);
        // Asked as another program or under another key: not this entry.
        assert!(matches!(
            cache.get("k1", "foldprint_generate"),
            Lookup::Corrupt(_)
        ));
        std::fs::copy(&path, cache.entry_path("k2")).unwrap();
        let Lookup::Corrupt(why) = cache.get("k2", "foldprint_fold") else {
            panic!("an entry filed under another key was trusted")
        };
        assert!(why.contains("holds key k1"), "{why}");
    }

    #[test]
    fn ptx_hash_excludes_the_nul_as_nvrtc_compile_does() {
        let dir = tempfile::tempdir().unwrap();
        let cache = DiskCache::at(dir.path());
        let mut img = image(b".version 8.7\n.target sm_90\n\0");
        img.target.kind = "ptx";
        cache.put("p", &img).unwrap();
        let Lookup::Hit(back) = cache.get("p", "foldprint_fold") else {
            panic!("no hit")
        };
        assert_eq!(back.data, img.data);
        assert_eq!(back.bytes, img.data.len() - 1);
        assert_eq!(
            back.sha256,
            hex::encode(Sha256::digest(&img.data[..img.data.len() - 1]))
        );
    }

    #[test]
    fn corrupt_or_truncated_entries_are_never_trusted() {
        let dir = tempfile::tempdir().unwrap();
        let cache = DiskCache::at(dir.path());
        let img = image(&[7u8; 4096]);
        let path = cache.put("k", &img).unwrap();
        let good = std::fs::read(&path).unwrap();
        let header_end = MAGIC.len()
            + good[MAGIC.len()..]
                .iter()
                .position(|&b| b == b'\n')
                .unwrap();
        let mut flipped = good.clone();
        *flipped.last_mut().unwrap() ^= 1;
        let mut wrong_magic = good.clone();
        wrong_magic[0] ^= 1;
        let cases: Vec<(&str, Vec<u8>, &str)> = vec![
            ("empty", Vec::new(), "not a foldprint"),
            (
                "truncated image",
                good[..good.len() - 1].to_vec(),
                "truncated",
            ),
            (
                "image cut off entirely",
                good[..header_end + 1].to_vec(),
                "truncated",
            ),
            (
                "cut inside the header",
                good[..MAGIC.len() + 10].to_vec(),
                "cut short",
            ),
            ("one bit flipped", flipped, "SHA-256"),
            ("magic changed", wrong_magic, "not a foldprint"),
            ("image grown", [good.as_slice(), b"x"].concat(), "truncated"),
        ];
        for (what, bytes, says) in cases {
            std::fs::write(&path, &bytes).unwrap();
            match cache.get("k", "foldprint_fold") {
                Lookup::Corrupt(why) => assert!(why.contains(says), "{what}: {why}"),
                other => panic!("{what}: {other:?}"),
            }
        }
        // A corrupt entry is replaced by the next put.
        cache.put("k", &img).unwrap();
        assert!(matches!(cache.get("k", "foldprint_fold"), Lookup::Hit(_)));
        assert_eq!(std::fs::read(&path).unwrap(), good);
    }

    #[test]
    fn writes_are_atomic_and_leave_no_temporary_files() {
        let dir = tempfile::tempdir().unwrap();
        let cache = DiskCache::at(dir.path().join("a").join("b"));
        for i in 0..3u8 {
            cache.put("k", &image(&[i; 100])).unwrap();
        }
        let names: Vec<String> = std::fs::read_dir(cache.dir())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(
            names,
            vec!["k.bin".to_string()],
            "temporary files left behind"
        );
        let Lookup::Hit(back) = cache.get("k", "foldprint_fold") else {
            panic!("no hit")
        };
        assert_eq!(back.data, vec![2u8; 100]);
        // A directory where the entry should be is refused, not replaced.
        let blocked = DiskCache::at(dir.path().join("c"));
        std::fs::create_dir_all(blocked.entry_path("k")).unwrap();
        assert!(blocked.put("k", &image(b"x")).is_err());
        assert!(blocked.entry_path("k").is_dir());
    }

    #[test]
    fn the_kernels_and_the_memo_share_the_cache_directory() {
        assert_eq!(default_dir(), cache_dir::root().map(|r| r.join("kernels")));
        // The file-hash memo sits beside the kernels.
        assert_eq!(
            DiskCache::at("/x/cache/foldprint/kernels")
                .file_memo()
                .dir(),
            Path::new("/x/cache/foldprint/file-sha256")
        );
        // The memo library provenance finds by itself is the default cache's.
        assert_eq!(
            HashMemo::default_location().map(|m| m.dir().to_path_buf()),
            default_dir().map(|d| DiskCache::at(d).file_memo().dir().to_path_buf())
        );
    }
}
