//! The host's NVIDIA driver libraries, found without the loader's help.
//!
//! A binary linked against Nix's glibc does not read the host's
//! `/etc/ld.so.cache`, so on Ubuntu, RHEL or a CI runner `dlopen("libcuda.so.1")`
//! finds nothing unless someone puts the driver's directory on
//! `LD_LIBRARY_PATH` — and putting, say, `/usr/lib/x86_64-linux-gnu` there
//! would let every other host library (libstdc++, libz, ...) shadow the
//! ones foldprint was built with.
//!
//! So, like the NVIDIA container toolkit (which mounts a fixed list of
//! driver libraries, of the driver's version, into a container) and unlike
//! putting a directory on the search path, foldprint looks for exactly the
//! driver's own files — `libcuda`, `libnvidia-ptxjitcompiler`,
//! `libnvidia-nvvm`, `libnvidia-gpucomp`, `libnvidia-ml`, the
//! confidential-computing `libnvidia-pkcs11*`, and WSL2's `libdxcore` — in
//! `/run/opengl-driver/lib` (NixOS), the host's loader cache and the usual
//! directories, prefers the libcuda of the running kernel module's version
//! (`/proc/driver/nvidia/version`; a stale one from an old install makes
//! `cuInit` fail with 803), keeps only files of libcuda's version, and opens
//! each one by its full path. Their sonames are then taken: when cudarc,
//! libcuda or NCCL later ask for `libcuda.so.1` or `libnvidia-ml.so.1` by
//! name, the dynamic loader hands back the library already loaded. Nothing
//! is added to `LD_LIBRARY_PATH`; no other host library is loaded (the
//! driver's libraries need only glibc, which is already there).
//!
//! This runs only when the loader cannot find libcuda by itself (the
//! caller's `LD_LIBRARY_PATH`, the wrapper's `/run/opengl-driver/lib`, or a
//! non-Nix glibc's own cache come first). `FOLDPRINT_DRIVER_ROOT` names the
//! root the driver is installed under (e.g. `/run/nvidia/driver` of a driver
//! container); when set, only that root is searched.

use serde::Serialize;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// One library of the driver: the name prefix of its files and sonames,
/// and who needs it.
#[derive(Debug, Clone, Copy)]
pub struct DriverLibrary {
    pub name: &'static str,
    pub prefix: &'static str,
    pub needed_for: &'static str,
}

/// Loaded in this order (dependencies of libcuda's helpers first, libcuda
/// last).
pub const DRIVER_LIBRARIES: [DriverLibrary; 8] = [
    DriverLibrary {
        name: "libnvidia-pkcs11",
        prefix: "libnvidia-pkcs11.so.",
        needed_for: "confidential-computing mode (H100/H200 CC), on drivers that ship it",
    },
    DriverLibrary {
        name: "libnvidia-pkcs11-openssl3",
        prefix: "libnvidia-pkcs11-openssl3.so.",
        needed_for: "confidential-computing mode with OpenSSL 3, on drivers that ship it",
    },
    DriverLibrary {
        name: "libdxcore",
        prefix: "libdxcore.so.",
        needed_for: "libcuda on WSL2 (the GPU paravirtualization layer)",
    },
    DriverLibrary {
        name: "libnvidia-gpucomp",
        prefix: "libnvidia-gpucomp.so.",
        needed_for: "the driver's compilers, on drivers that ship it (560 and later)",
    },
    DriverLibrary {
        name: "libnvidia-nvvm",
        prefix: "libnvidia-nvvm.so.",
        needed_for: "libcuda's NVVM compiler",
    },
    DriverLibrary {
        name: "libnvidia-ptxjitcompiler",
        prefix: "libnvidia-ptxjitcompiler.so.",
        needed_for: "libcuda's PTX JIT (PTX kernels, newer GPUs than the NVRTC)",
    },
    DriverLibrary {
        name: "libnvidia-ml",
        prefix: "libnvidia-ml.so.",
        needed_for: "NCCL (NVML)",
    },
    DriverLibrary {
        name: "libcuda",
        prefix: "libcuda.so.",
        needed_for: "every CUDA backend",
    },
];

