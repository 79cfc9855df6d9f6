//! Output files that never destroy or forge: every file is written to a
//! fresh temp file with an unpredictable name (created with O_EXCL, so a
//! planted symlink is never followed), synced, then renamed over the
//! target. An interrupted run leaves the old file or nothing, never a
//! truncated one. Targets that are not regular files (symlinks, fifos,
//! devices, directories) are refused rather than replaced.

use std::io::Write;
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// The directory a target lives in (`.` for a bare file name).
pub fn parent_dir(path: &Path) -> &Path {
    match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    }
}

/// What kind of thing is at `path`, in words, when it is not a regular file.
fn special_kind(ft: &std::fs::FileType) -> Option<&'static str> {
    if ft.is_file() {
        None
    } else if ft.is_symlink() {
        Some("a symbolic link")
    } else if ft.is_dir() {
        Some("a directory")
    } else if ft.is_fifo() {
        Some("a fifo")
    } else if ft.is_char_device() {
        Some("a character device")
    } else if ft.is_block_device() {
        Some("a block device")
    } else if ft.is_socket() {
        Some("a socket")
    } else {
        Some("not a regular file")
    }
}

/// Err unless `path` is absent or a regular file (not followed if a link).
pub fn check_replaceable(path: &Path) -> std::io::Result<()> {
    match std::fs::symlink_metadata(path) {
        Ok(m) => match special_kind(&m.file_type()) {
            None => Ok(()),
            Some(kind) => Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!("it is {kind}; foldprint only replaces regular files"),
            )),
        },
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e),
    }
}

/// Check, before any work, that `path` can be written: its directory
/// exists and takes new files, and the target is absent or a regular file.
pub fn check_writable(path: &Path) -> std::io::Result<()> {
    if path.file_name().is_none() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "names no file",
        ));
    }
    check_replaceable(path)?;
    let dir = parent_dir(path);
    match std::fs::metadata(dir) {
        Ok(m) if m.is_dir() => {}
        Ok(_) => {
            return Err(std::io::Error::new(
                std::io::ErrorKind::NotADirectory,
                format!("{} is not a directory", dir.display()),
            ))
        }
        Err(e) => {
            return Err(std::io::Error::new(
                e.kind(),
                format!("directory {}: {e}", dir.display()),
            ))
        }
    }
    // A probe file proves the directory takes new files (permissions,
    // read-only mounts) and a temp name as long as the real one (a name
    // too long fails here, before any work); it is removed at once.
    temp_file(path).map(drop)
}

/// A new temp file beside `path`: `.<name>.XXXXXX.tmp`, with the mode an
/// existing file has; new files get 0666 less the umask, as a plain
/// create would.
fn temp_file(path: &Path) -> std::io::Result<tempfile::NamedTempFile> {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "out".into());
    let mode = std::fs::symlink_metadata(path)
        .map(|m| m.permissions().mode() & 0o7777)
        .unwrap_or(0o666);
    tempfile::Builder::new()
        .prefix(&format!(".{name}."))
        .suffix(".tmp")
        .permissions(std::fs::Permissions::from_mode(mode))
        .tempfile_in(parent_dir(path))
}

/// An output written in full to its temp file and synced, not yet in place.
pub struct Staged {
    target: PathBuf,
    /// `None` once committed.
    tmp: Option<tempfile::NamedTempFile>,
}

/// Write `bytes` to a temp file beside `path` and sync it; [`Staged::commit`]
/// renames it over `path`. Dropped uncommitted, the temp file goes.
pub fn stage(path: &Path, bytes: &[u8]) -> std::io::Result<Staged> {
    check_replaceable(path)?;
    let tmp = temp_file(path)?;
    crate::interrupt::register_staging(tmp.path());
    let mut staged = Staged {
        target: path.to_path_buf(),
        tmp: Some(tmp),
    };
    if let Some(t) = staged.tmp.as_mut() {
        fill(t, bytes)?;
    }
    Ok(staged)
}

/// Write and sync through the plain file, not the temp-file wrapper, so
/// an error keeps its errno (ENOSPC must read as a full disk, exit 3).
fn fill(tmp: &mut tempfile::NamedTempFile, bytes: &[u8]) -> std::io::Result<()> {
    let f = tmp.as_file_mut();
    f.write_all(bytes)?;
    f.sync_all()
}

impl Staged {
    pub fn target(&self) -> &Path {
        &self.target
    }

    /// Check the target once more: something may have appeared.
    pub fn recheck(&self) -> std::io::Result<()> {
        check_replaceable(&self.target)
    }

