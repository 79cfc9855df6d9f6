//! All-or-nothing dump directories. A run writes its arenas into a fresh
//! hidden sibling directory (`.<name>.partial-XXXXXX`), adds SHA256SUMS
//! and a manifest ([`MANIFEST`]: the tool, the format and the dtype of
//! every file that is not float32), and only then
//! swaps it in for the target in one rename. A failed, interrupted or
//! concurrent run never leaves a target whose SHA256SUMS disagrees with
//! its files: readers see the old directory or the new one. An existing
//! target is only replaced when it is empty or foldprint made it (its
//! manifest is there and nothing but dump files beside it), so a mistyped
//! `--dump` cannot delete someone's directory, even one of `*.bin` files.

use crate::dtype::Dtype;
use std::io::Write;
use std::path::{Path, PathBuf};

/// The marker file of a dump directory foldprint made.
pub const MANIFEST: &str = "FOLDPRINT-DUMP.json";
/// The manifest's `format`.
pub const DUMP_FORMAT: &str = "foldprint-dump";
pub const DUMP_VERSION: u32 = 1;

/// Files of a dump directory that are not arenas.
pub fn is_bookkeeping(name: &str) -> bool {
    name == "SHA256SUMS" || name == MANIFEST
}

fn refuse(message: String) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::InvalidInput, message)
}

/// The manifest. `dtypes` maps each file of a 16-bit dtype to it; a file
/// it does not list holds float32, as every file of a manifest without the
/// key does (those written before the dtypes), so an all-f32 directory's
/// manifest is the same as before.
fn manifest_text(files: &[(String, Dtype)]) -> String {
    let narrow: Vec<String> = files
        .iter()
        .filter(|(_, d)| !d.is_f32())
        .map(|(n, d)| {
            format!(
                "    {}: \"{d}\"",
                serde_json::to_string(n).unwrap_or_default()
            )
        })
        .collect();
    let dtypes = if narrow.is_empty() {
        String::new()
    } else {
        format!(",\n  \"dtypes\": {{\n{}\n  }}", narrow.join(",\n"))
    };
    format!(
        "{{\n  \"format\": \"{DUMP_FORMAT}\",\n  \"version\": {DUMP_VERSION},\n  \"tool\": \"foldprint {}\",\n  \"sums\": \"SHA256SUMS\"{dtypes}\n}}\n",
        env!("CARGO_PKG_VERSION")
    )
}

/// The dtype of each dump file `dir`'s manifest lists (files it does not
/// list, and every file of a manifest without `dtypes`, are float32).
pub fn manifest_dtypes(dir: &Path) -> Result<std::collections::BTreeMap<String, Dtype>, String> {
    let path = dir.join(MANIFEST);
    let bytes = crate::input::read_capped(&path, crate::input::MAX_REPORT_BYTES)
        .map_err(|e| format!("{MANIFEST}: cannot be read: {e}"))?;
    let v: serde_json::Value =
        serde_json::from_slice(&bytes).map_err(|e| format!("{MANIFEST}: not JSON: {e}"))?;
    if v.get("format").and_then(|f| f.as_str()) != Some(DUMP_FORMAT) {
        return Err(format!("{MANIFEST}: does not say format \"{DUMP_FORMAT}\""));
    }
    let mut out = std::collections::BTreeMap::new();
    match v.get("dtypes") {
        None => {}
        Some(serde_json::Value::Object(m)) => {
            for (name, d) in m {
                let d: Dtype = d.as_str().and_then(|s| s.parse().ok()).ok_or_else(|| {
                    format!("{MANIFEST}: dtypes.{name} is {d}, not \"bf16\", \"f16\" or \"f32\"")
                })?;
                out.insert(name.clone(), d);
            }
        }
        Some(other) => {
            return Err(format!(
                "{MANIFEST}: dtypes is {other}, not an object of file names"
            ))
        }
    }
    Ok(out)
}

/// Whether `dir` holds a manifest foldprint wrote (any version of the tool).
fn has_manifest(dir: &Path) -> Result<(), String> {
    let path = dir.join(MANIFEST);
    let bytes = crate::input::read_capped(&path, 64 << 10).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => format!("it has no {MANIFEST}"),
        _ => format!("its {MANIFEST} cannot be read: {e}"),
    })?;
    let v: serde_json::Value =
        serde_json::from_slice(&bytes).map_err(|e| format!("its {MANIFEST} is not JSON: {e}"))?;
    if v.get("format").and_then(|f| f.as_str()) != Some(DUMP_FORMAT) {
        return Err(format!(
            "its {MANIFEST} does not say format \"{DUMP_FORMAT}\""
        ));
    }
    Ok(())
}