/// Where the driver's libraries are looked for, in order.
#[derive(Debug, Clone)]
pub struct SearchPlan {
    /// The root everything below is relative to (`/` normally).
    pub root: PathBuf,
    /// Directories searched before the cache (NixOS's driver link).
    pub first_dirs: Vec<PathBuf>,
    /// The loader cache to read (ld.so.cache format).
    pub cache: PathBuf,
    /// Directories searched after the cache.
    pub dirs: Vec<PathBuf>,
    /// The running kernel module's version file: a libcuda of that version
    /// is preferred over one found earlier (a stale libcuda from an old
    /// install otherwise makes `cuInit` fail with error 803).
    pub module_version_file: PathBuf,
}

/// Debian's multiarch directory for this machine.
fn multiarch() -> &'static str {
    if cfg!(target_arch = "aarch64") {
        "aarch64-linux-gnu"
    } else {
        "x86_64-linux-gnu"
    }
}

impl SearchPlan {
    /// The usual places under `root`.
    pub fn under(root: &Path) -> Self {
        let j = |p: &str| root.join(p.trim_start_matches('/'));
        SearchPlan {
            root: root.to_path_buf(),
            first_dirs: vec![j("/run/opengl-driver/lib")],
            cache: j("/etc/ld.so.cache"),
            dirs: vec![
                j(&format!("/usr/lib/{}", multiarch())),
                j(&format!("/lib/{}", multiarch())),
                j("/usr/lib64"),
                j("/lib64"),
                j("/usr/lib"),
                j("/usr/local/nvidia/lib64"),
                j("/usr/local/nvidia/lib"),
                j("/usr/lib/wsl/lib"),
            ],
            module_version_file: j("/proc/driver/nvidia/version"),
        }
    }

    /// From `FOLDPRINT_DRIVER_ROOT` (default `/`); the flag says whether it
    /// was set (then only that root is searched, not the loader's path).
    pub fn from_env() -> (Self, bool) {
        match std::env::var_os("FOLDPRINT_DRIVER_ROOT") {
            Some(r) if !r.is_empty() => (SearchPlan::under(Path::new(&r)), true),
            _ => (SearchPlan::under(Path::new("/")), false),
        }
    }

    /// The places, for messages.
    pub fn describe(&self) -> Vec<String> {
        self.first_dirs
            .iter()
            .chain(std::iter::once(&self.cache))
            .chain(self.dirs.iter())
            .map(|p| p.display().to_string())
            .collect()
    }
}

/// One library file that was found.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct FoundLibrary {
    pub name: &'static str,
    /// The file, symlinks resolved.
    pub path: String,
    /// Where it was found: a directory, or `loader cache <file>`.
    pub source: String,
    /// The driver version its file name carries (`580.95.05`), if any.
    pub version: Option<String>,
}

/// What a search found.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct DriverSearch {
    pub searched: Vec<String>,
    pub found: Vec<FoundLibrary>,
    /// Libraries not found (or only in another driver version), with why.
    pub missing: Vec<MissingLibrary>,
    /// libcuda's driver version, when its file name carries one.
    pub driver_version: Option<String>,
    /// Files of another driver version, left alone.
    pub ignored: Vec<String>,
    /// The running kernel module's version, when the module is loaded.
    pub kernel_module: Option<String>,
    /// libcuda is WSL2's (`/usr/lib/wsl/lib`), which needs `libdxcore`.
    pub wsl: bool,
}

#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct MissingLibrary {
    pub name: &'static str,
    pub needed_for: &'static str,
    pub reason: String,
}

/// `libcuda.so.580.95.05` -> `580.95.05`; `libcuda.so.1` (a soname, or
/// WSL's `libcuda.so.1.1`) -> None.
fn version_of(file_name: &str, prefix: &str) -> Option<String> {
    let rest = file_name.strip_prefix(prefix)?;
    let parts: Vec<&str> = rest.split('.').collect();
    let numeric = parts
        .iter()
        .all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()));
    // Driver releases are MAJOR.MINOR[.PATCH] with a three-digit major.
    (numeric && parts.len() >= 2 && parts[0].len() >= 3).then(|| rest.to_string())
}

