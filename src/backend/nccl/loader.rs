//! Our own NCCL loader: cudarc opens only `libnccl.so` (and panics when it
//! is missing), while pip's NCCL ships just `libnccl.so.2`. We open
//! `FOLDPRINT_NCCL_LIBRARY` (a file) alone when it is set, since a run told
//! to use one NCCL must never measure another; else `libnccl.so`, then
//! `libnccl.so.2`. We resolve the handful of entry points we use, so a
//! missing library is an error message rather than a panic.

use crate::gpu::error::GpuError;
use std::ffi::{c_char, c_int, c_void, CStr};

pub use crate::gpu::error::NcclError;

/// `ncclComm_t`: owned and used only through [`super::comm::Comm`].
pub type RawComm = *mut c_void;
pub type Stream = *mut c_void;
pub type NcclResult = c_int;

pub const NCCL_UINT32: c_int = 3;
pub const NCCL_FLOAT16: c_int = 6;
pub const NCCL_FLOAT32: c_int = 7;
/// Since NCCL 2.10.
pub const NCCL_BFLOAT16: c_int = 9;
/// `ncclInvalidArgument`.
pub const NCCL_INVALID_ARGUMENT: c_int = 4;
pub const NCCL_SUM: c_int = 0;
/// `ncclAvg` (since NCCL 2.10): the sum divided by W, NCCL's way.
pub const NCCL_AVG: c_int = 4;
pub const NCCL_IN_PROGRESS: c_int = 7;

/// `ncclUniqueId`: 128 opaque bytes.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct UniqueId {
    pub internal: [c_char; 128],
}

type Send = unsafe extern "C" fn(*const c_void, usize, c_int, c_int, RawComm, Stream) -> NcclResult;
type Recv = unsafe extern "C" fn(*mut c_void, usize, c_int, c_int, RawComm, Stream) -> NcclResult;
/// `ncclAllReduce` and `ncclReduceScatter` share one signature: send
/// buffer, receive buffer, count, datatype, reduction op, comm, stream.
type Collective = unsafe extern "C" fn(
    *const c_void,
    *mut c_void,
    usize,
    c_int,
    c_int,
    RawComm,
    Stream,
) -> NcclResult;

/// The loaded library: its entry points stay private to this module and
/// [`super::comm`], which wrap every call.
pub struct Nccl {
    _lib: libloading::Library,
    /// The name or path that opened.
    pub opened: String,
    get_version: unsafe extern "C" fn(*mut c_int) -> NcclResult,
    get_unique_id: unsafe extern "C" fn(*mut UniqueId) -> NcclResult,
    pub(super) comm_init_rank:
        unsafe extern "C" fn(*mut RawComm, c_int, UniqueId, c_int) -> NcclResult,
    pub(super) comm_destroy: unsafe extern "C" fn(RawComm) -> NcclResult,
    pub(super) comm_abort: unsafe extern "C" fn(RawComm) -> NcclResult,
    pub(super) comm_get_async_error: unsafe extern "C" fn(RawComm, *mut NcclResult) -> NcclResult,
    get_error_string: unsafe extern "C" fn(NcclResult) -> *const c_char,
    pub(super) send: Send,
    pub(super) recv: Recv,
    pub(super) all_reduce: Collective,
    pub(super) reduce_scatter: Collective,
    pub(super) group_start: unsafe extern "C" fn() -> NcclResult,
    pub(super) group_end: unsafe extern "C" fn() -> NcclResult,
    /// `ncclGetLastError` (NCCL >= 2.13): NCCL's own words on the last
    /// failure, often naming the peer.
    get_last_error: Option<unsafe extern "C" fn(RawComm) -> *const c_char>,
}

/// The names tried, in order: the library named, and nothing else.
pub fn candidates() -> Vec<String> {
    match std::env::var("FOLDPRINT_NCCL_LIBRARY") {
        Ok(p) => vec![p],
        Err(_) => vec!["libnccl.so".into(), "libnccl.so.2".into()],
    }
}