/// The file names a dump directory's SHA256SUMS lists.
fn listed_in_sums(dir: &Path) -> Result<std::collections::HashSet<String>, String> {
    let bytes = crate::input::read_capped(&dir.join("SHA256SUMS"), crate::input::MAX_REPORT_BYTES)
        .map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => "it has no SHA256SUMS".to_string(),
            _ => format!("its SHA256SUMS cannot be read: {e}"),
        })?;
    let text = String::from_utf8_lossy(&bytes);
    // `sha256sum` lines: 64 hex digits, two spaces (or space and `*`), the name.
    Ok(text
        .lines()
        .filter_map(|l| l.get(66..).filter(|_| l.len() > 66))
        .map(str::to_string)
        .collect())
}

/// Check that `target` may become (or be replaced by) a dump directory:
/// absent, empty, or a dump directory foldprint made.
pub fn check_target(target: &Path) -> std::io::Result<()> {
    // `link/` names the directory the link points to: look at the link.
    let bare = strip_trailing_slashes(target);
    match std::fs::symlink_metadata(&bare) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
        Ok(m) if m.file_type().is_symlink() => {
            return Err(refuse(
                "it is a symbolic link; give the directory itself".into(),
            ))
        }
        Ok(m) if !m.is_dir() => return Err(refuse("it exists and is not a directory".into())),
        Ok(_) => {
            let mut bins = Vec::new();
            let mut empty = true;
            for entry in std::fs::read_dir(&bare)? {
                let entry = entry?;
                empty = false;
                let name = entry.file_name();
                let name = name.to_string_lossy();
                let is_file = entry.file_type()?.is_file();
                if !(is_file && (is_bookkeeping(&name) || name.ends_with(".bin"))) {
                    return Err(refuse(format!(
                        "it holds `{name}`, which is not a dump file; foldprint replaces only \
                         directories of its own dumps (use a new or empty directory)"
                    )));
                }
                if name.ends_with(".bin") {
                    bins.push(name.into_owned());
                }
            }
            if !empty {
                let not_ours = |why: String| {
                    refuse(format!(
                        "{why}, so foldprint did not make it and will not replace it \
                         (use a new or empty directory)"
                    ))
                };
                has_manifest(&bare).map_err(not_ours)?;
                // A file someone put into an old dump directory is theirs.
                let listed = listed_in_sums(&bare).map_err(not_ours)?;
                if let Some(stray) = bins.iter().find(|b| !listed.contains(b.as_str())) {
                    return Err(refuse(format!(
                        "it holds `{stray}`, which its SHA256SUMS does not list, so foldprint \
                         did not write it and will not delete it (move it, or use a new or \
                         empty directory)"
                    )));
                }
            }
        }
    }
    let parent = crate::atomic::parent_dir(&bare);
    if !parent.is_dir() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::NotFound,
            format!("directory {} does not exist", parent.display()),
        ));
    }
    Ok(())
}

/// `d/` and `d//` as `d` (a lone `/` stays).
fn strip_trailing_slashes(p: &Path) -> PathBuf {
    use std::os::unix::ffi::OsStrExt;
    let b = p.as_os_str().as_bytes();
    let mut n = b.len();
    while n > 1 && b[n - 1] == b'/' {
        n -= 1;
    }
    PathBuf::from(std::ffi::OsStr::from_bytes(&b[..n]))
}

/// The staging directory's name prefix for `target`.
fn staging_prefix(target: &Path) -> String {
    let name = target
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "dump".into());
    format!(".{name}.partial-")
}

fn staging_dir(target: &Path) -> std::io::Result<tempfile::TempDir> {
    tempfile::Builder::new()
        .prefix(&staging_prefix(target))
        .tempdir_in(crate::atomic::parent_dir(target))
}

/// Everything about `target` that can be known before a run: it may be
/// replaced, its staging directory (same name length as the real one) can
/// be made beside it, and every dump file name fits the file system.
pub fn preflight<'n>(
    target: &Path,
    names: impl IntoIterator<Item = &'n str>,
) -> std::io::Result<()> {
    check_target(target)?;
    let target = strip_trailing_slashes(target);
    let probe = staging_dir(&target)?;
    let max = crate::atomic::name_max(probe.path());
    for n in names.into_iter().chain([MANIFEST, "SHA256SUMS"]) {
        if n.len() > max {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidFilename,
                format!(
                    "the dump file name {n} is {} bytes, longer than the {max} this file \
                     system takes (shorten the case id or experiment name)",
                    n.len()
                ),
            ));
        }
    }
    Ok(())
}

