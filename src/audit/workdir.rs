//! The audit's work directory: one subdirectory per child run, under
//! `--keep DIR` (which must be new or empty) or under a fresh temporary
//! directory removed when the audit ends.

use super::AuditError;
use std::path::{Path, PathBuf};

/// Where the children's link directories and outputs live.
pub(super) struct WorkArea {
    pub root: PathBuf,
    /// Removed when dropped (no `--keep`).
    pub temporary: bool,
}

impl WorkArea {
    pub fn new(keep: Option<&Path>) -> Result<WorkArea, AuditError> {
        if let Some(dir) = keep {
            if let Ok(mut entries) = std::fs::read_dir(dir) {
                if entries.next().is_some() {
                    return Err(AuditError::Keep {
                        path: dir.to_path_buf(),
                        message: "must be a new or empty directory".into(),
                    });
                }
            } else if dir.exists() {
                return Err(AuditError::Keep {
                    path: dir.to_path_buf(),
                    message: "exists and is not a readable directory".into(),
                });
            }
            std::fs::create_dir_all(dir).map_err(|e| AuditError::Keep {
                path: dir.to_path_buf(),
                message: format!("cannot create: {e}"),
            })?;
            let root = std::path::absolute(dir).unwrap_or_else(|_| dir.to_path_buf());
            return Ok(WorkArea {
                root,
                temporary: false,
            });
        }
        let base = std::env::temp_dir();
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        let mut last = None;
        for attempt in 0..100u32 {
            let root = base.join(format!(
                "foldprint-audit-{}-{nanos:x}-{attempt}",
                std::process::id()
            ));
            match std::fs::create_dir(&root) {
                Ok(()) => {
                    // A second signal ends the process at once: remove it then too.
                    crate::interrupt::register_staging(&root);
                    return Ok(WorkArea {
                        root,
                        temporary: true,
                    });
                }
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => last = Some(e),
                Err(source) => return Err(AuditError::WorkDir { path: root, source }),
            }
        }
        Err(AuditError::WorkDir {
            path: base,
            source: last.unwrap_or_else(|| std::io::Error::other("no free name")),
        })
    }
}

impl Drop for WorkArea {
    fn drop(&mut self) {
        if self.temporary {
            let _ = std::fs::remove_dir_all(&self.root);
            crate::interrupt::unregister_staging(&self.root);
        }
    }
}