/// Whether `path` is an ELF shared object for this machine (64-bit, little
/// endian, this architecture): the 32-bit driver libraries of a multilib
/// host live in directories that can also be searched.
pub fn is_native_elf(path: &Path) -> bool {
    use std::io::Read as _;
    let mut h = [0u8; 20];
    let Ok(mut f) = std::fs::File::open(path) else {
        return false;
    };
    if f.read_exact(&mut h).is_err() {
        return false;
    }
    let machine = u16::from_le_bytes([h[18], h[19]]);
    let want: u16 = if cfg!(target_arch = "aarch64") {
        183
    } else {
        62
    };
    h[..4] == *b"\x7fELF" && h[4] == 2 && h[5] == 1 && machine == want
}

/// Candidate files of `lib` in `dir`: names starting with its prefix (or
/// the bare `.so`), resolved, native ELF, deduplicated.
fn candidates_in_dir(dir: &Path, lib: &DriverLibrary) -> Vec<PathBuf> {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let bare = lib.prefix.trim_end_matches('.');
    let mut names: Vec<String> = rd
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with(lib.prefix) || n == bare)
        .collect();
    names.sort();
    let mut out: Vec<PathBuf> = Vec::new();
    for n in names {
        if let Ok(real) = std::fs::canonicalize(dir.join(&n)) {
            if is_native_elf(&real) && !out.contains(&real) {
                out.push(real);
            }
        }
    }
    out
}

fn file_version(path: &Path, lib: &DriverLibrary) -> Option<String> {
    path.file_name()
        .and_then(|n| n.to_str())
        .and_then(|n| version_of(n, lib.prefix))
}

/// A file found, with the place it was found in.
type Candidate = (String, PathBuf);

/// Search for every driver library along `plan`.
pub fn search(plan: &SearchPlan) -> DriverSearch {
    // (source label, candidate files) per place, in search order.
    let cache_entries = match std::fs::read(&plan.cache) {
        Ok(bytes) => ld_cache::parse(&bytes).unwrap_or_default(),
        Err(_) => Vec::new(),
    };
    let cache_label = format!("loader cache {}", plan.cache.display());
    let find_all = |lib: &DriverLibrary| -> Vec<Candidate> {
        let mut all = Vec::new();
        for d in &plan.first_dirs {
            for f in candidates_in_dir(d, lib) {
                all.push((d.display().to_string(), f));
            }
        }
        for e in &cache_entries {
            if e.soname.starts_with(lib.prefix) && e.native {
                // Paths in a cache are relative to the root it belongs to.
                let p = plan.root.join(e.path.trim_start_matches('/'));
                if let Ok(real) = std::fs::canonicalize(&p) {
                    if is_native_elf(&real) {
                        all.push((cache_label.clone(), real));
                    }
                }
            }
        }
        for d in &plan.dirs {
            for f in candidates_in_dir(d, lib) {
                all.push((d.display().to_string(), f));
            }
        }
        all
    };

    let kernel_module = std::fs::read_to_string(&plan.module_version_file)
        .ok()
        .and_then(|t| crate::host::kernel_module_version(&t));
    let mut result = DriverSearch {
        searched: plan.describe(),
        found: Vec::new(),
        missing: Vec::new(),
        driver_version: None,
        ignored: Vec::new(),
        kernel_module: kernel_module.clone(),
        wsl: false,
    };
    let cuda = DRIVER_LIBRARIES[DRIVER_LIBRARIES.len() - 1];
    let mut cuda_found = find_all(&cuda);
    // The module decides which user-space driver can work, as the container
    // toolkit and nixGL key on it: its version's libcuda first, wherever found.
    if let Some(k) = &kernel_module {
        cuda_found.sort_by_key(|(_, p)| file_version(p, &cuda).as_deref() != Some(k.as_str()));
    }
    let Some((cuda_source, cuda_path)) = cuda_found.first().cloned() else {
        for lib in DRIVER_LIBRARIES {
            result.missing.push(MissingLibrary {
                name: lib.name,
                needed_for: lib.needed_for,
                reason: if lib.name == cuda.name {
                    "not found".into()
                } else {
                    "not looked for without libcuda".into()
                },
            });
        }
        return result;
    };
    let version = file_version(&cuda_path, &cuda);
    let cuda_dir = cuda_path.parent().map(Path::to_path_buf);
    result.driver_version = version.clone();
    result.wsl = cuda_dir.as_deref().is_some_and(|d| d.ends_with("wsl/lib"));
    for lib in DRIVER_LIBRARIES {
        let all = if lib.name == cuda.name {
            cuda_found.clone()
        } else {
            find_all(&lib)
        };
        // Same driver version as libcuda (no version in a name, as on WSL:
        // libcuda's own directory only); libcuda's directory preferred.
        let same_dir = |p: &Path| p.parent().map(Path::to_path_buf) == cuda_dir;
        let (good, other): (Vec<&Candidate>, Vec<&Candidate>) =
            all.iter()
                .partition(|(_, p)| match (&version, file_version(p, &lib)) {
                    (Some(v), Some(w)) => *v == w,
                    _ => same_dir(p),
                });
        for (_, p) in other {
            let s = p.display().to_string();
            if !result.ignored.contains(&s) {
                result.ignored.push(s);
            }
        }
        let chosen = good
            .iter()
            .find(|(_, p)| same_dir(p))
            .or_else(|| good.first())
            .copied();
        match chosen {
            Some((source, path)) => result.found.push(FoundLibrary {
                name: lib.name,
                path: path.display().to_string(),
                source: if lib.name == cuda.name {
                    cuda_source.clone()
                } else {
                    source.clone()
                },
                version: file_version(path, &lib),
            }),
            None => result.missing.push(MissingLibrary {
                name: lib.name,
                needed_for: lib.needed_for,
                reason: if lib.name == "libdxcore" && result.wsl {
                    format!(
                        "not found beside WSL2's libcuda in {}: cuInit will fail; \
                         the Windows NVIDIA driver provides it (is the WSL GPU support installed?)",
                        cuda_dir
                            .as_deref()
                            .map_or("?".into(), |d| d.display().to_string())
                    )
                } else if all.is_empty() {
                    "not found".into()
                } else {
                    format!(
                        "only of another driver version than libcuda's {}",
                        version.as_deref().unwrap_or("?")
                    )
                },
            }),
        }
    }
    result
}

