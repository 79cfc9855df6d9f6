//! The device code (CUDA C strings), its NVRTC compilation with pinned
//! options, and a per-process module cache.
//!
//! Two programs: the generator (integer-only mirror of `crate::data`,
//! always built with the pinned options) and the fold (built with the
//! caller's [`CompileOptions`], so a test can show that `ftz` is visible).

use super::probe;
use cudarc::driver::{CudaContext, CudaFunction, CudaModule};
use serde::Serialize;
use sha2::{Digest as _, Sha256};
use std::collections::HashMap;
use std::ffi::{c_char, CString};
use std::fmt;
use std::sync::{Arc, Mutex, OnceLock};

/// `crate::data` on the device: same constants, same integer steps. The
/// only float operations are exact int -> f32 conversions of integers
/// below 2^24 and one multiply by 2^-24 whose results are normal.
pub const GENERATOR_SRC: &str = r#"
typedef unsigned long long u64;
typedef unsigned int u32;

__device__ __forceinline__ u64 fp_mix64(u64 z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}

__device__ __forceinline__ u64 fp_element_bits(u64 key, u64 index) {
    return fp_mix64(key + index * 0x9E3779B97F4A7C15ULL);
}

__device__ __forceinline__ u32 fp_parts(u64 sign, u64 exponent, u64 mantissa) {
    return ((u32)sign << 31) | ((u32)exponent << 23) | ((u32)mantissa & 0x007FFFFFu);
}

__device__ __forceinline__ u32 fp_mixed_magnitude(u64 u) {
    u64 e = 115ULL + ((((u >> 32) & 0xFFULL) * 24ULL) >> 8);
    return fp_parts(u >> 63, e, u);
}

__device__ __forceinline__ u32 fp_addend_bits(u32 dist, u64 u, u64 pair_u, u32 rank) {
    switch (dist) {
    case 0:
        return fp_mixed_magnitude(u);
    case 1: {
        int i = (int)(u >> 39) - (1 << 24);
        return __float_as_uint(__fmul_rn(__int2float_rn(i), 5.9604644775390625e-08f));
    }
    case 2: {
        u64 e = 137ULL + ((((pair_u >> 32) & 0xFFULL) * 11ULL) >> 8);
        if ((rank & 1u) == 0u) return fp_parts(0, e, pair_u);
        return fp_parts(1, e, (pair_u & ~0xFFULL) | (u & 0xFFULL));
    }
    case 3: {
        u64 sel = (u >> 32) & 3ULL;
        u64 e = sel == 3ULL ? 1ULL + ((u >> 34) & 3ULL) : 0ULL;
        return fp_parts(u >> 63, e, u);
    }
    case 4:
        switch ((u32)((u >> 32) & 63ULL)) {
        case 0: return 0x7F800000u;
        case 1: return 0xFF800000u;
        case 2: return ((u32)(u >> 63) << 31) | 0x7FC00000u | ((u32)u & 0x003FFFFFu);
        case 3: return 0x80000000u;
        case 4: return 0x00000000u;
        default: return fp_mixed_magnitude(u);
        }
    default: {
        int i = (int)(u >> 48) - (1 << 15);
        return __float_as_uint(__int2float_rn(i));
    }
    }
}

// out[j] = bits of element first + j of one lane, j < n.
extern "C" __global__ void fp_generate(u32* __restrict__ out, u64 n, u64 first,
                                       u64 key, u64 pair_key, u32 rank, u32 dist) {
    u64 stride = (u64)gridDim.x * (u64)blockDim.x;
    for (u64 j = (u64)blockIdx.x * (u64)blockDim.x + threadIdx.x; j < n; j += stride) {
        u64 idx = first + j;
        u64 u = fp_element_bits(key, idx);
        u64 pu = dist == 2u ? fp_element_bits(pair_key, idx) : 0ULL;
        out[j] = fp_addend_bits(dist, u, pu, rank);
    }
}
"#;

/// The fold. `stacked` holds `world` rows of stride `ld` (a multiple of 4)
/// with slot = source rank; `out + i` and every `stacked + r*ld + i` share
/// one 16-byte phase (the host places rows so), which lets `fast` use
/// float4 on both sides. Every add is an explicit round-to-nearest add in
/// program order, so nothing is contracted and the mean scale stays its
/// own rounding.
pub const FOLD_SRC: &str = r#"
typedef unsigned long long u64;
typedef unsigned int u32;

