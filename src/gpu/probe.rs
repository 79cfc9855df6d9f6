//! Library and device detection that never panics.
//!
//! cudarc's dynamic loader panics when a library or one of its symbols is
//! missing. Before any cudarc call we dlopen the very names cudarc would try
//! (same candidate list, same order, so the loader hands both of us the same
//! handle) and look up every symbol this backend uses; only then is cudarc
//! allowed to touch the library.

use super::error::{GpuError, NvrtcError};
use super::mapped;
use serde::Serialize;

/// Driver entry points this backend (through cudarc) calls.
const DRIVER_SYMBOLS: &[&str] = &[
    "cuInit",
    "cuDriverGetVersion",
    "cuDeviceGetCount",
    "cuDeviceGet",
    "cuDeviceGetName",
    "cuDeviceGetUuid",
    "cuDeviceGetAttribute",
    "cuDeviceTotalMem_v2",
    "cuDevicePrimaryCtxRetain",
    "cuDevicePrimaryCtxRelease_v2",
    "cuCtxSetCurrent",
    "cuCtxGetCurrent",
    "cuCtxSynchronize",
    "cuMemGetInfo_v2",
    "cuMemAlloc_v2",
    "cuMemFree_v2",
    "cuMemHostAlloc",
    "cuMemFreeHost",
    "cuMemcpyHtoD_v2",
    "cuMemcpyDtoH_v2",
    "cuMemcpyDtoDAsync_v2",
    "cuMemcpyDtoHAsync_v2",
    "cuStreamCreate",
    "cuStreamDestroy_v2",
    "cuStreamSynchronize",
    "cuStreamWaitEvent",
    "cuEventCreate",
    "cuEventDestroy_v2",
    "cuEventRecord",
    "cuEventSynchronize",
    "cuEventElapsedTime",
    "cuModuleLoadData",
    "cuModuleGetFunction",
    "cuModuleUnload",
    "cuLaunchKernel",
    "cuGetErrorName",
    "cuGetErrorString",
];

/// NVRTC entry points we call.
const NVRTC_SYMBOLS: &[&str] = &[
    "nvrtcVersion",
    "nvrtcCreateProgram",
    "nvrtcCompileProgram",
    "nvrtcDestroyProgram",
    "nvrtcGetProgramLogSize",
    "nvrtcGetProgramLog",
    "nvrtcGetPTXSize",
    "nvrtcGetPTX",
    "nvrtcGetCUBINSize",
    "nvrtcGetCUBIN",
    "nvrtcGetNumSupportedArchs",
    "nvrtcGetSupportedArchs",
    "nvrtcGetErrorString",
];

/// What opening one library gave.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct LibraryProbe {
    /// The names tried, in cudarc's order.
    pub names_tried: Vec<String>,
    /// The first name that opened (what cudarc will use).
    pub opened_name: Option<String>,
    /// The file the loader mapped for it (from /proc/self/maps).
    pub path: Option<String>,
    /// Symbols we need that the library does not export.
    pub missing_symbols: Vec<String>,
    /// The loader's message for the last failed name, when none opened.
    pub error: Option<String>,
}

impl LibraryProbe {
    pub fn usable(&self) -> bool {
        self.opened_name.is_some() && self.missing_symbols.is_empty()
    }
}

#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct DeviceProbe {
    pub ordinal: usize,
    pub name: String,
    pub compute_capability: (i32, i32),
    pub sm_count: i32,
    pub total_memory_bytes: u64,
}

/// Everything `doctor` shows about CUDA on this machine.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct CudaProbe {
    pub driver_library: LibraryProbe,
    /// `cuDriverGetVersion`, e.g. 13000 for CUDA 13.0.
    pub driver_version: Option<i32>,
    /// `cuInit` or device-query failure, if any.
    pub driver_error: Option<String>,
    pub device_count: usize,
    pub devices: Vec<DeviceProbe>,
    pub nvrtc_library: LibraryProbe,
    pub nvrtc_version: Option<(i32, i32)>,
    /// Virtual architectures NVRTC can target (e.g. 75, 80, 90).
    pub nvrtc_supported_archs: Vec<i32>,
    pub nvrtc_error: Option<String>,
    pub ld_library_path: Option<String>,
    /// True when a driver, at least one device and NVRTC are all usable.
    pub usable: bool,
    /// What is missing, one line each, when not usable.
    pub missing: Vec<String>,
}