/// Which NCCL a run would load, and from where, as `doctor` shows it: the
/// same search as [`Nccl::load`], no GPU needed.
#[derive(Debug, Clone, serde::Serialize, PartialEq, Eq)]
pub struct NcclProbe {
    /// `FOLDPRINT_NCCL_LIBRARY`, when set.
    pub requested: Option<String>,
    /// Each name tried before the one that opened, with the loader's reason.
    pub failed: Vec<NotLoaded>,
    /// The name that opened (the search stops there, NCCL or not).
    pub opened: Option<String>,
    /// The file that name resolved to.
    pub path: Option<String>,
    /// `ncclGetVersion`, e.g. `2.21.5`.
    pub version: Option<String>,
    /// Why a run could not use it, when it could not.
    pub error: Option<String>,
}

/// A name the loader could not open.
#[derive(Debug, Clone, serde::Serialize, PartialEq, Eq)]
pub struct NotLoaded {
    pub name: String,
    /// The loader's words (dlerror).
    pub reason: String,
}

impl NcclProbe {
    pub fn usable(&self) -> bool {
        self.version.is_some()
    }
}

/// The file that holds `sym` in this process (`dladdr`).
fn file_of(sym: *const c_void) -> Option<String> {
    // SAFETY: Dl_info is plain data (pointers and integers); all zero is valid.
    let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
    // SAFETY: dladdr only reads the loader's tables and fills `info`.
    let found = unsafe { libc::dladdr(sym, &mut info) };
    if found == 0 || info.dli_fname.is_null() {
        return None;
    }
    // SAFETY: a NUL-terminated string the loader owns while the library is open.
    let name = unsafe { CStr::from_ptr(info.dli_fname) }.to_string_lossy();
    let p = std::path::Path::new(name.as_ref());
    Some(std::fs::canonicalize(p).map_or(name.to_string(), |c| c.display().to_string()))
}

/// The loader's own words (libloading's message is only "dlopen failed",
/// with dlerror's text as its source).
fn loader_text(e: &libloading::Error) -> String {
    std::error::Error::source(e).map_or_else(|| e.to_string(), |s| s.to_string())
}

/// Open NCCL the way a run does, and say what happened.
pub fn probe() -> NcclProbe {
    let mut p = NcclProbe {
        requested: std::env::var("FOLDPRINT_NCCL_LIBRARY").ok(),
        failed: Vec::new(),
        opened: None,
        path: None,
        version: None,
        error: None,
    };
    match Nccl::load_noting(&mut p.failed) {
        Ok(n) => {
            p.path = file_of(n.get_version as *const c_void);
            p.opened = Some(n.opened.clone());
            match n.version() {
                Ok((a, b, c)) => p.version = Some(format!("{a}.{b}.{c}")),
                Err(e) => p.error = Some(e.to_string()),
            }
        }
        Err(e) => {
            // Opened but not NCCL: the search stopped at that name.
            p.opened = candidates().get(p.failed.len()).cloned();
            p.path = p
                .opened
                .as_ref()
                .filter(|n| n.contains('/'))
                .and_then(|n| std::fs::canonicalize(n).ok())
                .map(|c| c.display().to_string());
            p.error = Some(e.to_string());
        }
    }
    p
}

impl Nccl {
    pub fn load() -> Result<Nccl, GpuError> {
        Self::load_noting(&mut Vec::new())
    }

    /// [`Nccl::load`], adding each name that did not open, with why, to `failed`.
    fn load_noting(failed: &mut Vec<NotLoaded>) -> Result<Nccl, GpuError> {
        for name in candidates() {
            // SAFETY: loading NCCL runs its (well-behaved) initializers.
            match unsafe { libloading::Library::new(&name) } {
                Ok(lib) => return Self::resolve(lib, name),
                Err(e) => failed.push(NotLoaded {
                    reason: loader_text(&e),
                    name,
                }),
            }
        }
        let errors: Vec<String> = failed
            .iter()
            .map(|f| format!("{}: {}", f.name, f.reason))
            .collect();
        if std::env::var_os("FOLDPRINT_NCCL_LIBRARY").is_some() {
            return Err(GpuError::missing(format!(
                "FOLDPRINT_NCCL_LIBRARY cannot be loaded ({}); no other NCCL is tried in its place: fix the path or unset it",
                errors.join("; ")
            )));
        }
        Err(GpuError::missing(format!(
            "NCCL library not found ({}); install NCCL, put its lib directory on LD_LIBRARY_PATH, or set FOLDPRINT_NCCL_LIBRARY=/path/to/libnccl.so.2",
            errors.join("; ")
        )))
    }

