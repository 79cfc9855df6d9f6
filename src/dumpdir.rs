//! All-or-nothing dump directories. A run writes its arenas into a fresh
//! hidden sibling directory (`.<name>.partial-XXXXXX`), adds SHA256SUMS,
//! and only then swaps it in for the target in one rename. A failed,
//! interrupted or concurrent run never leaves a target whose SHA256SUMS
//! disagrees with its files: readers see the old directory or the new one.
//! An existing target is only replaced when it holds nothing but dump
//! files (`*.bin` and `SHA256SUMS`), so a mistyped `--dump` cannot delete
//! someone's directory.

use std::io::Write;
use std::path::{Path, PathBuf};

fn refuse(message: String) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::InvalidInput, message)
}

/// Check that `target` may become (or be replaced by) a dump directory.
pub fn check_target(target: &Path) -> std::io::Result<()> {
    match std::fs::symlink_metadata(target) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
        Ok(m) if m.file_type().is_symlink() => {
            return Err(refuse(
                "it is a symbolic link; give the directory itself".into(),
            ))
        }
        Ok(m) if !m.is_dir() => return Err(refuse("it exists and is not a directory".into())),
        Ok(_) => {
            for entry in std::fs::read_dir(target)? {
                let entry = entry?;
                let name = entry.file_name();
                let name = name.to_string_lossy();
                let is_file = entry.file_type()?.is_file();
                if !(is_file && (name == "SHA256SUMS" || name.ends_with(".bin"))) {
                    return Err(refuse(format!(
                        "it holds `{name}`, which is not a dump file; foldprint replaces only \
                         directories of its own dumps (use a new or empty directory)"
                    )));
                }
            }
        }
    }
    let parent = crate::atomic::parent_dir(target);
    if !parent.is_dir() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::NotFound,
            format!("directory {} does not exist", parent.display()),
        ));
    }
    Ok(())
}

/// A dump directory being written; dropped without [`DumpDir::commit`],
/// it vanishes and the target is untouched.
pub struct DumpDir {
    target: PathBuf,
    staging: tempfile::TempDir,
    /// (sha256, file name) in write order.
    files: Vec<(String, String)>,
}

impl DumpDir {
    pub fn create(target: &Path) -> std::io::Result<DumpDir> {
        check_target(target)?;
        let name = target
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| "dump".into());
        let staging = tempfile::Builder::new()
            .prefix(&format!(".{name}.partial-"))
            .tempdir_in(crate::atomic::parent_dir(target))?;
        Ok(DumpDir {
            target: target.to_path_buf(),
            staging,
            files: Vec::new(),
        })
    }

    pub fn target(&self) -> &Path {
        &self.target
    }

    /// Write one file; its SHA-256 goes into SHA256SUMS at commit.
    pub fn write(&mut self, name: &str, bytes: &[u8]) -> std::io::Result<PathBuf> {
        let path = self.staging.path().join(name);
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&path)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        self.files
            .push((crate::digest::sha256_hex(bytes), name.to_string()));
        Ok(self.target.join(name))
    }

    /// Write SHA256SUMS and swap the directory in for the target.
    pub fn commit(self) -> std::io::Result<()> {
        let sums: String = self
            .files
            .iter()
            .map(|(h, n)| format!("{h}  {n}\n"))
            .collect();
        let path = self.staging.path().join("SHA256SUMS");
        let mut f = std::fs::File::create(&path)?;
        f.write_all(sums.as_bytes())?;
        f.sync_all()?;
        drop(f);
        // A directory a user made for it keeps its usual mode (tempdir is 0700).
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&self.target)
            .map(|m| m.permissions().mode() & 0o7777)
            .unwrap_or(0o755);
        std::fs::set_permissions(self.staging.path(), std::fs::Permissions::from_mode(mode))?;
        // The target may have changed since the run began.
        check_target(&self.target)?;
        let staging = self.staging.keep();
        let result = swap_in(&staging, &self.target);
        // Whatever sits at `staging` now is the old directory (or, on
        // failure, the new one): it goes either way.
        let _ = std::fs::remove_dir_all(&staging);
        result
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
    dump_name_of(&case.experiment, &case.id, arena, false)
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
        let h = crate::digest::sha256_hex(format!("{experiment}\0{id}").as_bytes());
        format!("~{}", &h[..16])
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
        assert_eq!(listing(&t), ["SHA256SUMS", "x.a0.bin", "y.a0.bin"]);
        // A second run with other files replaces the directory, not merges.
        let mut d = DumpDir::create(&t).unwrap();
        d.write("z.a0.bin", b"0000").unwrap();
        d.commit().unwrap();
        assert_eq!(listing(&t), ["SHA256SUMS", "z.a0.bin"]);
        // Dropped without commit: the old directory stays, nothing beside it.
        let mut d = DumpDir::create(&t).unwrap();
        d.write("w.a0.bin", b"9999").unwrap();
        drop(d);
        assert_eq!(listing(&t), ["SHA256SUMS", "z.a0.bin"]);
        assert_eq!(listing(root.path()), ["d"]);
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
}
