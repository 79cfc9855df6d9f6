//! The GPU layer's one error type. Every failure keeps the operation that
//! failed and the library's own code, so callers decide by code (out of
//! memory, no device, anything else) and never by searching text.

use cudarc::driver::sys::CUresult;
use cudarc::driver::DriverError;
use cudarc::nvrtc::sys::nvrtcResult;
use std::borrow::Cow;
use std::sync::atomic::{AtomicBool, Ordering};

/// What was being done, for the message ("cuMemAlloc of 4096 bytes").
pub type Op = Cow<'static, str>;

/// Set once the driver library is known to load with every symbol: only
/// then may a message ask the driver for its description of a code (the
/// dynamically loaded driver panics when absent).
static DRIVER_READY: AtomicBool = AtomicBool::new(false);

pub(crate) fn mark_driver_ready() {
    DRIVER_READY.store(true, Ordering::Relaxed);
}

#[derive(Debug, thiserror::Error)]
pub enum GpuError {
    /// A CUDA driver call returned an error code.
    #[error("{op}: {}", driver_text(*code))]
    Driver { op: Op, code: CUresult },
    /// NVRTC refused a program or a query.
    #[error(transparent)]
    Nvrtc(#[from] NvrtcError),
    /// An NCCL call returned an error code.
    #[error(transparent)]
    Nccl(#[from] NcclError),
    /// A library (driver, NVRTC, NCCL) cannot be opened or lacks a symbol,
    /// or the device or its NVRTC cannot run what was asked.
    #[error("{0}")]
    Missing(String),
    /// A range outside a buffer, a size that overflows, a wrong count: a
    /// mistake on the host side, refused before any device write.
    #[error("{0}")]
    Bounds(String),
    /// A file the GPU layer reads or writes (kernel cache, library hash).
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
    /// A helper thread of the GPU layer panicked.
    #[error("{who} panicked{}", message.as_ref().map_or_else(String::new, |m| format!(": {m}")))]
    Panicked { who: Op, message: Option<String> },
}

/// How a caller should read a [`GpuError`]: the exit-code question.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GpuFault {
    /// Device (or host pinned, or NVRTC) memory ran out: a missing resource.
    OutOfMemory,
    /// No usable device, driver, library or target: a missing resource.
    Unavailable,
    /// The device, driver or NCCL failed while working: no verdict.
    Broken,
}

impl GpuError {
    /// The failure of driver call `op` with `e`'s code.
    pub fn driver(op: impl Into<Op>, e: DriverError) -> GpuError {
        GpuError::Driver {
            op: op.into(),
            code: e.0,
        }
    }

    pub fn bounds(message: impl Into<String>) -> GpuError {
        GpuError::Bounds(message.into())
    }

    pub fn missing(message: impl Into<String>) -> GpuError {
        GpuError::Missing(message.into())
    }

    /// `who` panicked (with the panic's message, when it had one).
    pub fn panicked(who: impl Into<Op>, message: Option<String>) -> GpuError {
        GpuError::Panicked {
            who: who.into(),
            message,
        }
    }

    /// The same error with more context in front of its operation.
    pub fn context(self, what: impl std::fmt::Display) -> GpuError {
        match self {
            GpuError::Driver { op, code } => GpuError::Driver {
                op: format!("{what}: {op}").into(),
                code,
            },
            GpuError::Nvrtc(mut e) => {
                e.op = format!("{what}: {}", e.op).into();
                GpuError::Nvrtc(e)
            }
            GpuError::Nccl(mut e) => {
                e.op = format!("{what}: {}", e.op).into();
                GpuError::Nccl(e)
            }
            GpuError::Missing(m) => GpuError::Missing(format!("{what}: {m}")),
            GpuError::Bounds(m) => GpuError::Bounds(format!("{what}: {m}")),
            GpuError::Io { what: w, source } => GpuError::Io {
                what: format!("{what}: {w}"),
                source,
            },
            e @ GpuError::Panicked { .. } => e,
        }
    }