impl CudaProbe {
    /// One sentence naming what is missing (for `BackendError::Unavailable`).
    pub fn reason(&self) -> String {
        if self.missing.is_empty() {
            "CUDA is usable".into()
        } else {
            self.missing.join("; ")
        }
    }

    /// Like `reason`, without the lists of names tried (for one-line notes).
    pub fn short_reason(&self) -> String {
        let mut parts = Vec::new();
        let d = &self.driver_library;
        if d.opened_name.is_none() {
            parts.push("no CUDA driver library (libcuda.so)".to_string());
        } else if !d.missing_symbols.is_empty() {
            parts.push(format!(
                "the CUDA driver library {} lacks {} symbol(s) foldprint calls ({}...)",
                d.path
                    .as_deref()
                    .or(d.opened_name.as_deref())
                    .unwrap_or("?"),
                d.missing_symbols.len(),
                d.missing_symbols[0]
            ));
        } else if let Some(e) = &self.driver_error {
            parts.push(format!("driver: {e}"));
        } else if self.device_count == 0 {
            parts.push("no CUDA device".to_string());
        }
        if self.nvrtc_library.opened_name.is_none() {
            parts.push("no NVRTC library (libnvrtc.so)".to_string());
        }
        if parts.is_empty() {
            self.reason()
        } else {
            parts.join(", ")
        }
    }

    /// Driver version as `major.minor`.
    pub fn driver_version_text(&self) -> Option<String> {
        self.driver_version.map(version_text)
    }
}

/// `13000` -> `13.0`.
pub fn version_text(v: i32) -> String {
    format!("{}.{}", v / 1000, (v % 1000) / 10)
}

fn open_library(mut names: Vec<String>, symbols: &[&str], family: &str) -> LibraryProbe {
    // cudarc's list repeats some names; trying one twice tells nothing.
    let mut seen = std::collections::HashSet::new();
    names.retain(|n| seen.insert(n.clone()));
    let mut probe = LibraryProbe {
        names_tried: names.clone(),
        opened_name: None,
        path: None,
        missing_symbols: Vec::new(),
        error: None,
    };
    for name in &names {
        // SAFETY: loading runs the library's initializers; these are the
        // vendor libraries cudarc itself would load by the same name.
        match unsafe { libloading::Library::new(name) } {
            Ok(lib) => {
                for sym in symbols {
                    // SAFETY: only the symbol's presence is checked; the
                    // pointer is never called through this handle.
                    let found = unsafe { lib.get::<*const ()>(sym.as_bytes()) }.is_ok();
                    if !found {
                        probe.missing_symbols.push((*sym).to_string());
                    }
                }
                probe.opened_name = Some(name.clone());
                probe.path = mapped::mapped_path_of(family);
                // Keep the library loaded for the process: cudarc holds its
                // own handle to the same mapping from now on.
                std::mem::forget(lib);
                return probe;
            }
            Err(e) => {
                // libloading's Display hides dlerror(); it is the source.
                // Keep the first failure: it names the plain library name.
                if probe.error.is_none() {
                    let detail = std::error::Error::source(&e).map(|s| s.to_string());
                    probe.error = Some(detail.unwrap_or_else(|| e.to_string()));
                }
            }
        }
    }
    probe
}

/// Probe the driver library only (cheap; cached by the loader). The first
/// call also makes the host's driver loadable where the loader alone cannot
/// find it (`host_driver`).
pub(crate) fn driver_library() -> LibraryProbe {
    super::host_driver::ensure_loaded();
    let names: Vec<String> = ["cuda", "nvcuda"]
        .iter()
        .flat_map(|l| cudarc::get_lib_name_candidates(l))
        .collect();
    open_library(names, DRIVER_SYMBOLS, "cuda")
}

pub(crate) fn nvrtc_library() -> LibraryProbe {
    open_library(
        cudarc::get_lib_name_candidates("nvrtc"),
        NVRTC_SYMBOLS,
        "nvrtc",
    )
}