/// Read one dump file: a regular file only, never more than `declared`
/// bytes (a report's arena length x 4) or, without one, than the largest
/// arena a case may have.
pub fn read_dump_file(path: &Path, declared: Option<u64>) -> std::io::Result<Vec<u8>> {
    let cap = declared.unwrap_or(crate::experiment::MAX_CASE_BYTES);
    let (f, size) = crate::input::open_regular(path)?;
    if size > cap {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("it holds {size} bytes, more than the {cap} declared for it"),
        ));
    }
    crate::input::read_open(f, size)
}

/// A dump directory being written; dropped without [`DumpDir::commit`],
/// it vanishes and the target is untouched.
pub struct DumpDir {
    target: PathBuf,
    /// `None` once committed.
    staging: Option<tempfile::TempDir>,
    /// (sha256, file name, its elements' dtype) in write order.
    files: Vec<(crate::digest::Sha256, String, Dtype)>,
    sealed: bool,
}

impl DumpDir {
    pub fn create(target: &Path) -> std::io::Result<DumpDir> {
        check_target(target)?;
        let target = strip_trailing_slashes(target);
        let staging = staging_dir(&target)?;
        crate::interrupt::register_staging(staging.path());
        Ok(DumpDir {
            target,
            staging: Some(staging),
            files: Vec::new(),
            sealed: false,
        })
    }

    fn staging_path(&self) -> &Path {
        match &self.staging {
            Some(t) => t.path(),
            None => Path::new(""),
        }
    }

    pub fn target(&self) -> &Path {
        &self.target
    }

    /// Write one file of float32 values; its SHA-256 goes into SHA256SUMS
    /// at commit.
    pub fn write(&mut self, name: &str, bytes: &[u8]) -> std::io::Result<PathBuf> {
        self.write_as(name, bytes, Dtype::F32)
    }

    /// Write one file of `dtype`'s values (the manifest records it).
    pub fn write_as(&mut self, name: &str, bytes: &[u8], dtype: Dtype) -> std::io::Result<PathBuf> {
        let path = self.staging_path().join(name);
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&path)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        self.files
            .push((crate::digest::Sha256::of(bytes), name.to_string(), dtype));
        Ok(self.target.join(name))
    }

    /// Write SHA256SUMS and the manifest and sync the staging directory:
    /// everything that needs disk space, before any output is committed.
    pub fn seal(&mut self) -> std::io::Result<()> {
        if self.sealed {
            return Ok(());
        }
        let sums: String = self
            .files
            .iter()
            .map(|(h, n, _)| format!("{h}  {n}\n"))
            .collect();
        let dtypes: Vec<(String, Dtype)> =
            self.files.iter().map(|(_, n, d)| (n.clone(), *d)).collect();
        for (name, text) in [("SHA256SUMS", sums), (MANIFEST, manifest_text(&dtypes))] {
            let mut f = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(self.staging_path().join(name))?;
            f.write_all(text.as_bytes())?;
            f.sync_all()?;
        }
        // A directory a user made for it keeps its usual mode (tempdir is 0700).
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&self.target)
            .map(|m| m.permissions().mode() & 0o7777)
            .unwrap_or(0o755);
        std::fs::set_permissions(self.staging_path(), std::fs::Permissions::from_mode(mode))?;
        std::fs::File::open(self.staging_path())?.sync_all()?;
        self.sealed = true;
        Ok(())
    }

    /// Check the target once more: it may have changed since the run began.
    pub fn recheck(&self) -> std::io::Result<()> {
        check_target(&self.target)
    }

    /// Seal (if not yet) and swap the directory in for the target.
    pub fn commit(mut self) -> std::io::Result<()> {
        self.seal()?;
        self.recheck()?;
        let staging = match self.staging.take() {
            Some(t) => t.keep(),
            None => return Ok(()),
        };
        let result = swap_in(&staging, &self.target);
        // Whatever sits at `staging` now is the old directory (or, on
        // failure, the new one): it goes either way.
        let _ = std::fs::remove_dir_all(&staging);
        crate::interrupt::unregister_staging(&staging);
        result?;
        crate::atomic::sync_dir(crate::atomic::parent_dir(&self.target));
        Ok(())
    }
}

