//! Provenance of the CUDA libraries this process actually mapped: read from
//! /proc/self/maps (what the loader resolved, not what a name suggests) and
//! hashed from disk, so a report proves which binary ran. Hashes may be
//! remembered across runs by file identity ([`HashMemo`]) when the kernel
//! cache is in use; `--no-kernel-cache` (and so `audit`) hashes every file.

use serde::{Deserialize, Serialize};
use sha2::{Digest as _, Sha256};
use std::collections::{BTreeMap, HashMap};
use std::io::Read as _;
use std::os::unix::ffi::OsStrExt as _;
use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

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

/// Every tracked library now mapped, with its SHA-256, each file hashed
/// afresh (once per process: the answer cannot change within one).
pub fn loaded_libraries() -> Vec<LoadedLibrary> {
    loaded_libraries_with(Hashing::Fresh)
}

/// Every tracked library now mapped, with its SHA-256 found as `how` says.
pub fn loaded_libraries_with(how: Hashing) -> Vec<LoadedLibrary> {
    let memo = match how {
        Hashing::Fresh => None,
        Hashing::Memo => HashMemo::default_location(),
    };
    mapped_paths()
        .into_iter()
        .map(|(family, path)| {
            let (sha256, bytes) = file_sha256(&path, memo.as_ref());
            LoadedLibrary {
                family: family.to_string(),
                path,
                sha256,
                bytes,
            }
        })
        .collect()
}

/// How a library file's SHA-256 may be found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Hashing {
    /// Read and hash the whole file (`--no-kernel-cache` and every audit
    /// child: what they report was computed from the bytes, in this run).
    Fresh,
    /// Take it from the memo in the cache directory when the file's
    /// identity is unchanged since it was hashed, else hash and remember.
    Memo,
}

impl Hashing {
    /// The memo goes with the kernel cache: used exactly when it is.
    pub fn with_kernel_cache(disk_cache: bool) -> Self {
        if disk_cache {
            Hashing::Memo
        } else {
            Hashing::Fresh
        }
    }
}

/// A hash found in this process, and whether it was read from the bytes.
#[derive(Debug, Clone)]
struct Known {
    sha256: Option<crate::digest::Sha256>,
    bytes: Option<u64>,
    fresh: bool,
}

type HashCache = Mutex<HashMap<String, Known>>;

fn process_cache() -> &'static HashCache {
    static CACHE: OnceLock<HashCache> = OnceLock::new();
    CACHE.get_or_init(|| Mutex::new(HashMap::new()))
}

/// SHA-256 and size of one file, found once per process, through `memo`
/// when given. A request without a memo never takes an answer that came
/// from one.
pub(crate) fn file_sha256(
    path: &str,
    memo: Option<&HashMemo>,
) -> (Option<crate::digest::Sha256>, Option<u64>) {
    let k = known_sha256(process_cache(), path, memo);
    (k.sha256, k.bytes)
}

/// `path`'s hash from `cache`, else from `memo` (if any) or the bytes.
fn known_sha256(cache: &HashCache, path: &str, memo: Option<&HashMemo>) -> Known {
    if let Ok(map) = cache.lock() {
        if let Some(k) = map.get(path) {
            if k.fresh || memo.is_some() {
                return k.clone();
            }
        }
    }
    let found = match memo {
        Some(m) => m
            .sha256(Path::new(path))
            .map(|h| (h.sha256, h.bytes, !h.from_memo)),
        None => hash_file(Path::new(path)).map(|(s, b)| (s, b, true)),
    };
    let known = match found {
        Ok((sha256, bytes, fresh)) => Known {
            sha256: Some(sha256),
            bytes: Some(bytes),
            fresh,
        },
        Err(_) => Known {
            sha256: None,
            bytes: None,
            fresh: true,
        },
    };
    if let Ok(mut map) = cache.lock() {
        map.insert(path.to_string(), known.clone());
    }
    known
}

/// SHA-256 and length of everything `f` reads from its start.
fn hash_reader(f: &mut std::fs::File) -> std::io::Result<(crate::digest::Sha256, u64)> {
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
            Err(e) => return Err(e),
        }
    }
    Ok((
        crate::digest::Sha256::from_bytes(sha.finalize().into()),
        total,
    ))
}