    /// Rename the temp file over the target.
    pub fn commit(mut self) -> std::io::Result<()> {
        self.recheck()?;
        let Some(tmp) = self.tmp.take() else {
            return Ok(());
        };
        let tmp_path = tmp.path().to_path_buf();
        let r = tmp.persist(&self.target).map_err(|e| e.error);
        crate::interrupt::unregister_staging(&tmp_path);
        r?;
        sync_dir(parent_dir(&self.target));
        Ok(())
    }
}

impl Drop for Staged {
    fn drop(&mut self) {
        if let Some(t) = &self.tmp {
            crate::interrupt::unregister_staging(t.path());
        }
    }
}

pub fn write(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    stage(path, bytes)?.commit()
}

/// Make a rename in `dir` durable (best effort: some file systems refuse).
pub fn sync_dir(dir: &Path) {
    if let Ok(d) = std::fs::File::open(dir) {
        let _ = d.sync_all();
    }
}

/// The longest file name `dir`'s file system takes.
pub fn name_max(dir: &Path) -> usize {
    use std::os::unix::ffi::OsStrExt;
    let Ok(c) = std::ffi::CString::new(dir.as_os_str().as_bytes()) else {
        return 255;
    };
    // SAFETY: a NUL-terminated path; pathconf only reads it.
    let n = unsafe { libc::pathconf(c.as_ptr(), libc::_PC_NAME_MAX) };
    if n > 0 {
        n as usize
    } else {
        255
    }
}

/// Canonical form of a path that may not exist yet: its directory resolved,
/// its file name kept.
pub fn resolved(path: &Path) -> PathBuf {
    if let Ok(p) = std::fs::canonicalize(path) {
        return p;
    }
    let dir = std::fs::canonicalize(parent_dir(path)).unwrap_or_else(|_| parent_dir(path).into());
    match path.file_name() {
        Some(n) => dir.join(n),
        None => dir,
    }
}

/// Whether two paths name the same file (or would, once written).
pub fn same_file(a: &Path, b: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    if let (Ok(x), Ok(y)) = (std::fs::metadata(a), std::fs::metadata(b)) {
        return x.dev() == y.dev() && x.ino() == y.ino();
    }
    resolved(a) == resolved(b)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replaces_regular_files_and_refuses_links_and_fifos() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("r.json");
        write(&p, b"one").unwrap();
        write(&p, b"two").unwrap();
        assert_eq!(std::fs::read(&p).unwrap(), b"two");
        let victim = dir.path().join("victim");
        std::fs::write(&victim, b"keep").unwrap();
        let link = dir.path().join("link.json");
        std::os::unix::fs::symlink(&victim, &link).unwrap();
        assert!(write(&link, b"x").is_err());
        assert!(std::fs::symlink_metadata(&link)
            .unwrap()
            .file_type()
            .is_symlink());
        assert_eq!(std::fs::read(&victim).unwrap(), b"keep");
        let names: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        assert!(
            names.iter().all(|n| !n.ends_with(".tmp")),
            "no temp file left: {names:?}"
        );
    }

    /// A full disk while staging an output is "no space" (exit 3), not bad
    /// input: the error keeps its errno through the temp-file wrapper.
    #[test]
    fn a_full_disk_while_staging_reads_as_missing_space() {
        use crate::exit::{io_exit_code, ExitCode};
        let dir = tempfile::tempdir().unwrap();
        let path = tempfile::NamedTempFile::new_in(dir.path())
            .unwrap()
            .into_temp_path();
        // /dev/full: every write fails with ENOSPC, as on a full disk.
        let full = std::fs::OpenOptions::new()
            .write(true)
            .open("/dev/full")
            .unwrap();
        let mut tmp = tempfile::NamedTempFile::from_parts(full, path);
        let e = fill(&mut tmp, b"{}").unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::ENOSPC), "{e}");
        assert_eq!(io_exit_code(&e), ExitCode::Unavailable);
        // The wrapper's own write (which adds the path) keeps only the
        // kind; that must map to exit 3 as well.
        let wrapped = tmp.write_all(b"{}").unwrap_err();
        assert_eq!(io_exit_code(&wrapped), ExitCode::Unavailable, "{wrapped}");
        let run = crate::runner::RunError::Output {
            path: "r.json".into(),
            source: e,
        };
        use crate::exit::HasExitCode;
        assert_eq!(run.exit_code(), ExitCode::Unavailable);
    }

    #[test]
    fn same_file_sees_through_spellings() {
        let dir = tempfile::tempdir().unwrap();
        let a = dir.path().join("a.json");
        assert!(same_file(&a, &dir.path().join(".").join("a.json")));
        std::fs::write(&a, b"x").unwrap();
        let sub = dir.path().join("s");
        std::fs::create_dir(&sub).unwrap();
        assert!(same_file(&a, &sub.join("..").join("a.json")));
        assert!(!same_file(&a, &dir.path().join("b.json")));
    }
}