impl Drop for DumpDir {
    fn drop(&mut self) {
        // Not committed: the TempDir removes the staging directory.
        if let Some(t) = &self.staging {
            crate::interrupt::unregister_staging(t.path());
        }
    }
}

/// Put `new` at `target`: a plain rename when nothing is there, else an
/// atomic exchange (Linux renameat2), else rename the old one aside first.
fn swap_in(new: &Path, target: &Path) -> std::io::Result<()> {
    if std::fs::symlink_metadata(target).is_err() {
        return std::fs::rename(new, target);
    }
    match exchange(new, target) {
        Ok(()) => Ok(()),
        Err(_) => {
            let aside = tempfile::Builder::new()
                .prefix(".foldprint-old-")
                .tempdir_in(crate::atomic::parent_dir(target))?
                .keep();
            std::fs::remove_dir(&aside)?;
            std::fs::rename(target, &aside)?;
            let r = std::fs::rename(new, target);
            if r.is_err() {
                let _ = std::fs::rename(&aside, target);
            } else {
                // `new` is gone; let the caller's cleanup remove the old one.
                let _ = std::fs::rename(&aside, new);
            }
            r
        }
    }
}

#[cfg(target_os = "linux")]
fn exchange(a: &Path, b: &Path) -> std::io::Result<()> {
    use std::os::unix::ffi::OsStrExt;
    let ca = std::ffi::CString::new(a.as_os_str().as_bytes())?;
    let cb = std::ffi::CString::new(b.as_os_str().as_bytes())?;
    // SAFETY: both strings are NUL-terminated and live across the call.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_renameat2,
            libc::AT_FDCWD,
            ca.as_ptr(),
            libc::AT_FDCWD,
            cb.as_ptr(),
            libc::RENAME_EXCHANGE,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

#[cfg(not(target_os = "linux"))]
fn exchange(_: &Path, _: &Path) -> std::io::Result<()> {
    Err(std::io::Error::from(std::io::ErrorKind::Unsupported))
}

/// `<experiment>.<case id>.a<k>.bin`, with anything unsafe in a file name replaced.
/// Not injective on its own: [`dump_names`] disambiguates.
pub fn dump_name(case: &crate::experiment::Case, arena: usize) -> String {
    dump_name_of(case.experiment(), case.id(), arena, false)
}

fn dump_name_of(experiment: &str, id: &str, arena: usize, tagged: bool) -> String {
    let clean = |s: &str| -> String {
        s.chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || "-_.=+".contains(c) {
                    c
                } else {
                    '_'
                }
            })
            .collect()
    };
    let tag = if tagged {
        // `~` never survives `clean`, so a tagged name meets no plain one.
        let h = crate::digest::Sha256::of(format!("{experiment}\0{id}").as_bytes());
        format!("~{}", h.short(16))
    } else {
        String::new()
    };
    format!("{}.{}{tag}.a{arena}.bin", clean(experiment), clean(id))
}