/// SHA-256 and length of the file at `path`, read in full.
pub fn hash_file(path: &Path) -> std::io::Result<(crate::digest::Sha256, u64)> {
    hash_reader(&mut std::fs::File::open(path)?)
}

/// What identifies one version of a file without reading it: any write to
/// its bytes sets its ctime (mtime can be set back by hand, ctime cannot),
/// a replacement is another inode, a copy elsewhere another device or inode.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileIdentity {
    pub dev: u64,
    pub ino: u64,
    pub size: u64,
    pub mtime: (i64, i64),
    pub ctime: (i64, i64),
}

impl FileIdentity {
    pub fn of(m: &std::fs::Metadata) -> Self {
        FileIdentity {
            dev: m.dev(),
            ino: m.ino(),
            size: m.size(),
            mtime: (m.mtime(), m.mtime_nsec()),
            ctime: (m.ctime(), m.ctime_nsec()),
        }
    }

    /// The later of mtime and ctime, as time since the epoch (a time
    /// before the epoch counts as the epoch).
    fn last_change(&self) -> Duration {
        let at = |(s, ns): (i64, i64)| {
            if s < 0 {
                Duration::ZERO
            } else {
                Duration::new(s as u64, ns.clamp(0, 999_999_999) as u32)
            }
        };
        at(self.mtime).max(at(self.ctime))
    }
}

/// First line of every memo file; a new layout gets a new line.
const MEMO_MAGIC: &str = "foldprint file-sha256 memo v1\n";

/// One memo file's record.
#[derive(Debug, Serialize, Deserialize)]
struct MemoRecord {
    path: String,
    identity: FileIdentity,
    sha256: crate::digest::Sha256,
}

/// A file's SHA-256 as [`HashMemo::sha256`] found it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileHash {
    pub sha256: crate::digest::Sha256,
    pub bytes: u64,
    /// Taken from the memo (the file was not read).
    pub from_memo: bool,
}

/// SHA-256s of large files (the NVRTC and driver libraries, ~100 MB each)
/// remembered by file identity, one small file per path in `dir`, so a warm
/// start does not read them again. A record is used only when the file's
/// identity (device, inode, size, mtime and ctime to the nanosecond) is
/// exactly the one it was hashed with; anything unreadable, malformed or
/// different is ignored and the file hashed again.
#[derive(Debug, Clone)]
pub struct HashMemo {
    dir: PathBuf,
    /// A file is remembered only once its last change is at least this old
    /// when hashing starts, so a write later in the same timestamp tick
    /// (filesystems keep times at a few milliseconds to 2 s) cannot leave
    /// the identity unchanged.
    settle: Duration,
}

impl HashMemo {
    /// Default settle time (longer than any common timestamp granularity).
    pub const SETTLE: Duration = Duration::from_secs(3);

    pub fn at(dir: impl Into<PathBuf>) -> Self {
        HashMemo {
            dir: dir.into(),
            settle: Self::SETTLE,
        }
    }

    /// The same, with another settle time (tests use zero).
    pub fn with_settle(mut self, settle: Duration) -> Self {
        self.settle = settle;
        self
    }