#define FP_ADD_OP 0xFFFFFFFFu
#define FP_STACK 40

// __fadd_rn/__fmul_rn: never contracted into an FMA whatever --fmad says;
// their denormal handling follows --ftz (through NVVM reflect).
__device__ __forceinline__ float fp_add(float a, float b) { return __fadd_rn(a, b); }
__device__ __forceinline__ float4 fp_add(float4 a, float4 b) {
    return make_float4(__fadd_rn(a.x, b.x), __fadd_rn(a.y, b.y), __fadd_rn(a.z, b.z),
                       __fadd_rn(a.w, b.w));
}
__device__ __forceinline__ float fp_scale(float a, float s) { return __fmul_rn(a, s); }
__device__ __forceinline__ float4 fp_scale(float4 a, float s) {
    return make_float4(__fmul_rn(a.x, s), __fmul_rn(a.y, s), __fmul_rn(a.z, s), __fmul_rn(a.w, s));
}

template <typename V> __device__ __forceinline__ V fp_load(const float* p);
template <> __device__ __forceinline__ float fp_load<float>(const float* p) { return *p; }
template <> __device__ __forceinline__ float4 fp_load<float4>(const float* p) {
    return *reinterpret_cast<const float4*>(p);
}
__device__ __forceinline__ void fp_store(float* p, float v) { *p = v; }
__device__ __forceinline__ void fp_store(float* p, float4 v) { *reinterpret_cast<float4*>(p) = v; }

// MODE 0: ascending chain from slot 0. MODE 1: chain over prog[0..world)
// (delivery order). MODE 2: postfix program (slot index = push, FP_ADD_OP =
// pop right, pop left, push left + right): the pairwise tree.
template <int MODE, typename V>
__device__ __forceinline__ V fp_fold_at(const float* __restrict__ s, u64 ld, u64 i, u32 world,
                                        const u32* __restrict__ prog, u32 prog_len) {
    if (MODE == 0) {
        V acc = fp_load<V>(s + i);
#pragma unroll 8
        for (u32 r = 1; r < world; ++r) acc = fp_add(acc, fp_load<V>(s + (u64)r * ld + i));
        return acc;
    } else if (MODE == 1) {
        V acc = fp_load<V>(s + (u64)prog[0] * ld + i);
#pragma unroll 4
        for (u32 k = 1; k < world; ++k) acc = fp_add(acc, fp_load<V>(s + (u64)prog[k] * ld + i));
        return acc;
    } else {
        V st[FP_STACK];
        int top = 0;
        for (u32 k = 0; k < prog_len; ++k) {
            u32 op = prog[k];
            if (op == FP_ADD_OP) {
                V right = st[--top];
                V left = st[--top];
                st[top++] = fp_add(left, right);
            } else {
                st[top++] = fp_load<V>(s + (u64)op * ld + i);
            }
        }
        return st[0];
    }
}

template <int MODE>
__device__ __forceinline__ void fp_fold_seed(float* __restrict__ out, const float* __restrict__ s,
                                             u64 ld, u64 len, u32 world,
                                             const u32* __restrict__ prog, u32 prog_len,
                                             float scale, u32 use_scale) {
    u64 i = (u64)blockIdx.x * (u64)blockDim.x + threadIdx.x;
    if (i >= len) return;
    float acc = fp_fold_at<MODE, float>(s, ld, i, world, prog, prog_len);
    if (use_scale) acc = fp_scale(acc, scale);
    out[i] = acc;
}

template <int MODE>
__device__ __forceinline__ void fp_fold_fast(float* __restrict__ out, const float* __restrict__ s,
                                             u64 ld, u64 len, u32 world,
                                             const u32* __restrict__ prog, u32 prog_len,
                                             float scale, u32 use_scale) {
    // Scalar head up to the first 16-byte boundary of out, float4 body,
    // scalar tail of < 4 elements.
    u64 head = ((16ULL - ((u64)out & 15ULL)) & 15ULL) >> 2;
    if (head > len) head = len;
    u64 nvec = (len - head) >> 2;
    u64 tail = head + nvec * 4ULL;
    u64 tid = (u64)blockIdx.x * (u64)blockDim.x + threadIdx.x;
    u64 stride = (u64)gridDim.x * (u64)blockDim.x;
    for (u64 v = tid; v < nvec; v += stride) {
        u64 i = head + v * 4ULL;
        float4 acc = fp_fold_at<MODE, float4>(s, ld, i, world, prog, prog_len);
        if (use_scale) acc = fp_scale(acc, scale);
        fp_store(out + i, acc);
    }
    if (tid < head) {
        float acc = fp_fold_at<MODE, float>(s, ld, tid, world, prog, prog_len);
        if (use_scale) acc = fp_scale(acc, scale);
        out[tid] = acc;
    }
    if (tail + tid < len) {
        u64 i = tail + tid;
        float acc = fp_fold_at<MODE, float>(s, ld, i, world, prog, prog_len);
        if (use_scale) acc = fp_scale(acc, scale);
        out[i] = acc;
    }
}