fn missing_library_line(what: &str, lib: &LibraryProbe, ld: &Option<String>) -> String {
    if lib.opened_name.is_none() {
        format!(
            "{what} library not found (tried {}; loader said: {}; LD_LIBRARY_PATH={})",
            lib.names_tried.join(", "),
            lib.error.as_deref().unwrap_or("nothing"),
            ld.as_deref().unwrap_or("<unset>")
        )
    } else {
        format!(
            "{what} library {} ({}) lacks symbols {}",
            lib.opened_name.as_deref().unwrap_or("?"),
            lib.path.as_deref().unwrap_or("path unknown"),
            lib.missing_symbols.join(", ")
        )
    }
}

fn driver_err(e: cudarc::driver::DriverError) -> String {
    let name = e.error_name().map(|c| c.to_string_lossy().into_owned());
    let text = e.error_string().map(|c| c.to_string_lossy().into_owned());
    match (name, text) {
        (Ok(n), Ok(t)) => format!("{n}: {t}"),
        _ => format!("{:?}", e.0),
    }
}

/// Look for a usable CUDA driver, devices and NVRTC. Never panics.
pub fn probe() -> CudaProbe {
    let ld = std::env::var("LD_LIBRARY_PATH").ok();
    let driver_library = driver_library();
    let mut p = CudaProbe {
        driver_library,
        driver_version: None,
        driver_error: None,
        device_count: 0,
        devices: Vec::new(),
        nvrtc_library: nvrtc_library(),
        nvrtc_version: None,
        nvrtc_supported_archs: Vec::new(),
        nvrtc_error: None,
        ld_library_path: ld.clone(),
        usable: false,
        missing: Vec::new(),
    };
    if p.driver_library.usable() {
        super::error::mark_driver_ready();
        query_driver(&mut p);
    } else {
        p.missing
            .push(missing_library_line("CUDA driver", &p.driver_library, &ld));
    }
    if p.nvrtc_library.usable() {
        match nvrtc_version() {
            Ok(v) => p.nvrtc_version = Some(v),
            Err(e) => p.nvrtc_error = Some(e.to_string()),
        }
        match nvrtc_supported_archs() {
            Ok(a) => p.nvrtc_supported_archs = a,
            Err(e) => {
                if p.nvrtc_error.is_none() {
                    p.nvrtc_error = Some(e.to_string());
                }
            }
        }
        if let Some(e) = &p.nvrtc_error {
            p.missing.push(format!("NVRTC: {e}"));
        }
    } else {
        p.missing
            .push(missing_library_line("NVRTC", &p.nvrtc_library, &ld));
    }
    p.usable = p.missing.is_empty();
    p
}

fn query_driver(p: &mut CudaProbe) {
    use cudarc::driver::{result, sys};
    if let Err(e) = result::init() {
        let hint = super::host_driver::state()
            .and_then(|d| d.search.as_ref())
            .and_then(super::host_driver::failure_hint)
            .map_or(String::new(), |h| format!(" ({h})"));
        p.driver_error = Some(format!("cuInit failed: {}{hint}", driver_err(e)));
    }
    let mut v = 0i32;
    // SAFETY: plain out-parameter call; the symbol was checked above.
    if unsafe { sys::cuDriverGetVersion(&mut v) } == sys::CUresult::CUDA_SUCCESS {
        p.driver_version = Some(v);
    }
    if let Some(e) = &p.driver_error {
        p.missing.push(format!("CUDA driver: {e}"));
        return;
    }
    let count = match result::device::get_count() {
        Ok(c) => c.max(0) as usize,
        Err(e) => {
            let msg = format!("cuDeviceGetCount failed: {}", driver_err(e));
            p.missing.push(format!("CUDA driver: {msg}"));
            p.driver_error = Some(msg);
            return;
        }
    };
    p.device_count = count;
    for ordinal in 0..count {
        match device_info(ordinal) {
            Ok(d) => p.devices.push(d),
            Err(e) => {
                p.driver_error
                    .get_or_insert_with(String::new)
                    .push_str(&format!("device {ordinal}: {e}; "));
            }
        }
    }
    if p.devices.is_empty() {
        p.missing.push(format!(
            "no usable CUDA device (driver reports {count}{})",
            p.driver_error
                .as_deref()
                .map(|e| format!("; {e}"))
                .unwrap_or_default()
        ));
    }
}

