//! Target choice: what NVRTC is asked to emit (CUBIN for an `sm_XY`, or PTX
//! for a `compute_XY` the driver JIT-compiles), and the pinned option list.

use super::super::error::GpuError;
use super::super::probe;
use serde::Serialize;

/// What NVRTC is asked to emit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Default)]
#[serde(rename_all = "kebab-case")]
pub enum Target {
    /// CUBIN for the device's exact `sm_XY` when NVRTC knows it, else PTX
    /// for the newest virtual arch NVRTC has below the device's.
    #[default]
    Auto,
    /// CUBIN for `sm_XY` (XY as a number: 90 for sm_90).
    Cubin(u32),
    /// PTX for `compute_XY`, JIT-compiled by the driver at load.
    Ptx(u32),
}

/// A `--target` or matrix `target` that names no target.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("`{0}`: expected auto, sm_XY or compute_XY")]
pub struct TargetParseError(pub String);

/// `auto`, `sm_XY` or `compute_XY`, as `--target` and audit matrices write it.
impl std::str::FromStr for Target {
    type Err = TargetParseError;

    fn from_str(s: &str) -> Result<Self, TargetParseError> {
        let expected = || TargetParseError(s.to_string());
        let arch = |xy: &str| xy.parse::<u32>().map_err(|_| expected());
        if s == "auto" {
            Ok(Target::Auto)
        } else if let Some(xy) = s.strip_prefix("sm_") {
            Ok(Target::Cubin(arch(xy)?))
        } else if let Some(xy) = s.strip_prefix("compute_") {
            Ok(Target::Ptx(arch(xy)?))
        } else {
            Err(expected())
        }
    }
}

#[cfg(test)]
mod target_parse_tests {
    use super::Target;

    #[test]
    fn targets_parse_from_their_command_line_names() {
        assert_eq!("auto".parse(), Ok(Target::Auto));
        assert_eq!("sm_90".parse(), Ok(Target::Cubin(90)));
        assert_eq!("compute_75".parse(), Ok(Target::Ptx(75)));
        for bad in ["sm90", "sm_", "compute_x", "", "AUTO"] {
            let e = bad.parse::<Target>().unwrap_err();
            assert_eq!(
                e.to_string(),
                format!("`{bad}`: expected auto, sm_XY or compute_XY")
            );
        }
    }
}

/// Options of the fold build. Only `fmad` and `ftz` can differ from the
/// pinned defaults, and only through this struct.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
pub struct CompileOptions {
    pub fmad: bool,
    pub ftz: bool,
    pub target: Target,
    /// Take compiled kernels from the on-disk cache and store new ones
    /// there (`--no-kernel-cache` and audit children: off). Not part of the
    /// report's config: each module's `kernel_cache` entry says what happened.
    #[serde(skip)]
    pub disk_cache: bool,
}

impl Default for CompileOptions {
    fn default() -> Self {
        CompileOptions {
            fmad: false,
            ftz: false,
            target: Target::Auto,
            disk_cache: true,
        }
    }
}

/// A target NVRTC will build, after `Auto` was resolved for a device.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
pub struct ResolvedTarget {
    /// `cubin` or `ptx`.
    pub kind: &'static str,
    pub arch: u32,
}

impl ResolvedTarget {
    pub fn arch_option(&self) -> String {
        if self.kind == "cubin" {
            format!("-arch=sm_{}", self.arch)
        } else {
            format!("-arch=compute_{}", self.arch)
        }
    }
}

/// The exact NVRTC option list (what reports record).
pub fn option_list(fmad: bool, ftz: bool, target: ResolvedTarget) -> Vec<String> {
    vec![
        format!("--fmad={fmad}"),
        format!("--ftz={ftz}"),
        "--prec-div=true".into(),
        "--prec-sqrt=true".into(),
        "--std=c++17".into(),
        target.arch_option(),
    ]
}