/// The dump file of every (experiment, case id, arena) of a run, one to
/// one: cases whose plain names would collide (exactly, or ignoring case,
/// as some file systems do) get a `~<hash of experiment and id>` tag.
/// `cases` lists (experiment, case id, number of arenas) of the cases that
/// run (skipped cases are not dumped and take no part).
pub fn dump_names<'c>(
    cases: &[(&'c str, &'c str, usize)],
) -> Result<std::collections::HashMap<(&'c str, &'c str, usize), String>, String> {
    use std::collections::{HashMap, HashSet};
    let entries: Vec<(&str, &str, usize)> = cases
        .iter()
        .flat_map(|&(e, i, n)| (0..n).map(move |a| (e, i, a)))
        .collect();
    let mut count: HashMap<String, usize> = HashMap::new();
    for &(e, i, a) in &entries {
        *count
            .entry(dump_name_of(e, i, a, false).to_lowercase())
            .or_default() += 1;
    }
    let mut out = HashMap::new();
    let mut seen = HashSet::new();
    for (e, i, a) in entries {
        let plain = dump_name_of(e, i, a, false);
        let name = if count[&plain.to_lowercase()] > 1 {
            dump_name_of(e, i, a, true)
        } else {
            plain
        };
        if !seen.insert(name.to_lowercase()) || out.insert((e, i, a), name.clone()).is_some() {
            return Err(format!(
                "case `{i}` of `{e}` would reuse dump file name {name}"
            ));
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn listing(dir: &Path) -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        v.sort();
        v
    }

    #[test]
    fn replaces_whole_directories_and_leaves_nothing_when_dropped() {
        let root = tempfile::tempdir().unwrap();
        let t = root.path().join("d");
        let mut d = DumpDir::create(&t).unwrap();
        d.write("x.a0.bin", b"1234").unwrap();
        d.write("y.a0.bin", b"5678").unwrap();
        d.commit().unwrap();
        assert_eq!(
            listing(&t),
            [MANIFEST, "SHA256SUMS", "x.a0.bin", "y.a0.bin"]
        );
        // A second run with other files replaces the directory, not merges.
        let mut d = DumpDir::create(&t).unwrap();
        d.write("z.a0.bin", b"0000").unwrap();
        d.commit().unwrap();
        assert_eq!(listing(&t), [MANIFEST, "SHA256SUMS", "z.a0.bin"]);
        // Dropped without commit: the old directory stays, nothing beside it.
        let mut d = DumpDir::create(&t).unwrap();
        d.write("w.a0.bin", b"9999").unwrap();
        drop(d);
        assert_eq!(listing(&t), [MANIFEST, "SHA256SUMS", "z.a0.bin"]);
        assert_eq!(listing(root.path()), ["d"]);
    }

    #[test]
    fn the_manifest_names_each_16_bit_file_and_old_ones_read_as_f32() {
        let root = tempfile::tempdir().unwrap();
        let t = root.path().join("d");
        let mut d = DumpDir::create(&t).unwrap();
        d.write("x.a0.bin", b"1234").unwrap();
        d.write_as("y\"q.a0.bin", b"12", Dtype::Bf16).unwrap();
        d.write_as("z.a0.bin", b"12", Dtype::F16).unwrap();
        d.commit().unwrap();
        let got = manifest_dtypes(&t).unwrap();
        let want: std::collections::BTreeMap<String, Dtype> = [
            ("y\"q.a0.bin".to_string(), Dtype::Bf16),
            ("z.a0.bin".to_string(), Dtype::F16),
        ]
        .into();
        assert_eq!(got, want);
        // Every float32 file: the manifest written before the dtypes.
        assert_eq!(
            manifest_text(&[("x.a0.bin".into(), Dtype::F32)]),
            manifest_text(&[])
        );
        assert!(!manifest_text(&[]).contains("dtypes"));
        std::fs::write(t.join(MANIFEST), manifest_text(&[])).unwrap();
        assert!(manifest_dtypes(&t).unwrap().is_empty());
        // Controls: a dtype foldprint does not write, and not an object.
        for bad in [r#""dtypes": {"x.a0.bin": "f64"}"#, r#""dtypes": ["bf16"]"#] {
            let text = format!("{{\"format\": \"{DUMP_FORMAT}\", {bad}}}");
            std::fs::write(t.join(MANIFEST), text).unwrap();
            assert!(manifest_dtypes(&t).is_err(), "{bad}");
        }
    }

    #[test]
    fn refuses_directories_that_hold_other_things() {
        let root = tempfile::tempdir().unwrap();
        std::fs::write(root.path().join("notes.txt"), b"mine").unwrap();
        let err = check_target(root.path()).unwrap_err().to_string();
        assert!(err.contains("notes.txt"), "{err}");
        let f = root.path().join("file");
        std::fs::write(&f, b"x").unwrap();
        assert!(check_target(&f).is_err());
        assert!(check_target(&root.path().join("no/such/d")).is_err());
    }

    #[test]
    fn only_listed_bins_may_be_replaced() {
        let root = tempfile::tempdir().unwrap();
        let t = root.path().join("d");
        let mut d = DumpDir::create(&t).unwrap();
        d.write("x.a0.bin", b"1234").unwrap();
        d.commit().unwrap();
        assert!(check_target(&t).is_ok());
        std::fs::write(t.join("mine.bin"), b"keep").unwrap();
        let err = check_target(&t).unwrap_err().to_string();
        assert!(err.contains("`mine.bin`, which its SHA256SUMS"), "{err}");
        std::fs::remove_file(t.join("mine.bin")).unwrap();
        std::fs::remove_file(t.join("SHA256SUMS")).unwrap();
        let err = check_target(&t).unwrap_err().to_string();
        assert!(err.contains("no SHA256SUMS"), "{err}");
    }
}
