//! The NVRTC calls: one source and option list in, one CUBIN or PTX image
//! out. Pure host work: needs no device, only the NVRTC library (which
//! [`probe`] checks before cudarc may touch it).

use super::super::error::{GpuError, NvrtcError};
use super::super::probe;
use super::target::ResolvedTarget;
use serde::Serialize;
use sha2::{Digest as _, Sha256};
use std::ffi::{c_char, CString};

/// A compiled program image.
#[derive(Debug, Clone, Serialize)]
pub struct Image {
    pub program: &'static str,
    pub target: ResolvedTarget,
    pub options: Vec<String>,
    pub nvrtc_version: (i32, i32),
    /// SHA-256 of the CUBIN, or of the PTX text without its NUL.
    pub sha256: String,
    pub bytes: usize,
    pub log: String,
    /// Why the image differs from what was asked (e.g. PTX instead of a
    /// CUBIN that ignored a flag).
    pub note: Option<String>,
    #[serde(skip)]
    pub data: Vec<u8>,
}

impl Image {
    /// The hashed bytes: the CUBIN, or the PTX text without its NUL.
    pub fn hashed_bytes(&self) -> &[u8] {
        if self.target.kind == "ptx" {
            self.data.strip_suffix(&[0]).unwrap_or(&self.data)
        } else {
            &self.data
        }
    }
}

fn nvrtc_err(what: &'static str, r: cudarc::nvrtc::sys::nvrtcResult) -> GpuError {
    GpuError::Nvrtc(NvrtcError {
        op: what.into(),
        code: Some(r),
        log: String::new(),
    })
}

/// A refusal before NVRTC was called (a string it could not be given).
fn refused(what: String) -> GpuError {
    GpuError::Nvrtc(NvrtcError {
        op: what.into(),
        code: None,
        log: String::new(),
    })
}

/// Run NVRTC once.
pub fn nvrtc_compile(
    program: &'static str,
    src: &str,
    options: &[String],
    target: ResolvedTarget,
) -> Result<Image, GpuError> {
    use cudarc::nvrtc::sys;
    probe::ensure_nvrtc()?;
    let nvrtc_version = probe::nvrtc_version()?;
    let c_src = CString::new(src)
        .map_err(|_| refused(format!("{program}: the kernel source holds a NUL byte")))?;
    let c_name = CString::new(format!("{program}.cu"))
        .map_err(|_| refused(format!("program name `{program}` holds a NUL byte")))?;
    let c_opts: Vec<CString> = options
        .iter()
        .map(|o| CString::new(o.as_str()).map_err(|_| refused(format!("option `{o}` holds a NUL"))))
        .collect::<Result<_, _>>()?;
    let opt_ptrs: Vec<*const c_char> = c_opts.iter().map(|o| o.as_ptr()).collect();

    let mut prog: sys::nvrtcProgram = std::ptr::null_mut();
    // SAFETY: valid NUL-terminated strings that outlive the call; no headers.
    let r = unsafe {
        sys::nvrtcCreateProgram(
            &mut prog,
            c_src.as_ptr(),
            c_name.as_ptr(),
            0,
            std::ptr::null(),
            std::ptr::null(),
        )
    };
    if r != sys::nvrtcResult::NVRTC_SUCCESS {
        return Err(nvrtc_err("nvrtcCreateProgram", r));
    }
    // SAFETY: `prog` is live until the destroy below; option pointers
    // outlive the call.
    let result = unsafe {
        let compiled = sys::nvrtcCompileProgram(prog, opt_ptrs.len() as i32, opt_ptrs.as_ptr());
        let log = program_log(prog);
        if compiled != sys::nvrtcResult::NVRTC_SUCCESS {
            Err(GpuError::Nvrtc(NvrtcError {
                op: format!("could not compile {program} with {}", options.join(" ")).into(),
                code: Some(compiled),
                log,
            }))
        } else {
            fetch_image(prog, target).map(|data| (data, log))
        }
    };
    // SAFETY: created above, destroyed once.
    unsafe {
        sys::nvrtcDestroyProgram(&mut prog);
    }
    let (data, log) = result?;
    let mut image = Image {
        program,
        target,
        options: options.to_vec(),
        nvrtc_version,
        sha256: String::new(),
        bytes: 0,
        log,
        note: None,
        data,
    };
    let (bytes, sha256) = {
        let hashed = image.hashed_bytes();
        (hashed.len(), hex::encode(Sha256::digest(hashed)))
    };
    image.bytes = bytes;
    image.sha256 = sha256;
    Ok(image)
}

/// # Safety
/// `prog` must be a live program.
unsafe fn program_log(prog: cudarc::nvrtc::sys::nvrtcProgram) -> String {
    use cudarc::nvrtc::sys;
    let mut size = 0usize;
    // SAFETY: `prog` is live (caller's contract); `size` is an out-parameter.
    if unsafe { sys::nvrtcGetProgramLogSize(prog, &mut size) } != sys::nvrtcResult::NVRTC_SUCCESS
        || size == 0
    {
        return String::new();
    }
    let mut buf = vec![0u8; size];
    // SAFETY: `buf` holds the `size` bytes NVRTC asked for, NUL included.
    if unsafe { sys::nvrtcGetProgramLog(prog, buf.as_mut_ptr().cast()) }
        != sys::nvrtcResult::NVRTC_SUCCESS
    {
        return String::new();
    }
    let text = buf.strip_suffix(&[0]).unwrap_or(&buf);
    String::from_utf8_lossy(text).trim().to_string()
}

/// # Safety
/// `prog` must be a successfully compiled program.
unsafe fn fetch_image(
    prog: cudarc::nvrtc::sys::nvrtcProgram,
    target: ResolvedTarget,
) -> Result<Vec<u8>, GpuError> {
    use cudarc::nvrtc::sys;
    let mut size = 0usize;
    let cubin = target.kind == "cubin";
    let r = if cubin {
        // SAFETY: `prog` compiled (caller's contract); out-parameter.
        unsafe { sys::nvrtcGetCUBINSize(prog, &mut size) }
    } else {
        // SAFETY: as above.
        unsafe { sys::nvrtcGetPTXSize(prog, &mut size) }
    };
    if r != sys::nvrtcResult::NVRTC_SUCCESS {
        return Err(nvrtc_err("image size query", r));
    }
    let mut data = vec![0u8; size];
    let r = if cubin {
        // SAFETY: `data` holds the `size` bytes NVRTC reported.
        unsafe { sys::nvrtcGetCUBIN(prog, data.as_mut_ptr().cast()) }
    } else {
        // SAFETY: as above.
        unsafe { sys::nvrtcGetPTX(prog, data.as_mut_ptr().cast()) }
    };
    if r != sys::nvrtcResult::NVRTC_SUCCESS {
        return Err(nvrtc_err("image fetch", r));
    }
    if data.is_empty() {
        return Err(refused("NVRTC returned an empty image".into()));
    }
    Ok(data)
}
