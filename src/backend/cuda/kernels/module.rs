//! Loaded programs: an image loaded into a device's primary context, its
//! kernels looked up once, and a per-process cache so that each program and
//! option set is compiled and loaded once per device.

use super::compile::{build_image, BuildRequest};
use super::nvrtc::Image;
use super::source::{
    fold_entries, fold_entry, FoldMode, KernelVariant, FOLD_PROGRAM, FOLD_SRC, GENERATE_ENTRY,
    GENERATOR_PROGRAM, GENERATOR_SRC,
};
use super::target::{CompileOptions, ResolvedTarget, Target};
use cudarc::driver::{CudaContext, CudaFunction, CudaModule};
use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

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
            super::super::driver_error_text(e)
        )
    })?;
    let mut functions = HashMap::new();
    for &name in entries {
        let f = module
            .load_function(name)
            .map_err(|e| format!("kernel `{name}`: {}", super::super::driver_error_text(e)))?;
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
    request: BuildRequest,
}

type Cache = Mutex<HashMap<CacheKey, Arc<LoadedProgram>>>;

fn cache() -> &'static Cache {
    static CACHE: OnceLock<Cache> = OnceLock::new();
    CACHE.get_or_init(|| Mutex::new(HashMap::new()))
}

/// How many NVRTC compilations this process ran (tests check the cache).
pub fn compile_count() -> usize {
    COMPILES.load(Ordering::Relaxed)
}
static COMPILES: AtomicUsize = AtomicUsize::new(0);

fn cached(
    ctx: &Arc<CudaContext>,
    request: BuildRequest,
    src: &str,
    entries: &[&'static str],
) -> Result<Arc<LoadedProgram>, String> {
    let key = CacheKey {
        ordinal: ctx.ordinal(),
        request,
    };
    let mut map = cache()
        .lock()
        .map_err(|_| "kernel cache lock poisoned".to_string())?;
    if let Some(p) = map.get(&key) {
        return Ok(p.clone());
    }
    let image = build_image(request, src)?;
    COMPILES.fetch_add(1, Ordering::Relaxed);
    let loaded = Arc::new(load(ctx, image, entries)?);
    map.insert(key, loaded.clone());
    Ok(loaded)
}

/// The fold program for one device and option set (compiled once per process).
pub fn fold_program(
    ctx: &Arc<CudaContext>,
    opts: CompileOptions,
    target: ResolvedTarget,
) -> Result<Arc<LoadedProgram>, String> {
    let request = BuildRequest {
        program: FOLD_PROGRAM,
        fmad: opts.fmad,
        ftz: opts.ftz,
        target,
        explicit: opts.target != Target::Auto,
    };
    cached(ctx, request, &FOLD_SRC, &fold_entries())
}

/// The generator program (always the pinned options).
pub fn generator_program(
    ctx: &Arc<CudaContext>,
    target: ResolvedTarget,
) -> Result<Arc<LoadedProgram>, String> {
    let request = BuildRequest {
        program: GENERATOR_PROGRAM,
        fmad: false,
        ftz: false,
        target,
        explicit: false,
    };
    cached(ctx, request, &GENERATOR_SRC, &[GENERATE_ENTRY])
}

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
        self.program.function(fold_entry(mode, variant))
    }
}
