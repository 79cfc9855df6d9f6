//! Which library file a configuration asks for, the directory of
//! unversioned links that makes the child load it, and the check, from the
//! child's report, that the file actually mapped is the one requested.
//!
//! cudarc opens bare names: `libnvrtc.so` before any versioned name, and
//! `libnccl.so` only (never `libnccl.so.2`). A directory placed first on
//! `LD_LIBRARY_PATH` holding `libnvrtc.so` / `libnccl.so` links to the
//! requested files therefore decides what the loader finds; the report's
//! `environment.backend.libraries` (read from /proc/self/maps) says what it
//! really mapped.

pub use crate::environment::LoadedLibrary;
use serde::Serialize;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// A library family the matrix can pin.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Family {
    Nvrtc,
    Nccl,
}

impl Family {
    /// The `family` value of the report's `libraries` entries.
    pub const fn name(self) -> &'static str {
        match self {
            Family::Nvrtc => "nvrtc",
            Family::Nccl => "nccl",
        }
    }

    /// File names of this library start with this (and nothing else does:
    /// `libnvrtc-builtins` and `libnccl-net` do not).
    pub const fn prefix(self) -> &'static str {
        match self {
            Family::Nvrtc => "libnvrtc.so",
            Family::Nccl => "libnccl.so",
        }
    }

    /// The bare name cudarc opens.
    pub const fn link_name(self) -> &'static str {
        self.prefix()
    }

    /// Companion files loaded by the library itself, which must come from
    /// the requested library's directory.
    pub const fn companion(self) -> Option<(&'static str, &'static str)> {
        match self {
            // (report family, file-name prefix)
            Family::Nvrtc => Some(("nvrtc-builtins", "libnvrtc-builtins.so")),
            Family::Nccl => None,
        }
    }
}

/// One library a configuration asks for.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LibRequest {
    pub family: Family,
    /// As written in the matrix (after `${VAR}` expansion).
    pub written: String,
    /// The absolute path given (a file or a directory).
    pub given: PathBuf,
    /// The library file it names, every symlink resolved.
    pub file: PathBuf,
}

/// Resolve a requested path to one library file: a file (or a link to
/// one), or a directory holding `libnvrtc.so*` / `libnccl.so*` directly or
/// in `lib/` or `lib64/` (so a Nix store path works as well as a lib
/// directory). Several different files under one directory are ambiguous.
pub fn resolve(family: Family, path: &Path) -> Result<PathBuf, String> {
    let meta = std::fs::metadata(path).map_err(|e| {
        if e.kind() == std::io::ErrorKind::NotFound {
            format!("`{}` does not exist", path.display())
        } else {
            format!("`{}`: {e}", path.display())
        }
    })?;
    if meta.is_dir() {
        for sub in ["", "lib", "lib64"] {
            let dir = if sub.is_empty() {
                path.to_path_buf()
            } else {
                path.join(sub)
            };
            if !dir.is_dir() {
                continue;
            }
            let found = candidates(family, &dir)?;
            match found.len() {
                0 => continue,
                1 => return Ok(found.into_iter().next().unwrap_or_default()),
                _ => {
                    let list: Vec<String> = found.iter().map(|p| p.display().to_string()).collect();
                    return Err(format!(
                        "`{}` holds {} different {}* files ({}); name the one to load",
                        dir.display(),
                        found.len(),
                        family.prefix(),
                        list.join(", ")
                    ));
                }
            }
        }
        return Err(format!(
            "`{}` holds no {}* file (looked in it, lib/ and lib64/)",
            path.display(),
            family.prefix()
        ));
    }
    let real = std::fs::canonicalize(path).map_err(|e| format!("`{}`: {e}", path.display()))?;
    let name = real
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    if !name.starts_with(family.prefix()) {
        return Err(format!(
            "`{}` is `{}`, not a {}* file",
            path.display(),
            real.display(),
            family.prefix()
        ));
    }
    Ok(real)
}

/// Distinct real files behind the `prefix*` names of `dir`.
fn candidates(family: Family, dir: &Path) -> Result<BTreeSet<PathBuf>, String> {
    let entries = std::fs::read_dir(dir).map_err(|e| format!("`{}`: {e}", dir.display()))?;
    let mut found = BTreeSet::new();
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if !name.starts_with(family.prefix()) {
            continue;
        }
        // A dangling link names nothing the loader could open.
        if let Ok(real) = std::fs::canonicalize(entry.path()) {
            if real.is_file() {
                found.insert(real);
            }
        }
    }
    Ok(found)
}