    fn resolve(lib: libloading::Library, opened: String) -> Result<Nccl, GpuError> {
        macro_rules! sym {
            ($name:literal) => {
                // SAFETY: the type matches NCCL's public C prototype.
                *unsafe { lib.get($name) }.map_err(|e| {
                    GpuError::missing(format!(
                        "{opened} lacks {}: {}",
                        String::from_utf8_lossy(&$name[..$name.len() - 1]),
                        loader_text(&e)
                    ))
                })?
            };
        }
        Ok(Nccl {
            get_version: sym!(b"ncclGetVersion\0"),
            get_unique_id: sym!(b"ncclGetUniqueId\0"),
            comm_init_rank: sym!(b"ncclCommInitRank\0"),
            comm_destroy: sym!(b"ncclCommDestroy\0"),
            comm_abort: sym!(b"ncclCommAbort\0"),
            comm_get_async_error: sym!(b"ncclCommGetAsyncError\0"),
            get_error_string: sym!(b"ncclGetErrorString\0"),
            send: sym!(b"ncclSend\0"),
            recv: sym!(b"ncclRecv\0"),
            all_reduce: sym!(b"ncclAllReduce\0"),
            reduce_scatter: sym!(b"ncclReduceScatter\0"),
            group_start: sym!(b"ncclGroupStart\0"),
            group_end: sym!(b"ncclGroupEnd\0"),
            // SAFETY: the type matches NCCL's public C prototype.
            get_last_error: unsafe { lib.get(b"ncclGetLastError\0") }.ok().map(|f| *f),
            _lib: lib,
            opened,
        })
    }

    /// `Ok`, or the code with the library's own words for it.
    pub fn check(&self, r: NcclResult, op: impl Into<String>) -> Result<(), NcclError> {
        if r == 0 {
            return Ok(());
        }
        Err(NcclError {
            op: op.into().into(),
            code: r,
            text: self.error_text(r),
            detail: None,
        })
    }

    /// `ncclGetErrorString` of `r`.
    pub fn error_text(&self, r: NcclResult) -> String {
        // SAFETY: NCCL returns a static string for any result code.
        unsafe {
            let p = (self.get_error_string)(r);
            if p.is_null() {
                String::new()
            } else {
                CStr::from_ptr(p).to_string_lossy().into_owned()
            }
        }
    }

    /// A fresh `ncclUniqueId` for a new communicator.
    pub fn unique_id(&self) -> Result<UniqueId, NcclError> {
        let mut id = UniqueId { internal: [0; 128] };
        // SAFETY: out-parameter of 128 bytes.
        let r = unsafe { (self.get_unique_id)(&mut id) };
        self.check(r, "ncclGetUniqueId")?;
        Ok(id)
    }

    /// NCCL's last error text for `comm`, when the library offers one.
    ///
    /// # Safety
    /// `comm` must be a communicator of this library, not yet destroyed.
    pub(super) unsafe fn last_error(&self, comm: RawComm) -> Option<String> {
        let f = self.get_last_error?;
        // SAFETY: NCCL returns a string it owns, valid until the next call.
        let text = unsafe {
            let p = f(comm);
            if p.is_null() {
                return None;
            }
            CStr::from_ptr(p).to_string_lossy().into_owned()
        };
        Some(text.trim().to_string()).filter(|t| !t.is_empty())
    }

    /// (major, minor, patch) from `ncclGetVersion`'s integer.
    pub fn version(&self) -> Result<(i32, i32, i32), NcclError> {
        let mut v = 0;
        // SAFETY: out-parameter.
        self.check(unsafe { (self.get_version)(&mut v) }, "ncclGetVersion")?;
        Ok(if v >= 10000 {
            (v / 10000, (v % 10000) / 100, v % 100)
        } else {
            (v / 1000, (v % 1000) / 100, v % 100)
        })
    }
}