/// How this process got (or did not get) the driver.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct HostDriver {
    /// `loader`: the dynamic loader found libcuda by itself
    /// (LD_LIBRARY_PATH, /run/opengl-driver/lib through the wrapper, or a
    /// non-Nix glibc's cache); `found`: foldprint found and loaded the
    /// driver's files by path; `missing`: no libcuda anywhere.
    pub how: &'static str,
    pub driver_root: String,
    /// The search, when one ran.
    pub search: Option<DriverSearch>,
    /// Files opened by path, and any that failed to open.
    pub loaded: Vec<String>,
    pub load_errors: Vec<String>,
}

static STATE: OnceLock<HostDriver> = OnceLock::new();

/// Make libcuda loadable by name, once per process: first the loader's own
/// search; failing that, the driver's files found by `search`, opened by
/// path (helpers first). Never panics; the outcome is kept for `doctor` and
/// reports.
pub fn ensure_loaded() -> &'static HostDriver {
    STATE.get_or_init(|| {
        let (plan, rooted) = SearchPlan::from_env();
        let root = plan.root.display().to_string();
        if !rooted {
            // SAFETY: the vendor's driver library, by the name cudarc opens.
            if let Ok(lib) = unsafe { libloading::Library::new("libcuda.so.1") } {
                std::mem::forget(lib);
                return HostDriver {
                    how: "loader",
                    driver_root: root,
                    search: None,
                    loaded: Vec::new(),
                    load_errors: Vec::new(),
                };
            }
        }
        let found = search(&plan);
        let mut loaded = Vec::new();
        let mut load_errors = Vec::new();
        let has_cuda = found.found.iter().any(|f| f.name == "libcuda");
        if has_cuda {
            for lib in DRIVER_LIBRARIES {
                let Some(f) = found.found.iter().find(|f| f.name == lib.name) else {
                    continue;
                };
                // SAFETY: a driver library of the installed driver's
                // version, as the container toolkit would mount it.
                match unsafe { libloading::Library::new(&f.path) } {
                    Ok(l) => {
                        std::mem::forget(l);
                        loaded.push(f.path.clone());
                    }
                    Err(e) => {
                        let detail = std::error::Error::source(&e)
                            .map(|s| s.to_string())
                            .unwrap_or_else(|| e.to_string());
                        load_errors.push(format!("{}: {detail}", f.path));
                    }
                }
            }
        }
        HostDriver {
            how: if has_cuda { "found" } else { "missing" },
            driver_root: root,
            search: Some(found),
            loaded,
            load_errors,
        }
    })
}

