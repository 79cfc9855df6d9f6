//! One program built for one request: NVRTC with the requested options,
//! plus the check that non-default flags really reach a CUBIN. Host-only,
//! like [`nvrtc_compile`]: CPU CI runs it with a real NVRTC.

use super::nvrtc::{nvrtc_compile, Image};
use super::target::{option_list, ResolvedTarget};
use crate::gpu::error::GpuError;

/// What to build.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct BuildRequest {
    /// NVRTC's program name (`foldprint_fold`, `foldprint_generate`).
    pub program: &'static str,
    pub fmad: bool,
    pub ftz: bool,
    pub target: ResolvedTarget,
    /// The caller named the target (no fallback allowed).
    pub explicit: bool,
}

/// Compile `src` for `req`, checking that non-default flags really reach a
/// CUBIN.
///
/// Seen with NVRTC 13.0: `--ftz=true` changes the PTX but the CUBIN comes
/// out byte-identical to the `--ftz=false` one. A report must not claim a
/// flag the code does not carry, so when a non-default option set yields
/// the default CUBIN while its PTX differs, an `Auto` target falls back to
/// that PTX (the driver compiles it) and says so; an explicit CUBIN target
/// is refused.
pub fn build_image(req: BuildRequest, src: &str) -> Result<Image, GpuError> {
    let options = option_list(req.fmad, req.ftz, req.target);
    let mut image = nvrtc_compile(req.program, src, &options, req.target)?;
    let pinned = !req.fmad && !req.ftz;
    if pinned || req.target.kind != "cubin" {
        return Ok(image);
    }
    let default_opts = option_list(false, false, req.target);
    let default_cubin = nvrtc_compile(req.program, src, &default_opts, req.target)?;
    if default_cubin.sha256 != image.sha256 {
        return Ok(image);
    }
    let ptx_target = ResolvedTarget {
        kind: "ptx",
        arch: req.target.arch,
    };
    let ptx = nvrtc_compile(
        req.program,
        src,
        &option_list(req.fmad, req.ftz, ptx_target),
        ptx_target,
    )?;
    let ptx_default = nvrtc_compile(
        req.program,
        src,
        &option_list(false, false, ptx_target),
        ptx_target,
    )?;
    let (v0, v1) = image.nvrtc_version;
    if ptx.sha256 == ptx_default.sha256 {
        image.note = Some(format!(
            "{} do not change this program's code (NVRTC {v0}.{v1}: same PTX and CUBIN as the pinned defaults)",
            options[..2].join(" ")
        ));
        return Ok(image);
    }
    let what = format!(
        "NVRTC {v0}.{v1} emitted the same CUBIN for {} as for the pinned defaults, although the PTX differs",
        options[..2].join(" ")
    );
    if req.explicit {
        return Err(GpuError::missing(format!(
            "{what}; choose a PTX target (e.g. compute_{}) for these options",
            req.target.arch
        )));
    }
    let mut ptx = ptx;
    ptx.note = Some(format!(
        "{what}; using PTX for compute_{} so the flags take effect",
        req.target.arch
    ));
    Ok(ptx)
}
