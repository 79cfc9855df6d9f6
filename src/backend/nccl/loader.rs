//! Our own NCCL loader: cudarc opens only `libnccl.so` (and panics when it
//! is missing), while pip's NCCL ships just `libnccl.so.2`. We open, in
//! order, `FOLDPRINT_NCCL_LIBRARY` (a file), `libnccl.so`, `libnccl.so.2`,
//! and resolve the handful of entry points we use, so a missing library is
//! an error message rather than a panic.

use std::ffi::{c_char, c_int, c_void, CStr};

pub type Comm = *mut c_void;
pub type Stream = *mut c_void;
pub type NcclResult = c_int;

pub const NCCL_UINT8: c_int = 1;
pub const NCCL_FLOAT32: c_int = 7;
pub const NCCL_SUM: c_int = 0;
pub const NCCL_IN_PROGRESS: c_int = 7;

/// `ncclUniqueId`: 128 opaque bytes.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct UniqueId {
    pub internal: [c_char; 128],
}

type Send = unsafe extern "C" fn(*const c_void, usize, c_int, c_int, Comm, Stream) -> NcclResult;
type Recv = unsafe extern "C" fn(*mut c_void, usize, c_int, c_int, Comm, Stream) -> NcclResult;

pub struct Nccl {
    _lib: libloading::Library,
    /// The name or path that opened.
    pub opened: String,
    pub get_version: unsafe extern "C" fn(*mut c_int) -> NcclResult,
    pub get_unique_id: unsafe extern "C" fn(*mut UniqueId) -> NcclResult,
    pub comm_init_rank: unsafe extern "C" fn(*mut Comm, c_int, UniqueId, c_int) -> NcclResult,
    pub comm_destroy: unsafe extern "C" fn(Comm) -> NcclResult,
    pub comm_abort: unsafe extern "C" fn(Comm) -> NcclResult,
    pub comm_get_async_error: unsafe extern "C" fn(Comm, *mut NcclResult) -> NcclResult,
    pub get_error_string: unsafe extern "C" fn(NcclResult) -> *const c_char,
    pub send: Send,
    pub recv: Recv,
    pub all_reduce: unsafe extern "C" fn(
        *const c_void,
        *mut c_void,
        usize,
        c_int,
        c_int,
        Comm,
        Stream,
    ) -> NcclResult,
    pub group_start: unsafe extern "C" fn() -> NcclResult,
    pub group_end: unsafe extern "C" fn() -> NcclResult,
    /// `ncclGetLastError` (NCCL >= 2.13): NCCL's own words on the last
    /// failure, often naming the peer.
    pub get_last_error: Option<unsafe extern "C" fn(Comm) -> *const c_char>,
}

/// The names tried, in order.
pub fn candidates() -> Vec<String> {
    let mut c = Vec::new();
    if let Ok(p) = std::env::var("FOLDPRINT_NCCL_LIBRARY") {
        c.push(p);
    }
    c.push("libnccl.so".into());
    c.push("libnccl.so.2".into());
    c
}

impl Nccl {
    pub fn load() -> Result<Nccl, String> {
        let mut errors = Vec::new();
        for name in candidates() {
            // SAFETY: loading NCCL runs its (well-behaved) initializers.
            match unsafe { libloading::Library::new(&name) } {
                Ok(lib) => return Self::resolve(lib, name),
                Err(e) => errors.push(format!("{name}: {e}")),
            }
        }
        Err(format!(
            "NCCL library not found ({}); install NCCL, put its lib directory on LD_LIBRARY_PATH, or set FOLDPRINT_NCCL_LIBRARY=/path/to/libnccl.so.2",
            errors.join("; ")
        ))
    }

    fn resolve(lib: libloading::Library, opened: String) -> Result<Nccl, String> {
        macro_rules! sym {
            ($name:literal) => {
                // SAFETY: the type matches NCCL's public C prototype.
                *unsafe { lib.get($name) }.map_err(|e| {
                    format!(
                        "{opened} lacks {}: {e}",
                        String::from_utf8_lossy(&$name[..$name.len() - 1])
                    )
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
            group_start: sym!(b"ncclGroupStart\0"),
            group_end: sym!(b"ncclGroupEnd\0"),
            // SAFETY: the type matches NCCL's public C prototype.
            get_last_error: unsafe { lib.get(b"ncclGetLastError\0") }.ok().map(|f| *f),
            _lib: lib,
            opened,
        })
    }

    /// `Ok` or the library's own error text.
    pub fn check(&self, r: NcclResult, what: &str) -> Result<(), String> {
        if r == 0 {
            return Ok(());
        }
        // SAFETY: NCCL returns a static string for any result code.
        let text = unsafe {
            let p = (self.get_error_string)(r);
            if p.is_null() {
                String::new()
            } else {
                CStr::from_ptr(p).to_string_lossy().into_owned()
            }
        };
        Err(format!("{what}: NCCL error {r} ({text})"))
    }

    /// NCCL's last error text for `comm`, when the library offers one.
    ///
    /// # Safety
    /// `comm` must be a communicator of this library, not yet destroyed.
    pub unsafe fn last_error(&self, comm: Comm) -> Option<String> {
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
    pub fn version(&self) -> Result<(i32, i32, i32), String> {
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
