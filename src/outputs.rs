//! A run's outputs as a unit: the dump directory (`--dump`), the report
//! (`--out`) and the JUnit XML (`--junit`) are all staged in full first
//! (written, synced, beside their targets), and only then put in place:
//!
//! 1. the point of no return ([`crate::interrupt::begin_commit`]): a signal
//!    that came before it means nothing is written;
//! 2. the old JUnit file and, with `--dump`, the old report are removed;
//! 3. the dump directory is swapped in (one rename);
//! 4. the report, then the JUnit file, are renamed in.
//!
//! Every step that needs disk space is done before step 1, so a full disk
//! leaves the old outputs untouched. A crash between steps 2 and 4 leaves
//! some outputs of the new run and none of the old beside them (a missing
//! report, never an old report beside new dumps). Two runs on the same
//! outputs serialize on [`Lock`]s, held from before the first case to the
//! last rename.

use crate::runner::RunError;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// An exclusive `flock` on `.NAME.lock` beside an output; the lock file is
/// removed when the lock is dropped.
pub struct Lock {
    path: PathBuf,
    file: std::fs::File,
}

/// The lock file of `output` (`d/` locks as `d`).
pub fn lock_path(output: &Path) -> PathBuf {
    let name = output
        .components()
        .next_back()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .unwrap_or_else(|| "out".into());
    crate::atomic::parent_dir(output).join(format!(".{name}.lock"))
}

fn flock(file: &std::fs::File, op: libc::c_int) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    loop {
        // SAFETY: flock on a descriptor we own.
        if unsafe { libc::flock(file.as_raw_fd(), op) } == 0 {
            return Ok(());
        }
        let e = std::io::Error::last_os_error();
        if e.kind() != std::io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

/// How often a run waiting for another run's lock looks again, and for a
/// signal.
const LOCK_POLL: std::time::Duration = std::time::Duration::from_millis(50);

impl Lock {
    /// Take the lock of `output`, waiting for another run that holds it
    /// (`waiting` is called once if so). The wait polls, so that a signal
    /// ([`crate::interrupt`]) ends it within [`LOCK_POLL`]: `Ok(Err(signal))`,
    /// with nothing of the other run's touched.
    pub fn acquire(
        output: &Path,
        waiting: &mut dyn FnMut(&Path),
    ) -> std::io::Result<Result<Lock, i32>> {
        use std::os::unix::fs::OpenOptionsExt;
        let path = lock_path(output);
        let mut told = false;
        loop {
            let file = std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(false)
                .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
                .mode(0o600)
                .open(&path)?;
            loop {
                match flock(&file, libc::LOCK_EX | libc::LOCK_NB) {
                    Ok(()) => break,
                    Err(e) if e.raw_os_error() == Some(libc::EWOULDBLOCK) => {}
                    Err(e) => return Err(e),
                }
                // The file is the holder's (it removes it as it unlocks):
                // a signal leaves it alone.
                if let Some(signal) = crate::interrupt::pending() {
                    return Ok(Err(signal));
                }
                if !told {
                    waiting(output);
                    told = true;
                }
                std::thread::sleep(LOCK_POLL);
            }
            // The holder before us removes the file as it unlocks: ours must
            // still be the one at `path`, or we locked a removed file.
            let held = file.metadata()?;
            match std::fs::symlink_metadata(&path) {
                Ok(m) if m.dev() == held.dev() && m.ino() == held.ino() => {
                    // A second signal ends the process at once: the lock
                    // file goes with the staging files.
                    crate::interrupt::register_staging(&path);
                    return Ok(Ok(Lock { path, file }));
                }
                _ => continue,
            }
        }
    }
}

impl Drop for Lock {
    fn drop(&mut self) {
        // Removed while still held, so no one can lock it after us and
        // then see it vanish.
        let _ = std::fs::remove_file(&self.path);
        crate::interrupt::unregister_staging(&self.path);
        let _ = &self.file;
    }
}

/// The locks of every output, taken in one order (so two runs naming the
/// same outputs cannot deadlock). A signal while waiting for one ends the
/// wait: [`RunError::Interrupted`] before the first of `cases`, with every
/// lock taken so far released and its file removed.
pub fn lock_all(
    outputs: &[&Path],
    cases: usize,
    waiting: &mut dyn FnMut(&Path),
) -> Result<Vec<Lock>, RunError> {
    let mut paths: Vec<(PathBuf, &Path)> = outputs
        .iter()
        .map(|p| (crate::atomic::resolved(&lock_path(p)), *p))
        .collect();
    paths.sort();
    paths.dedup_by(|a, b| a.0 == b.0);
    let mut locks = Vec::with_capacity(paths.len());
    for (lock, output) in paths {
        match Lock::acquire(output, waiting) {
            Ok(Ok(l)) => locks.push(l),
            Ok(Err(signal)) => {
                return Err(RunError::Interrupted {
                    signal,
                    done: 0,
                    total: cases,
                })
            }
            Err(source) => return Err(RunError::Output { path: lock, source }),
        }
    }
    Ok(locks)
}

/// Stage `bytes` for `path` (see [`crate::atomic::stage`]).
pub fn stage(path: &Path, bytes: &[u8]) -> Result<crate::atomic::Staged, RunError> {
    crate::atomic::stage(path, bytes).map_err(|source| RunError::Output {
        path: path.to_path_buf(),
        source,
    })
}

/// Put every staged output in place, in the order the module describes.
/// `files` are in commit order (the report, then the JUnit file).
/// `cases` is the run's case count, for the message if a signal came first.
pub fn commit(
    dump: Option<crate::dumpdir::DumpDir>,
    files: Vec<crate::atomic::Staged>,
    cases: usize,
) -> Result<(), RunError> {
    let mut dump = dump;
    let dump_err = |d: &crate::dumpdir::DumpDir, source| RunError::Dump {
        path: d.target().to_path_buf(),
        source,
    };
    let file_err = |f: &crate::atomic::Staged, source| RunError::Output {
        path: f.target().to_path_buf(),
        source,
    };
    if let Some(d) = dump.as_mut() {
        d.seal().map_err(|e| dump_err(d, e))?;
        d.recheck().map_err(|e| dump_err(d, e))?;
    }
    for f in &files {
        f.recheck().map_err(|e| file_err(f, e))?;
    }
    if let Err(signal) = crate::interrupt::begin_commit() {
        return Err(RunError::Interrupted {
            signal,
            done: cases,
            total: cases,
        });
    }
    let result = commit_staged(dump, files);
    crate::interrupt::end_commit();
    result
}

fn commit_staged(
    dump: Option<crate::dumpdir::DumpDir>,
    files: Vec<crate::atomic::Staged>,
) -> Result<(), RunError> {
    // No old file may stay beside a new output: all but the first to be
    // renamed go first (that one replaces its old file in one rename).
    let keep = usize::from(dump.is_none());
    {
        for f in files.iter().skip(keep).rev() {
            match std::fs::remove_file(f.target()) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                    return Err(RunError::Output {
                        path: f.target().to_path_buf(),
                        source: e,
                    })
                }
                _ => {}
            }
        }
    }
    if let Some(d) = dump {
        let path = d.target().to_path_buf();
        d.commit()
            .map_err(|source| RunError::Dump { path, source })?;
    }
    for f in files {
        let path = f.target().to_path_buf();
        f.commit()
            .map_err(|source| RunError::Output { path, source })?;
    }
    Ok(())
}