#define FP_FOLD_ENTRY(NAME, IMPL, MODE)                                                     \
    extern "C" __global__ void NAME(float* __restrict__ out, const float* __restrict__ s,   \
                                    u64 ld, u64 len, u32 world,                             \
                                    const u32* __restrict__ prog, u32 prog_len,             \
                                    float scale, u32 use_scale) {                           \
        IMPL<MODE>(out, s, ld, len, world, prog, prog_len, scale, use_scale);               \
    }

FP_FOLD_ENTRY(fp_fold_fixed_seed, fp_fold_seed, 0)
FP_FOLD_ENTRY(fp_fold_order_seed, fp_fold_seed, 1)
FP_FOLD_ENTRY(fp_fold_tree_seed, fp_fold_seed, 2)
FP_FOLD_ENTRY(fp_fold_fixed_fast, fp_fold_fast, 0)
FP_FOLD_ENTRY(fp_fold_order_fast, fp_fold_fast, 1)
FP_FOLD_ENTRY(fp_fold_tree_fast, fp_fold_fast, 2)
"#;

/// Deepest operand stack the device tree evaluator holds (`FP_STACK`).
pub const TREE_STACK: usize = 40;
/// The postfix "add" opcode (`FP_ADD_OP`).
pub const TREE_ADD: u32 = u32::MAX;

/// Which fold kernel implementation runs. Both give identical bits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Default)]
#[serde(rename_all = "kebab-case")]
pub enum KernelVariant {
    /// One thread per element, scalar loads, 64-bit indices: the shape of the
    /// upstream seed reducer (named `seed` on the command line and in reports).
    PerElement,
    /// Grid-stride, float4 loads/stores on the aligned body, scalar edges.
    #[default]
    Fast,
}

impl KernelVariant {
    pub const ALL: [KernelVariant; 2] = [KernelVariant::PerElement, KernelVariant::Fast];
    pub const fn name(self) -> &'static str {
        match self {
            KernelVariant::PerElement => "seed",
            KernelVariant::Fast => "fast",
        }
    }
}

impl fmt::Display for KernelVariant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The per-element combination a fold kernel applies.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FoldMode {
    Fixed,
    Order,
    Tree,
}

fn entry_name(mode: FoldMode, variant: KernelVariant) -> &'static str {
    match (mode, variant) {
        (FoldMode::Fixed, KernelVariant::PerElement) => "fp_fold_fixed_seed",
        (FoldMode::Order, KernelVariant::PerElement) => "fp_fold_order_seed",
        (FoldMode::Tree, KernelVariant::PerElement) => "fp_fold_tree_seed",
        (FoldMode::Fixed, KernelVariant::Fast) => "fp_fold_fixed_fast",
        (FoldMode::Order, KernelVariant::Fast) => "fp_fold_order_fast",
        (FoldMode::Tree, KernelVariant::Fast) => "fp_fold_tree_fast",
    }
}

const FOLD_ENTRIES: [&str; 6] = [
    "fp_fold_fixed_seed",
    "fp_fold_order_seed",
    "fp_fold_tree_seed",
    "fp_fold_fixed_fast",
    "fp_fold_order_fast",
    "fp_fold_tree_fast",
];

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