/// Why `cuInit` is likely to fail with the driver this search chose, for
/// the probe's error line: a libcuda that is not the running kernel
/// module's version (error 803), or WSL2's libcuda without `libdxcore`.
pub fn failure_hint(search: &DriverSearch) -> Option<String> {
    if search.wsl {
        if let Some(m) = search.missing.iter().find(|m| m.name == "libdxcore") {
            return Some(format!("libdxcore {}", m.reason));
        }
    }
    match (&search.driver_version, &search.kernel_module) {
        (Some(v), Some(k)) if v != k => Some(format!(
            "libcuda {v} is not the running kernel module's version {k}: \
             install the user-space driver of {k}, or reboot into the module of {v}"
        )),
        _ => None,
    }
}

/// Directories on `LD_LIBRARY_PATH` that hold a C library other than the
/// one beside this process's dynamic loader. A program built by Nix runs
/// under Nix's loader; a host glibc found first on that path is loaded
/// under it, which breaks in ways that depend on the two versions.
pub fn foreign_libc_dirs() -> Vec<String> {
    let Some(path) = std::env::var_os("LD_LIBRARY_PATH") else {
        return Vec::new();
    };
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap_or_default();
    let Some(loader) = maps
        .lines()
        .filter_map(|l| l.splitn(6, ' ').nth(5).map(str::trim_start))
        .find(|p| {
            let name = p.rsplit('/').next().unwrap_or("");
            p.starts_with('/') && (name.starts_with("ld-linux") || name.starts_with("ld64.so"))
        })
    else {
        return Vec::new();
    };
    let own_libc = Path::new(loader).with_file_name("libc.so.6");
    foreign_libc_dirs_in(&path, &own_libc)
}

/// `foreign_libc_dirs` for a given search path and the loader's own libc.
pub fn foreign_libc_dirs_in(search_path: &std::ffi::OsStr, own_libc: &Path) -> Vec<String> {
    use std::os::unix::fs::MetadataExt as _;
    let id = |p: &Path| std::fs::metadata(p).ok().map(|m| (m.dev(), m.ino()));
    let own = id(own_libc);
    std::env::split_paths(search_path)
        .filter(|d| !d.as_os_str().is_empty())
        .filter(|d| match id(&d.join("libc.so.6")) {
            Some(theirs) => Some(theirs) != own,
            None => false,
        })
        .map(|d| d.display().to_string())
        .collect()
}

/// The outcome, if this process looked for the driver at all.
pub fn state() -> Option<&'static HostDriver> {
    STATE.get()
}

/// Reading the loader cache (`/etc/ld.so.cache`), as glibc 2.32+ writes it
/// (`glibc-ld.so.cache1.1`, alone or after the old `ld.so-1.7.0` table).
pub mod ld_cache {
    /// One entry: a soname and the file it maps to.
    #[derive(Debug, Clone, PartialEq, Eq)]
    pub struct Entry {
        pub soname: String,
        pub path: String,
        pub flags: i32,
        /// Built for this machine (64-bit of this architecture).
        pub native: bool,
    }

    const OLD_MAGIC: &[u8] = b"ld.so-1.7.0";
    const NEW_MAGIC: &[u8] = b"glibc-ld.so.cache1.1";
    // glibc's ldconfig.h: type bits, and the architecture bits this
    // machine's libraries carry.
    const FLAG_ELF_LIBC6: i32 = 0x0003;
    const FLAG_REQUIRED_MASK: i32 = 0xff00;
    const FLAG_NATIVE: i32 = if cfg!(target_arch = "aarch64") {
        0x0a00
    } else {
        0x0300
    };

    fn u32_at(b: &[u8], at: usize) -> Option<u32> {
        b.get(at..at + 4)
            .map(|s| u32::from_le_bytes([s[0], s[1], s[2], s[3]]))
    }

    fn cstr_at(b: &[u8], at: usize) -> Option<String> {
        let s = b.get(at..)?;
        let end = s.iter().position(|&c| c == 0)?;
        String::from_utf8(s[..end].to_vec()).ok()
    }