    /// Classified by the library's code, never by the message.
    pub fn fault(&self) -> GpuFault {
        use cudarc::driver::sys::cudaError_enum as C;
        match self {
            GpuError::Driver { code, .. } => match code {
                C::CUDA_ERROR_OUT_OF_MEMORY => GpuFault::OutOfMemory,
                C::CUDA_ERROR_NO_DEVICE
                | C::CUDA_ERROR_INVALID_DEVICE
                | C::CUDA_ERROR_NOT_INITIALIZED
                | C::CUDA_ERROR_NO_BINARY_FOR_GPU
                | C::CUDA_ERROR_UNSUPPORTED_PTX_VERSION
                | C::CUDA_ERROR_JIT_COMPILER_NOT_FOUND
                | C::CUDA_ERROR_SYSTEM_NOT_READY
                | C::CUDA_ERROR_SYSTEM_DRIVER_MISMATCH
                | C::CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE => GpuFault::Unavailable,
                _ => GpuFault::Broken,
            },
            GpuError::Nvrtc(e) => match e.code {
                Some(nvrtcResult::NVRTC_ERROR_OUT_OF_MEMORY) => GpuFault::OutOfMemory,
                _ => GpuFault::Unavailable,
            },
            // NCCL's codes do not single out memory; a cuMemAlloc of ours
            // under NCCL is a `Driver` error and classified above.
            GpuError::Nccl(_) => GpuFault::Broken,
            GpuError::Missing(_) => GpuFault::Unavailable,
            GpuError::Io { source, .. } => match source.raw_os_error() {
                Some(libc::ENOSPC) | Some(libc::EDQUOT) | Some(libc::ENOMEM) => {
                    GpuFault::Unavailable
                }
                _ => GpuFault::Broken,
            },
            GpuError::Bounds(_) | GpuError::Panicked { .. } => GpuFault::Broken,
        }
    }
}

/// `CUDA_ERROR_X (the driver's description)`; the name alone when the
/// driver cannot be asked.
fn driver_text(code: CUresult) -> String {
    let name = format!("{code:?}");
    if !DRIVER_READY.load(Ordering::Relaxed) {
        return name;
    }
    match DriverError(code).error_string() {
        Ok(t) => format!("{name} ({})", t.to_string_lossy()),
        Err(_) => name,
    }
}

/// An NVRTC call that failed; `code` is `None` for failures before NVRTC
/// was called (a source that holds a NUL byte).
#[derive(Debug, thiserror::Error)]
#[error("NVRTC {op}: {}{}", code.map_or_else(|| "refused".to_string(), |c| format!("{c:?}")), log_tail(log))]
pub struct NvrtcError {
    pub op: Op,
    pub code: Option<nvrtcResult>,
    /// The compiler's log, when it wrote one.
    pub log: String,
}

fn log_tail(log: &str) -> String {
    if log.is_empty() {
        String::new()
    } else {
        format!("\n{log}")
    }
}

/// An NCCL call that returned an error code.
#[derive(Debug, thiserror::Error)]
#[error("{op}: NCCL error {code} ({text}){}", detail.as_ref().map_or_else(String::new, |d| format!(": {d}")))]
pub struct NcclError {
    pub op: Op,
    /// `ncclResult_t`.
    pub code: i32,
    /// `ncclGetErrorString` of the code.
    pub text: String,
    /// `ncclGetLastError`, when the library offers it (often names the peer).
    pub detail: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use cudarc::driver::sys::cudaError_enum as C;

    fn drv(code: CUresult) -> GpuError {
        GpuError::Driver {
            op: "cuMemAlloc of 4096 bytes".into(),
            code,
        }
    }

    #[test]
    fn driver_errors_are_classified_by_code() {
        assert_eq!(
            drv(C::CUDA_ERROR_OUT_OF_MEMORY).fault(),
            GpuFault::OutOfMemory
        );
        assert_eq!(drv(C::CUDA_ERROR_NO_DEVICE).fault(), GpuFault::Unavailable);
        assert_eq!(drv(C::CUDA_ERROR_LAUNCH_FAILED).fault(), GpuFault::Broken);
        // The message names the code whatever the context says: "memory"
        // in the operation does not make a launch failure out of memory.
        let e = drv(C::CUDA_ERROR_LAUNCH_FAILED).context("OUT_OF_MEMORY check");
        assert_eq!(e.fault(), GpuFault::Broken);
        assert!(e.to_string().contains("CUDA_ERROR_LAUNCH_FAILED"), "{e}");
    }

    #[test]
    fn nvrtc_and_nccl_errors_keep_their_codes() {
        let oom = GpuError::from(NvrtcError {
            op: "compile".into(),
            code: Some(nvrtcResult::NVRTC_ERROR_OUT_OF_MEMORY),
            log: String::new(),
        });
        assert_eq!(oom.fault(), GpuFault::OutOfMemory);
        let bad = GpuError::from(NvrtcError {
            op: "could not compile foldprint_fold".into(),
            code: Some(nvrtcResult::NVRTC_ERROR_COMPILATION),
            log: "error: x".into(),
        });
        assert_eq!(bad.fault(), GpuFault::Unavailable);
        assert!(bad
            .to_string()
            .ends_with("NVRTC_ERROR_COMPILATION\nerror: x"));
        let nccl = GpuError::from(NcclError {
            op: "ncclSend".into(),
            code: 6,
            text: "remote process exited or there was a network error".into(),
            detail: Some("peer 3".into()),
        });
        assert_eq!(nccl.fault(), GpuFault::Broken);
        assert_eq!(
            nccl.to_string(),
            "ncclSend: NCCL error 6 (remote process exited or there was a network error): peer 3"
        );
    }
}