/// `auto`, `sm_XY` or `compute_XY`, as `--target` and audit matrices write it.
impl std::str::FromStr for Target {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let expected = || format!("`{s}`: expected auto, sm_XY or compute_XY");
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
            assert_eq!(
                bad.parse::<Target>(),
                Err(format!("`{bad}`: expected auto, sm_XY or compute_XY"))
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
}

impl Default for CompileOptions {
    fn default() -> Self {
        CompileOptions {
            fmad: false,
            ftz: false,
            target: Target::Auto,
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
) -> Result<ResolvedTarget, String> {
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
                    format!(
                        "NVRTC {}.{} supports none of the architectures up to the device's sm_{device_arch} (it knows {supported:?})",
                        nvrtc.0, nvrtc.1
                    )
                })?;
            ResolvedTarget {
                kind: "ptx",
                arch: best,
            }
        }
        Target::Cubin(a) | Target::Ptx(a) => {
            if !knows(a) {
                return Err(format!(
                    "NVRTC {}.{} cannot target arch {a} (it knows {supported:?})",
                    nvrtc.0, nvrtc.1
                ));
            }
            if a > device_arch {
                return Err(format!(
                    "target arch {a} is newer than the device's sm_{device_arch}"
                ));
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
                return Err(format!(
                    "NVRTC {}.{} emits PTX that the driver (CUDA {}) cannot load; use a CUBIN target, or put an NVRTC no newer than the driver first on LD_LIBRARY_PATH",
                    nvrtc.0,
                    nvrtc.1,
                    probe::version_text(d)
                ));
            }
        }
    }
    Ok(resolved)
}

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

fn nvrtc_err(what: &str, r: cudarc::nvrtc::sys::nvrtcResult) -> String {
    format!("NVRTC {what} failed: {r:?}")
}

/// Run NVRTC once. Pure host work: needs no device.
pub fn nvrtc_compile(
    program: &'static str,
    src: &str,
    options: &[String],
    target: ResolvedTarget,
) -> Result<Image, String> {
    use cudarc::nvrtc::sys;
    probe::ensure_nvrtc()?;
    let nvrtc_version = probe::nvrtc_version()?;
    let c_src = CString::new(src).map_err(|_| "kernel source holds a NUL byte".to_string())?;
    let c_name =
        CString::new(format!("{program}.cu")).map_err(|_| "bad program name".to_string())?;
    let c_opts: Vec<CString> = options
        .iter()
        .map(|o| CString::new(o.as_str()).map_err(|_| format!("option `{o}` holds a NUL")))
        .collect::<Result<_, _>>()?;
    let opt_ptrs: Vec<*const c_char> = c_opts.iter().map(|o| o.as_ptr()).collect();

    let mut prog: sys::nvrtcProgram = std::ptr::null_mut();
    // SAFETY: valid NUL-terminated strings; no headers.
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
            Err(format!(
                "NVRTC could not compile {program} with {}: {compiled:?}\n{log}",
                options.join(" ")
            ))
        } else {
            fetch_image(prog, target).map(|data| (data, log))
        }
    };
    // SAFETY: created above, destroyed once.
    unsafe {
        sys::nvrtcDestroyProgram(&mut prog);
    }
    let (data, log) = result?;
    let hashed: &[u8] = if target.kind == "ptx" {
        data.strip_suffix(&[0]).unwrap_or(&data)
    } else {
        &data
    };
    Ok(Image {
        program,
        target,
        options: options.to_vec(),
        nvrtc_version,
        sha256: hex::encode(Sha256::digest(hashed)),
        bytes: hashed.len(),
        log,
        note: None,
        data,
    })
}

/// # Safety
/// `prog` must be a live program.
unsafe fn program_log(prog: cudarc::nvrtc::sys::nvrtcProgram) -> String {
    use cudarc::nvrtc::sys;
    let mut size = 0usize;
    if unsafe { sys::nvrtcGetProgramLogSize(prog, &mut size) } != sys::nvrtcResult::NVRTC_SUCCESS
        || size == 0
    {
        return String::new();
    }
    let mut buf = vec![0u8; size];
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
) -> Result<Vec<u8>, String> {
    use cudarc::nvrtc::sys;
    let mut size = 0usize;
    let cubin = target.kind == "cubin";
    let r = if cubin {
        unsafe { sys::nvrtcGetCUBINSize(prog, &mut size) }
    } else {
        unsafe { sys::nvrtcGetPTXSize(prog, &mut size) }
    };
    if r != sys::nvrtcResult::NVRTC_SUCCESS {
        return Err(nvrtc_err("image size query", r));
    }
    let mut data = vec![0u8; size];
    let r = if cubin {
        unsafe { sys::nvrtcGetCUBIN(prog, data.as_mut_ptr().cast()) }
    } else {
        unsafe { sys::nvrtcGetPTX(prog, data.as_mut_ptr().cast()) }
    };
    if r != sys::nvrtcResult::NVRTC_SUCCESS {
        return Err(nvrtc_err("image fetch", r));
    }
    if data.is_empty() {
        return Err("NVRTC returned an empty image".into());
    }
    Ok(data)
}