/// Name, compute capability, SMs and memory of one device.
pub(crate) fn device_info(ordinal: usize) -> Result<DeviceProbe, GpuError> {
    use cudarc::driver::{result, sys::CUdevice_attribute as A};
    let dev =
        result::device::get(ordinal as i32).map_err(|e| GpuError::driver("cuDeviceGet", e))?;
    let name = result::device::get_name(dev).map_err(|e| GpuError::driver("cuDeviceGetName", e))?;
    let attr = |a| {
        // SAFETY: `dev` came from cuDeviceGet above.
        unsafe { result::device::get_attribute(dev, a) }
            .map_err(|e| GpuError::driver("cuDeviceGetAttribute", e))
    };
    let major = attr(A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?;
    let minor = attr(A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?;
    let sm_count = attr(A::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?;
    // SAFETY: as above.
    let total = unsafe { result::device::total_mem(dev) }
        .map_err(|e| GpuError::driver("cuDeviceTotalMem", e))?;
    Ok(DeviceProbe {
        ordinal,
        name,
        compute_capability: (major, minor),
        sm_count,
        total_memory_bytes: total as u64,
    })
}

fn nvrtc_failed(op: &'static str, r: cudarc::nvrtc::sys::nvrtcResult) -> GpuError {
    GpuError::Nvrtc(NvrtcError {
        op: op.into(),
        code: Some(r),
        log: String::new(),
    })
}

pub fn nvrtc_version() -> Result<(i32, i32), GpuError> {
    ensure_nvrtc()?;
    let (mut major, mut minor) = (0i32, 0i32);
    // SAFETY: out-parameters only; the symbol was checked by the probe.
    let r = unsafe { cudarc::nvrtc::sys::nvrtcVersion(&mut major, &mut minor) };
    if r != cudarc::nvrtc::sys::nvrtcResult::NVRTC_SUCCESS {
        return Err(nvrtc_failed("nvrtcVersion", r));
    }
    Ok((major, minor))
}

pub fn nvrtc_supported_archs() -> Result<Vec<i32>, GpuError> {
    use cudarc::nvrtc::sys;
    ensure_nvrtc()?;
    let mut n = 0i32;
    // SAFETY: out-parameter; then a buffer of exactly `n` ints.
    let r = unsafe { sys::nvrtcGetNumSupportedArchs(&mut n) };
    if r != sys::nvrtcResult::NVRTC_SUCCESS {
        return Err(nvrtc_failed("nvrtcGetNumSupportedArchs", r));
    }
    let mut archs = vec![0i32; n.max(0) as usize];
    if !archs.is_empty() {
        // SAFETY: `archs` holds `n` ints as NVRTC asked.
        let r = unsafe { sys::nvrtcGetSupportedArchs(archs.as_mut_ptr()) };
        if r != sys::nvrtcResult::NVRTC_SUCCESS {
            return Err(nvrtc_failed("nvrtcGetSupportedArchs", r));
        }
    }
    Ok(archs)
}

/// Check NVRTC alone (host-only compilation needs no driver).
pub(crate) fn ensure_nvrtc() -> Result<(), GpuError> {
    let n = nvrtc_library();
    if n.usable() {
        Ok(())
    } else {
        Err(GpuError::Missing(missing_library_line(
            "NVRTC",
            &n,
            &std::env::var("LD_LIBRARY_PATH").ok(),
        )))
    }
}

/// Check both libraries are loadable with all symbols, so that cudarc
/// cannot panic; `Err` carries the sentence for `Unavailable`.
pub(crate) fn ensure_libraries() -> Result<(), GpuError> {
    let ld = std::env::var("LD_LIBRARY_PATH").ok();
    let d = driver_library();
    if !d.usable() {
        return Err(GpuError::Missing(missing_library_line(
            "CUDA driver",
            &d,
            &ld,
        )));
    }
    super::error::mark_driver_ready();
    let n = nvrtc_library();
    if !n.usable() {
        return Err(GpuError::Missing(missing_library_line("NVRTC", &n, &ld)));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn version_text_splits_major_minor() {
        assert_eq!(version_text(13000), "13.0");
        assert_eq!(version_text(12080), "12.8");
    }

    #[test]
    fn probe_never_panics_and_explains_itself() {
        let p = probe();
        assert_eq!(p.usable, p.missing.is_empty());
        if !p.usable {
            assert!(!p.reason().is_empty());
        }
        if p.driver_library.opened_name.is_none() {
            assert!(p.reason().contains("libcuda.so"), "{}", p.reason());
        }
    }
}