    /// The entries of a cache file; `None` if it is in neither format.
    pub fn parse(bytes: &[u8]) -> Option<Vec<Entry>> {
        let start = if bytes.starts_with(NEW_MAGIC) {
            0
        } else if bytes.starts_with(OLD_MAGIC) {
            // Old header (magic, nlibs) and 12-byte entries, then the new
            // table at the next 8-byte boundary.
            let n = u32_at(bytes, 12)? as usize;
            let end = 16 + n * 12;
            let aligned = (end + 7) & !7;
            if !bytes.get(aligned..)?.starts_with(NEW_MAGIC) {
                return None;
            }
            aligned
        } else {
            return None;
        };
        let new = &bytes[start..];
        let nlibs = u32_at(new, 20)? as usize;
        // Header: magic+version (20), nlibs, len_strings, flags+pad (4),
        // extension offset, 3 unused words = 48 bytes; entries of 24 bytes.
        let mut out = Vec::with_capacity(nlibs);
        for i in 0..nlibs {
            let e = 48 + i * 24;
            let flags = u32_at(new, e)? as i32;
            let key = u32_at(new, e + 4)? as usize;
            let value = u32_at(new, e + 8)? as usize;
            // String offsets count from the start of the new table.
            let soname = cstr_at(new, key)?;
            let path = cstr_at(new, value)?;
            let native =
                (flags & 0x00ff) == FLAG_ELF_LIBC6 && (flags & FLAG_REQUIRED_MASK) == FLAG_NATIVE;
            out.push(Entry {
                soname,
                path,
                flags,
                native,
            });
        }
        Some(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn elf(machine: u16, class: u8) -> Vec<u8> {
        let mut h = vec![0u8; 64];
        h[..4].copy_from_slice(b"\x7fELF");
        h[4] = class;
        h[5] = 1;
        h[18..20].copy_from_slice(&machine.to_le_bytes());
        h
    }

    fn native() -> Vec<u8> {
        elf(
            if cfg!(target_arch = "aarch64") {
                183
            } else {
                62
            },
            2,
        )
    }

    fn put(dir: &Path, name: &str, bytes: &[u8]) {
        std::fs::create_dir_all(dir).unwrap();
        std::fs::write(dir.join(name), bytes).unwrap();
    }

    fn link(dir: &Path, name: &str, target: &str) {
        std::os::unix::fs::symlink(target, dir.join(name)).unwrap();
    }

    #[test]
    fn versions_come_from_real_file_names_only() {
        assert_eq!(
            version_of("libcuda.so.580.95.05", "libcuda.so."),
            Some("580.95.05".into())
        );
        assert_eq!(
            version_of("libnvidia-ml.so.570.86", "libnvidia-ml.so."),
            Some("570.86".into())
        );
        assert_eq!(version_of("libcuda.so.1", "libcuda.so."), None);
        assert_eq!(version_of("libcuda.so.1.1", "libcuda.so."), None);
        assert_eq!(
            version_of("libnvidia-nvvm.so.4", "libnvidia-nvvm.so."),
            None
        );
    }

    #[test]
    fn finds_only_the_drivers_files_of_libcudas_version() {
        let root = tempfile::tempdir().unwrap();
        let lib = root.path().join(format!("usr/lib/{}", multiarch()));
        let v = "580.95.05";
        for n in [
            "libcuda.so",
            "libnvidia-ptxjitcompiler.so",
            "libnvidia-nvvm.so",
            "libnvidia-ml.so",
        ] {
            put(&lib, &format!("{n}.{v}"), &native());
        }
        put(&lib, &format!("libnvidia-gpucomp.so.{v}"), &native());
        link(&lib, "libcuda.so.1", &format!("libcuda.so.{v}"));
        link(&lib, "libcuda.so", "libcuda.so.1");
        // Host userspace next to the driver: never picked.
        put(&lib, "libstdc++.so.6.0.30", &native());
        put(&lib, "libGLX_nvidia.so.580.95.05", &native());
        // A leftover of another driver, and a 32-bit libcuda.
        put(&lib, "libnvidia-ml.so.550.54.14", &native());
        put(
            &root.path().join("usr/lib/i386-linux-gnu"),
            "libcuda.so.580.95.05",
            &elf(3, 1),
        );
        put(&root.path().join("usr/lib"), "libcuda.so.1", &elf(3, 1));

        let s = search(&SearchPlan::under(root.path()));
        assert_eq!(s.driver_version.as_deref(), Some(v));
        // Only the optional ones this driver tree does not ship are missing.
        let missing: Vec<&str> = s.missing.iter().map(|m| m.name).collect();
        assert_eq!(
            missing,
            ["libnvidia-pkcs11", "libnvidia-pkcs11-openssl3", "libdxcore"],
            "{:?}",
            s.missing
        );
        assert!(!s.wsl);
        let names: Vec<&str> = s.found.iter().map(|f| f.name).collect();
        assert_eq!(
            names,
            [
                "libnvidia-gpucomp",
                "libnvidia-nvvm",
                "libnvidia-ptxjitcompiler",
                "libnvidia-ml",
                "libcuda"
            ]
        );
        for f in &s.found {
            assert!(f.path.ends_with(&format!(".so.{v}")), "{f:?}");
            assert_eq!(f.version.as_deref(), Some(v));
        }
        assert!(s
            .ignored
            .iter()
            .any(|p| p.ends_with("libnvidia-ml.so.550.54.14")));
        let all = format!("{s:?}");
        assert!(!all.contains("libstdc++") && !all.contains("GLX"), "{all}");
        assert!(!all.contains("i386"), "{all}");
    }

    #[test]
    fn nixos_driver_link_comes_first_and_missing_ones_are_named() {
        let root = tempfile::tempdir().unwrap();
        let nix = root.path().join("run/opengl-driver/lib");
        put(&nix, "libcuda.so.570.86.15", &native());
        let usr = root.path().join(format!("usr/lib/{}", multiarch()));
        put(&usr, "libcuda.so.580.95.05", &native());
        put(&usr, "libnvidia-ml.so.580.95.05", &native());
        let s = search(&SearchPlan::under(root.path()));
        assert_eq!(s.driver_version.as_deref(), Some("570.86.15"));
        let cuda = s.found.iter().find(|f| f.name == "libcuda").unwrap();
        assert!(cuda.path.contains("run/opengl-driver"), "{cuda:?}");
        // The other driver's libnvidia-ml is not mixed in.
        let ml = s.missing.iter().find(|m| m.name == "libnvidia-ml").unwrap();
        assert!(ml.reason.contains("another driver version"), "{ml:?}");
        assert_eq!(ml.needed_for, "NCCL (NVML)");
        assert!(s
            .missing
            .iter()
            .any(|m| m.name == "libnvidia-ptxjitcompiler"));
    }

    #[test]
    fn nothing_found_says_so_for_every_library() {
        let root = tempfile::tempdir().unwrap();
        let s = search(&SearchPlan::under(root.path()));
        assert!(s.found.is_empty());
        assert_eq!(s.missing.len(), DRIVER_LIBRARIES.len());
        assert!(s.searched.iter().any(|p| p.ends_with("etc/ld.so.cache")));
    }

    /// The parser against glibc's own reader: every native entry
    /// `ldconfig -p` prints for this machine's cache, and no other.
    #[test]
    fn cache_parser_agrees_with_ldconfig() {
        let bytes = std::fs::read("/etc/ld.so.cache").expect("this test needs /etc/ld.so.cache");
        let entries = ld_cache::parse(&bytes).expect("cache in a known format");
        let ldconfig = ["/sbin/ldconfig", "/usr/sbin/ldconfig"]
            .into_iter()
            .find(|p| Path::new(p).exists())
            .expect("this test needs ldconfig");
        let out = std::process::Command::new(ldconfig)
            .arg("-p")
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        let tag = if cfg!(target_arch = "aarch64") {
            "(libc6,AArch64)"
        } else {
            "(libc6,x86-64)"
        };
        let mut want: Vec<(String, String)> = text
            .lines()
            .filter(|l| l.contains(tag))
            .filter_map(|l| {
                let (left, path) = l.trim().split_once(" => ")?;
                let soname = left.split_whitespace().next()?;
                Some((soname.to_string(), path.to_string()))
            })
            .collect();
        let mut got: Vec<(String, String)> = entries
            .iter()
            .filter(|e| e.native && e.flags & 0x00ff == 0x0003)
            .map(|e| (e.soname.clone(), e.path.clone()))
            .collect();
        want.sort();
        got.sort();
        assert!(want.len() > 10, "ldconfig -p listed too little: {text}");
        assert_eq!(got, want);
        // Negative control: a damaged header is refused, not misread.
        let mut bad = bytes.clone();
        bad[0] ^= 0xff;
        assert!(ld_cache::parse(&bad).is_none());
    }
}