/// Fill `dir` with the unversioned links for `requests`, plus links to the
/// companion files (NVRTC's builtins) found beside each requested file.
/// Returns the link names made.
pub fn make_link_dir(dir: &Path, requests: &[&LibRequest]) -> std::io::Result<Vec<String>> {
    std::fs::create_dir_all(dir)?;
    let mut made = Vec::new();
    for r in requests {
        let link = dir.join(r.family.link_name());
        std::os::unix::fs::symlink(&r.file, &link)?;
        made.push(r.family.link_name().to_string());
        let Some((_, prefix)) = r.family.companion() else {
            continue;
        };
        let mut dirs: Vec<PathBuf> = r.file.parent().map(Path::to_path_buf).into_iter().collect();
        if let Some(d) = if r.given.is_dir() {
            Some(r.given.clone())
        } else {
            r.given.parent().map(Path::to_path_buf)
        } {
            if !dirs.contains(&d) {
                dirs.push(d);
            }
        }
        for d in dirs {
            let Ok(entries) = std::fs::read_dir(&d) else {
                continue;
            };
            let mut names: Vec<(String, PathBuf)> = entries
                .flatten()
                .filter_map(|e| {
                    let name = e.file_name().to_string_lossy().into_owned();
                    let real = std::fs::canonicalize(e.path()).ok()?;
                    (name.starts_with(prefix) && real.is_file()).then_some((name, real))
                })
                .collect();
            names.sort();
            for (name, real) in names {
                let link = dir.join(&name);
                if link.symlink_metadata().is_err() {
                    std::os::unix::fs::symlink(&real, &link)?;
                    made.push(name);
                }
            }
        }
    }
    Ok(made)
}

/// What the audit concluded about one requested library.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LibraryCheck {
    pub family: Family,
    pub requested: String,
    /// The requested file, every link resolved.
    pub resolved: String,
    /// Real paths of the library files of this family the child mapped.
    pub loaded: Vec<String>,
    /// SHA-256 of the loaded file, from the report.
    pub sha256: Option<crate::digest::Sha256>,
    pub ok: bool,
    /// Why not, when not.
    pub message: Option<String>,
}

fn real(path: &str) -> PathBuf {
    std::fs::canonicalize(path).unwrap_or_else(|_| PathBuf::from(path))
}

fn file_name(p: &Path) -> String {
    p.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
}