    /// The memo beside the default kernel cache (`file-sha256` in
    /// foldprint's cache directory), if there is a cache directory.
    pub fn default_location() -> Option<Self> {
        Some(Self::at(super::cache_dir::root()?.join("file-sha256")))
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The memo file of `path` (named by the SHA-256 of the path's bytes).
    pub fn record_path(&self, path: &Path) -> PathBuf {
        let name = hex::encode(Sha256::digest(path.as_os_str().as_bytes()));
        self.dir.join(format!("{name}.memo"))
    }

    /// The SHA-256 of the file at `path`: from its memo when its identity is
    /// unchanged, else read in full (and remembered when it is settled and
    /// did not change while it was read). Memo trouble never fails this.
    pub fn sha256(&self, path: &Path) -> std::io::Result<FileHash> {
        let started = SystemTime::now();
        let mut f = std::fs::File::open(path)?;
        let before = FileIdentity::of(&f.metadata()?);
        if let Some(sha256) = self.lookup(path, &before) {
            return Ok(FileHash {
                sha256,
                bytes: before.size,
                from_memo: true,
            });
        }
        let (sha256, bytes) = hash_reader(&mut f)?;
        let after = FileIdentity::of(&f.metadata()?);
        let settled = started
            .duration_since(UNIX_EPOCH)
            .is_ok_and(|now| before.last_change() + self.settle <= now);
        if after == before && bytes == before.size && settled {
            // An optimisation only: a memo that cannot be written is skipped.
            let _ = self.store(path, &before, sha256);
        }
        Ok(FileHash {
            sha256,
            bytes,
            from_memo: false,
        })
    }

    /// The remembered SHA-256 of `path` at `identity`, if a valid record says so.
    fn lookup(&self, path: &Path, identity: &FileIdentity) -> Option<crate::digest::Sha256> {
        let text = std::fs::read_to_string(self.record_path(path)).ok()?;
        let line = text.strip_prefix(MEMO_MAGIC)?.strip_suffix('\n')?;
        if line.contains('\n') {
            return None;
        }
        // A malformed digest fails to parse: the record is ignored.
        let r: MemoRecord = serde_json::from_str(line).ok()?;
        (r.path.as_bytes() == path.as_os_str().as_bytes() && r.identity == *identity)
            .then_some(r.sha256)
    }

    /// Best effort: a memo that cannot be written is hashed again next time.
    fn store(
        &self,
        path: &Path,
        identity: &FileIdentity,
        sha256: crate::digest::Sha256,
    ) -> std::io::Result<()> {
        let path_text = path
            .to_str()
            .ok_or_else(|| std::io::Error::other("path is not UTF-8"))?;
        std::fs::create_dir_all(&self.dir)?;
        let record = MemoRecord {
            path: path_text.to_string(),
            identity: *identity,
            sha256,
        };
        let json = serde_json::to_string(&record).map_err(std::io::Error::other)?;
        crate::atomic::write(
            &self.record_path(path),
            format!("{MEMO_MAGIC}{json}\n").as_bytes(),
        )
    }
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

    fn sha_hex(bytes: &[u8]) -> crate::digest::Sha256 {
        crate::digest::Sha256::of(bytes)
    }

    /// A file, its memo (settle 0: the file was just written) and its
    /// record path, in a fresh directory.
    fn setup(content: &[u8]) -> (tempfile::TempDir, PathBuf, HashMemo, PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("libnvrtc.so.12");
        std::fs::write(&file, content).unwrap();
        let memo = HashMemo::at(dir.path().join("memo")).with_settle(Duration::ZERO);
        let record = memo.record_path(&file);
        (dir, file, memo, record)
    }

    /// Replace the record's hash with `sha` (same identity, valid format).
    fn plant(record: &Path, sha: crate::digest::Sha256) {
        let text = std::fs::read_to_string(record).unwrap();
        let line = text.strip_prefix(MEMO_MAGIC).unwrap();
        let mut r: MemoRecord = serde_json::from_str(line.trim_end()).unwrap();
        r.sha256 = sha;
        let json = serde_json::to_string(&r).unwrap();
        std::fs::write(record, format!("{MEMO_MAGIC}{json}\n")).unwrap();
    }

    fn identity(path: &Path) -> FileIdentity {
        FileIdentity::of(&std::fs::metadata(path).unwrap())
    }

    /// Let the clock move past any timestamp tick before a change.
    fn tick() {
        std::thread::sleep(Duration::from_millis(30));
    }

    #[test]
    fn a_memo_hit_returns_the_remembered_hash_without_reading_the_file() {
        let content = vec![0x5au8; 3 << 20];
        let (_d, file, memo, record) = setup(&content);
        let first = memo.sha256(&file).unwrap();
        assert_eq!(
            first,
            FileHash {
                sha256: sha_hex(&content),
                bytes: content.len() as u64,
                from_memo: false
            }
        );
        assert!(record.is_file(), "nothing remembered");
        let second = memo.sha256(&file).unwrap();
        assert_eq!(second.sha256, first.sha256);
        assert!(second.from_memo);
        // A planted hash the bytes do not have is what comes back: the file
        // was not read.
        let planted = sha_hex(b"not the content");
        plant(&record, planted);
        let third = memo.sha256(&file).unwrap();
        assert_eq!(third.sha256, planted);
        assert!(third.from_memo);
        // Only the record is written: no temporary files are left.
        let names: Vec<_> = std::fs::read_dir(memo.dir()).unwrap().collect();
        assert_eq!(names.len(), 1);
    }

    #[test]
    fn any_change_of_identity_hashes_the_file_again() {
        let content = b"version one of the library".to_vec();
        let (dir, file, memo, record) = setup(&content);
        memo.sha256(&file).unwrap();
        let bogus = sha_hex(b"bogus");
        type Change<'a> = (&'a str, Box<dyn Fn() -> Vec<u8> + 'a>);
        let changes: Vec<Change> = vec![
            (
                // mtime put back where it was: only ctime tells.
                "touched, mtime restored",
                Box::new(|| {
                    let m = std::fs::metadata(&file).unwrap().modified().unwrap();
                    let f = std::fs::File::options().write(true).open(&file).unwrap();
                    f.set_modified(m).unwrap();
                    content.clone()
                }),
            ),
            (
                "same bytes written again",
                Box::new(|| {
                    std::fs::write(&file, &content).unwrap();
                    content.clone()
                }),
            ),
            (
                "other bytes of the same size, mtime restored",
                Box::new(|| {
                    let m = std::fs::metadata(&file).unwrap().modified().unwrap();
                    let other = b"version two of the library".to_vec();
                    assert_eq!(other.len(), content.len());
                    std::fs::write(&file, &other).unwrap();
                    let f = std::fs::File::options().write(true).open(&file).unwrap();
                    f.set_modified(m).unwrap();
                    other
                }),
            ),
            (
                "replaced by another file (new inode)",
                Box::new(|| {
                    let tmp = dir.path().join("new");
                    std::fs::write(&tmp, &content).unwrap();
                    std::fs::rename(&tmp, &file).unwrap();
                    content.clone()
                }),
            ),
            (
                "grown",
                Box::new(|| {
                    let grown = [content.as_slice(), b"!"].concat();
                    std::fs::write(&file, &grown).unwrap();
                    grown
                }),
            ),
        ];
        for (what, change) in changes {
            memo.sha256(&file).unwrap();
            plant(&record, bogus);
            let before = identity(&file);
            tick();
            let now = change();
            assert_ne!(identity(&file), before, "{what}: identity unchanged");
            let h = memo.sha256(&file).unwrap();
            assert!(!h.from_memo, "{what}: stale record trusted");
            assert_eq!(h.sha256, sha_hex(&now), "{what}");
            // And remembered again for the new identity.
            assert!(memo.sha256(&file).unwrap().from_memo, "{what}");
        }
    }

    #[test]
    fn malformed_records_are_ignored_and_replaced() {
        let content = b"library bytes".to_vec();
        let (_d, file, memo, record) = setup(&content);
        memo.sha256(&file).unwrap();
        let good = std::fs::read_to_string(&record).unwrap();
        let line = good.strip_prefix(MEMO_MAGIC).unwrap().trim_end();
        let r: MemoRecord = serde_json::from_str(line).unwrap();
        // Edited as JSON: a typed record cannot hold a malformed digest.
        let with = |f: &dyn Fn(&mut serde_json::Value)| {
            let mut r: serde_json::Value = serde_json::from_str(line).unwrap();
            f(&mut r);
            format!("{MEMO_MAGIC}{}\n", serde_json::to_string(&r).unwrap())
        };
        let bogus = sha_hex(b"bogus").to_string();
        let real = r.sha256.to_string();
        let cases: Vec<(&str, String)> = vec![
            ("empty", String::new()),
            ("magic only", MEMO_MAGIC.to_string()),
            ("no final newline", good.trim_end().replace(&real, &bogus)),
            (
                "other magic",
                good.replace("v1", "v2").replace(&real, &bogus),
            ),
            ("cut short", good[..good.len() - 10].to_string()),
            (
                "a second line",
                format!("{}{MEMO_MAGIC}", good.replace(&real, &bogus)),
            ),
            (
                "upper-case hex",
                with(&|r| r["sha256"] = bogus.to_uppercase().into()),
            ),
            ("short hex", with(&|r| r["sha256"] = bogus[..63].into())),
            ("not hex", with(&|r| r["sha256"] = "g".repeat(64).into())),
            (
                "another path",
                with(&|r| {
                    r["sha256"] = bogus.clone().into();
                    r["path"] = format!("{}x", r["path"].as_str().unwrap()).into()
                }),
            ),
            (
                "another inode",
                with(&|r| {
                    r["sha256"] = bogus.clone().into();
                    r["identity"]["ino"] = (r["identity"]["ino"].as_u64().unwrap() + 1).into()
                }),
            ),
            (
                "another ctime",
                with(&|r| {
                    r["sha256"] = bogus.clone().into();
                    let ns = &mut r["identity"]["ctime"][1];
                    *ns = (ns.as_i64().unwrap() ^ 1).into()
                }),
            ),
        ];
        // The control: a well-formed record with the right identity is used.
        std::fs::write(&record, with(&|r| r["sha256"] = bogus.clone().into())).unwrap();
        assert_eq!(memo.sha256(&file).unwrap().sha256.to_string(), bogus);
        for (what, text) in cases {
            std::fs::write(&record, &text).unwrap();
            let h = memo.sha256(&file).unwrap();
            assert!(!h.from_memo, "{what}: trusted");
            assert_eq!(h.sha256, sha_hex(&content), "{what}");
            assert_eq!(std::fs::read_to_string(&record).unwrap(), good, "{what}");
        }
        // A directory where the record should be: hashed, nothing breaks.
        std::fs::remove_file(&record).unwrap();
        std::fs::create_dir(&record).unwrap();
        let h = memo.sha256(&file).unwrap();
        assert!(!h.from_memo);
        assert_eq!(h.sha256, sha_hex(&content));
    }

    #[test]
    fn a_file_changed_moments_ago_is_not_remembered() {
        let (_d, file, memo, record) = setup(b"just written");
        let memo = memo.with_settle(HashMemo::SETTLE);
        for _ in 0..2 {
            let h = memo.sha256(&file).unwrap();
            assert!(!h.from_memo);
            assert_eq!(h.sha256, sha_hex(b"just written"));
        }
        assert!(!record.exists(), "an unsettled file was remembered");
    }

    #[test]
    fn fresh_hashing_never_uses_the_memo() {
        let content = b"the bytes".to_vec();
        let (_d, file, memo, record) = setup(&content);
        let path = file.to_str().unwrap();
        memo.sha256(&file).unwrap();
        let bogus = sha_hex(b"bogus");
        plant(&record, bogus);
        // With the memo, through a process cache: the remembered hash.
        let cache = HashCache::default();
        let k = known_sha256(&cache, path, Some(&memo));
        assert_eq!(k.sha256, Some(bogus));
        assert!(!k.fresh);
        // A fresh request in the same process does not take it: it reads.
        let k = known_sha256(&cache, path, None);
        assert_eq!(k.sha256, Some(sha_hex(&content)));
        assert_eq!(k.bytes, Some(content.len() as u64));
        assert!(k.fresh);
        // The record is left as it was.
        assert!(std::fs::read_to_string(&record)
            .unwrap()
            .contains(&bogus.to_string()));
        // A fresh answer serves later requests of either kind.
        assert_eq!(
            known_sha256(&cache, path, Some(&memo)).sha256,
            Some(sha_hex(&content))
        );
        // A missing file has no hash either way.
        let gone = format!("{path}.missing");
        assert_eq!(known_sha256(&cache, &gone, Some(&memo)).sha256, None);
        assert_eq!(known_sha256(&cache, &gone, None).sha256, None);
    }
}