/// A program image loaded into a device's primary context.
pub struct LoadedProgram {
    pub image: Image,
    functions: HashMap<&'static str, CudaFunction>,
    /// Keeps the module (and through it the context) alive.
    _module: Arc<CudaModule>,
}

impl LoadedProgram {
    pub fn function(&self, name: &'static str) -> Result<&CudaFunction, String> {
        self.functions
            .get(name)
            .ok_or_else(|| format!("kernel `{name}` missing from {}", self.image.program))
    }
}

fn load(
    ctx: &Arc<CudaContext>,
    image: Image,
    entries: &[&'static str],
) -> Result<LoadedProgram, String> {
    let ptx = if image.target.kind == "cubin" {
        cudarc::nvrtc::Ptx::from_binary(image.data.clone())
    } else {
        let text = image.data.strip_suffix(&[0]).unwrap_or(&image.data);
        let text = String::from_utf8(text.to_vec()).map_err(|_| "PTX is not UTF-8".to_string())?;
        cudarc::nvrtc::Ptx::from_src(text)
    };
    let module = ctx.load_module(ptx).map_err(|e| {
        format!(
            "the driver could not load the {} {} image for arch {}: {}",
            image.program,
            image.target.kind,
            image.target.arch,
            super::driver_error_text(e)
        )
    })?;
    let mut functions = HashMap::new();
    for &name in entries {
        let f = module
            .load_function(name)
            .map_err(|e| format!("kernel `{name}`: {}", super::driver_error_text(e)))?;
        functions.insert(name, f);
    }
    Ok(LoadedProgram {
        image,
        functions,
        _module: module,
    })
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct CacheKey {
    ordinal: usize,
    program: &'static str,
    fmad: bool,
    ftz: bool,
    target: ResolvedTarget,
    /// The caller named the target (no fallback allowed).
    explicit: bool,
}

type Cache = Mutex<HashMap<CacheKey, Arc<LoadedProgram>>>;

fn cache() -> &'static Cache {
    static CACHE: OnceLock<Cache> = OnceLock::new();
    CACHE.get_or_init(|| Mutex::new(HashMap::new()))
}

/// How many NVRTC compilations this process ran (tests check the cache).
pub fn compile_count() -> usize {
    COMPILES.load(std::sync::atomic::Ordering::Relaxed)
}
static COMPILES: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

fn cached(
    ctx: &Arc<CudaContext>,
    key: CacheKey,
    src: &str,
    entries: &[&'static str],
) -> Result<Arc<LoadedProgram>, String> {
    let mut map = cache()
        .lock()
        .map_err(|_| "kernel cache lock poisoned".to_string())?;
    if let Some(p) = map.get(&key) {
        return Ok(p.clone());
    }
    let image = build_image(key, src)?;
    COMPILES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let loaded = Arc::new(load(ctx, image, entries)?);
    map.insert(key, loaded.clone());
    Ok(loaded)
}

/// Compile for `key`, checking that non-default flags really reach a CUBIN.
///
/// Seen with NVRTC 13.0: `--ftz=true` changes the PTX but the CUBIN comes
/// out byte-identical to the `--ftz=false` one. A report must not claim a
/// flag the code does not carry, so when a non-default option set yields
/// the default CUBIN while its PTX differs, an `Auto` target falls back to
/// that PTX (the driver compiles it) and says so; an explicit CUBIN target
/// is refused.
fn build_image(key: CacheKey, src: &str) -> Result<Image, String> {
    let options = option_list(key.fmad, key.ftz, key.target);
    let mut image = nvrtc_compile(key.program, src, &options, key.target)?;
    let pinned = !key.fmad && !key.ftz;
    if pinned || key.target.kind != "cubin" {
        return Ok(image);
    }
    let default_opts = option_list(false, false, key.target);
    let default_cubin = nvrtc_compile(key.program, src, &default_opts, key.target)?;
    if default_cubin.sha256 != image.sha256 {
        return Ok(image);
    }
    let ptx_target = ResolvedTarget {
        kind: "ptx",
        arch: key.target.arch,
    };
    let ptx = nvrtc_compile(
        key.program,
        src,
        &option_list(key.fmad, key.ftz, ptx_target),
        ptx_target,
    )?;
    let ptx_default = nvrtc_compile(
        key.program,
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
    if key.explicit {
        return Err(format!(
            "{what}; choose a PTX target (e.g. compute_{}) for these options",
            key.target.arch
        ));
    }
    let mut ptx = ptx;
    ptx.note = Some(format!(
        "{what}; using PTX for compute_{} so the flags take effect",
        key.target.arch
    ));
    Ok(ptx)
}

/// The fold program for one device and option set (compiled once per process).
pub fn fold_program(
    ctx: &Arc<CudaContext>,
    opts: CompileOptions,
    target: ResolvedTarget,
) -> Result<Arc<LoadedProgram>, String> {
    let key = CacheKey {
        ordinal: ctx.ordinal(),
        program: "foldprint_fold",
        fmad: opts.fmad,
        ftz: opts.ftz,
        target,
        explicit: opts.target != Target::Auto,
    };
    cached(ctx, key, FOLD_SRC, &FOLD_ENTRIES)
}

/// The generator program (always the pinned options).
pub fn generator_program(
    ctx: &Arc<CudaContext>,
    target: ResolvedTarget,
) -> Result<Arc<LoadedProgram>, String> {
    let key = CacheKey {
        ordinal: ctx.ordinal(),
        program: "foldprint_generate",
        fmad: false,
        ftz: false,
        target,
        explicit: false,
    };
    cached(ctx, key, GENERATOR_SRC, &["fp_generate"])
}

/// The rank-copy check (integer code, pinned options, the device's target).
pub fn rank_check_program(
    ctx: &Arc<CudaContext>,
    target: ResolvedTarget,
) -> Result<Arc<LoadedProgram>, String> {
    let key = CacheKey {
        ordinal: ctx.ordinal(),
        program: "foldprint_rank_check",
        fmad: false,
        ftz: false,
        target,
        explicit: false,
    };
    cached(ctx, key, RANK_CHECK_SRC, &["fp_rank_diff"])
}

/// CUDA C of the rank-copy check.
pub const RANK_CHECK_SRC: &str = include_str!("rank_check.cu");

/// The fold kernels of one loaded program.
#[derive(Clone)]
pub struct FoldKernels {
    pub program: Arc<LoadedProgram>,
}

impl FoldKernels {
    pub fn function(
        &self,
        mode: FoldMode,
        variant: KernelVariant,
    ) -> Result<&CudaFunction, String> {
        self.program.function(entry_name(mode, variant))
    }
}

/// Postfix program of `fold::fold_pairwise` over slots `0..k`: first half
/// `ceil(k/2)`, then the rest, then add.
pub fn tree_program(k: usize) -> Vec<u32> {
    fn emit(lo: usize, k: usize, out: &mut Vec<u32>) {
        if k == 1 {
            out.push(lo as u32);
        } else {
            let mid = k.div_ceil(2);
            emit(lo, mid, out);
            emit(lo + mid, k - mid, out);
            out.push(TREE_ADD);
        }
    }
    let mut out = Vec::with_capacity(2 * k);
    if k > 0 {
        emit(0, k, &mut out);
    }
    out
}

/// Deepest stack a postfix program reaches.
pub fn program_depth(prog: &[u32]) -> usize {
    let (mut depth, mut max) = (0usize, 0usize);
    for &op in prog {
        if op == TREE_ADD {
            depth = depth.saturating_sub(1);
        } else {
            depth += 1;
            max = max.max(depth);
        }
    }
    max
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fold::fold_pairwise;

    /// Evaluate a postfix program on the host the way the kernel does.
    fn run_program(prog: &[u32], slots: &[f32]) -> f32 {
        let mut st = Vec::new();
        for &op in prog {
            if op == TREE_ADD {
                let r: f32 = st.pop().unwrap();
                let l: f32 = st.pop().unwrap();
                st.push(l + r);
            } else {
                st.push(slots[op as usize]);
            }
        }
        st[0]
    }

    #[test]
    fn tree_program_matches_fold_pairwise() {
        for k in 1..=70usize {
            let slots: Vec<f32> = (0..k)
                .map(|i| {
                    crate::data::value(crate::data::Distribution::MixedMagnitude, 3, i as u32, 0, 7)
                })
                .collect();
            let prog = tree_program(k);
            assert_eq!(prog.len(), 2 * k - 1);
            assert_eq!(
                run_program(&prog, &slots).to_bits(),
                fold_pairwise(&slots).to_bits(),
                "k={k}"
            );
        }
        // W up to the schema's cap fits the device stack.
        assert!(program_depth(&tree_program(65_536)) <= TREE_STACK);
    }

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
        assert!(e.contains("cannot load"), "{e}");
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