/// Compare what the child mapped with what was requested (real paths).
pub fn check(req: &LibRequest, loaded: &[LoadedLibrary], backend: &str) -> LibraryCheck {
    let fam = req.family.name();
    let mine: Vec<(&LoadedLibrary, PathBuf)> = loaded
        .iter()
        .filter(|l| l.family == fam)
        .map(|l| (l, real(&l.path)))
        .filter(|(_, p)| file_name(p).starts_with(req.family.prefix()))
        .collect();
    let loaded_paths: Vec<String> = mine.iter().map(|(_, p)| p.display().to_string()).collect();
    let sha256 = mine
        .iter()
        .find(|(_, p)| *p == req.file)
        .and_then(|(l, _)| l.sha256);
    let mut message = None;
    if mine.is_empty() {
        message = Some(format!(
            "requested {fam} {} ({}), but the run loaded no {fam} (backend `{backend}`)",
            req.written,
            req.file.display()
        ));
    } else if mine.iter().any(|(_, p)| *p != req.file) {
        message = Some(format!(
            "requested {fam} {} ({}), loaded {}",
            req.written,
            req.file.display(),
            loaded_paths.join(", ")
        ));
    } else if let Some((cfam, _)) = req.family.companion() {
        let want_dir = req.file.parent().map(Path::to_path_buf);
        let strays: Vec<String> = loaded
            .iter()
            .filter(|l| l.family == cfam)
            .map(|l| real(&l.path))
            .filter(|p| p.parent().map(Path::to_path_buf) != want_dir)
            .map(|p| p.display().to_string())
            .collect();
        if !strays.is_empty() {
            message = Some(format!(
                "requested {fam} {} ({}), but its {cfam} came from elsewhere: {}",
                req.written,
                req.file.display(),
                strays.join(", ")
            ));
        }
    }
    LibraryCheck {
        family: req.family,
        requested: req.written.clone(),
        resolved: req.file.display().to_string(),
        loaded: loaded_paths,
        sha256,
        ok: message.is_none(),
        message,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn touch(p: &Path) {
        std::fs::write(p, b"not really a library").unwrap();
    }

    fn lib(family: &str, path: &Path) -> LoadedLibrary {
        LoadedLibrary {
            family: family.into(),
            path: path.display().to_string(),
            sha256: Some("ab".repeat(32).parse().unwrap()),
            bytes: Some(20),
        }
    }

    #[test]
    fn directories_resolve_through_links_and_lib_subdirs() {
        let t = tempfile::tempdir().unwrap();
        let d = t.path().join("store/lib");
        std::fs::create_dir_all(&d).unwrap();
        touch(&d.join("libnvrtc.so.12.4.127"));
        std::os::unix::fs::symlink("libnvrtc.so.12.4.127", d.join("libnvrtc.so.12")).unwrap();
        std::os::unix::fs::symlink("libnvrtc.so.12", d.join("libnvrtc.so")).unwrap();
        touch(&d.join("libnvrtc-builtins.so.12.4"));
        touch(&d.join("libnvrtc.alt.so.12"));
        let real = std::fs::canonicalize(d.join("libnvrtc.so.12.4.127")).unwrap();
        // The directory itself, its parent (Nix store layout), a link.
        assert_eq!(resolve(Family::Nvrtc, &d).unwrap(), real);
        assert_eq!(
            resolve(Family::Nvrtc, &t.path().join("store")).unwrap(),
            real
        );
        assert_eq!(
            resolve(Family::Nvrtc, &d.join("libnvrtc.so")).unwrap(),
            real
        );
        // Not a libnvrtc file; missing; nothing there; ambiguous.
        let e = resolve(Family::Nvrtc, &d.join("libnvrtc-builtins.so.12.4")).unwrap_err();
        assert!(e.contains("not a libnvrtc.so* file"), "{e}");
        let e = resolve(Family::Nvrtc, &d.join("libnvrtc.so.99")).unwrap_err();
        assert!(e.contains("does not exist"), "{e}");
        let e = resolve(Family::Nccl, &d).unwrap_err();
        assert!(e.contains("holds no libnccl.so*"), "{e}");
        touch(&d.join("libnvrtc.so.13"));
        let e = resolve(Family::Nvrtc, &d).unwrap_err();
        assert!(e.contains("2 different libnvrtc.so* files"), "{e}");
    }

    #[test]
    fn link_dir_holds_the_bare_name_and_the_builtins() {
        let t = tempfile::tempdir().unwrap();
        let d = t.path().join("nv");
        std::fs::create_dir_all(&d).unwrap();
        touch(&d.join("libnvrtc.so.12"));
        touch(&d.join("libnvrtc-builtins.so.12.4"));
        let file = resolve(Family::Nvrtc, &d).unwrap();
        let req = LibRequest {
            family: Family::Nvrtc,
            written: d.display().to_string(),
            given: d.clone(),
            file: file.clone(),
        };
        let links = t.path().join("links");
        let made = make_link_dir(&links, &[&req]).unwrap();
        assert_eq!(made, ["libnvrtc.so", "libnvrtc-builtins.so.12.4"]);
        assert_eq!(
            std::fs::canonicalize(links.join("libnvrtc.so")).unwrap(),
            file
        );
    }

    #[test]
    fn check_names_what_was_requested_and_what_was_loaded() {
        let t = tempfile::tempdir().unwrap();
        let (a, b) = (t.path().join("a"), t.path().join("b"));
        for d in [&a, &b] {
            std::fs::create_dir_all(d).unwrap();
            touch(&d.join("libnvrtc.so.12"));
            touch(&d.join("libnvrtc-builtins.so.12.4"));
        }
        let req = LibRequest {
            family: Family::Nvrtc,
            written: "a".into(),
            given: a.clone(),
            file: resolve(Family::Nvrtc, &a).unwrap(),
        };
        let good = [
            lib("cuda", Path::new("/usr/lib/libcuda.so.1")),
            lib("nvrtc", &a.join("libnvrtc.so.12")),
            lib("nvrtc-builtins", &a.join("libnvrtc-builtins.so.12.4")),
        ];
        let c = check(&req, &good, "cuda");
        assert!(c.ok, "{c:?}");
        assert!(c.sha256.is_some());

        let wrong = [lib("nvrtc", &b.join("libnvrtc.so.12"))];
        let c = check(&req, &wrong, "cuda");
        assert!(!c.ok);
        let m = c.message.unwrap();
        assert!(
            m.contains("requested nvrtc a")
                && m.contains("loaded")
                && m.contains("/b/libnvrtc.so.12"),
            "{m}"
        );

        let stray = [
            lib("nvrtc", &a.join("libnvrtc.so.12")),
            lib("nvrtc-builtins", &b.join("libnvrtc-builtins.so.12.4")),
        ];
        let c = check(&req, &stray, "cuda");
        assert!(!c.ok && c.message.unwrap().contains("came from elsewhere"));

        let c = check(&req, &[], "cpu");
        assert!(
            !c.ok
                && c.message
                    .unwrap()
                    .contains("loaded no nvrtc (backend `cpu`)")
        );
    }
}