/// Resolve `target` for a device of compute capability `cc`.
pub fn resolve_target(
    target: Target,
    cc: (i32, i32),
    supported: &[i32],
    nvrtc: (i32, i32),
    driver: Option<i32>,
) -> Result<ResolvedTarget, GpuError> {
    let device_arch = (cc.0 * 10 + cc.1) as u32;
    let knows = |a: u32| supported.iter().any(|&s| s as u32 == a);
    let resolved = match target {
        Target::Auto if knows(device_arch) => ResolvedTarget {
            kind: "cubin",
            arch: device_arch,
        },
        Target::Auto => {
            let best = supported
                .iter()
                .map(|&s| s as u32)
                .filter(|&s| s <= device_arch)
                .max()
                .ok_or_else(|| {
                    GpuError::missing(format!(
                        "NVRTC {}.{} supports none of the architectures up to the device's sm_{device_arch} (it knows {supported:?})",
                        nvrtc.0, nvrtc.1
                    ))
                })?;
            ResolvedTarget {
                kind: "ptx",
                arch: best,
            }
        }
        Target::Cubin(a) | Target::Ptx(a) => {
            if !knows(a) {
                return Err(GpuError::missing(format!(
                    "NVRTC {}.{} cannot target arch {a} (it knows {supported:?})",
                    nvrtc.0, nvrtc.1
                )));
            }
            if a > device_arch {
                return Err(GpuError::missing(format!(
                    "target arch {a} is newer than the device's sm_{device_arch}"
                )));
            }
            ResolvedTarget {
                kind: if matches!(target, Target::Cubin(_)) {
                    "cubin"
                } else {
                    "ptx"
                },
                arch: a,
            }
        }
    };
    if resolved.kind == "ptx" {
        let nv = nvrtc.0 * 1000 + nvrtc.1 * 10;
        if let Some(d) = driver {
            if nv > d {
                return Err(GpuError::missing(format!(
                    "NVRTC {}.{} emits PTX that the driver (CUDA {}) cannot load; use a CUBIN target, or put an NVRTC no newer than the driver first on LD_LIBRARY_PATH",
                    nvrtc.0,
                    nvrtc.1,
                    probe::version_text(d)
                )));
            }
        }
    }
    Ok(resolved)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets_resolve_and_reject() {
        let sup = [75, 80, 86, 89, 90, 100, 120];
        let t = resolve_target(Target::Auto, (9, 0), &sup, (13, 0), Some(13000)).unwrap();
        assert_eq!((t.kind, t.arch), ("cubin", 90));
        // A device newer than NVRTC: PTX for the best arch below it.
        let t = resolve_target(Target::Auto, (9, 0), &[75, 80, 86], (12, 4), Some(13000)).unwrap();
        assert_eq!((t.kind, t.arch), ("ptx", 86));
        let t = resolve_target(Target::Ptx(75), (9, 0), &sup, (13, 0), Some(13000)).unwrap();
        assert_eq!(t.arch_option(), "-arch=compute_75");
        let e = resolve_target(Target::Ptx(75), (9, 0), &sup, (13, 0), Some(12080)).unwrap_err();
        assert!(e.to_string().contains("cannot load"), "{e}");
        // CUBIN from a newer NVRTC is not refused up front.
        assert!(resolve_target(Target::Cubin(90), (9, 0), &sup, (13, 0), Some(12080)).is_ok());
        assert!(resolve_target(Target::Cubin(100), (9, 0), &sup, (13, 0), Some(13000)).is_err());
        assert!(resolve_target(Target::Ptx(61), (9, 0), &sup, (13, 0), Some(13000)).is_err());
    }

    #[test]
    fn pinned_options_are_explicit() {
        let t = ResolvedTarget {
            kind: "cubin",
            arch: 90,
        };
        assert_eq!(
            option_list(false, false, t),
            vec![
                "--fmad=false",
                "--ftz=false",
                "--prec-div=true",
                "--prec-sqrt=true",
                "--std=c++17",
                "-arch=sm_90"
            ]
        );
    }
}
