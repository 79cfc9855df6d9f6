//! Loaded programs: an image loaded into a device's primary context, its
//! kernels looked up once, and a per-process cache so that each program and
//! option set is built and loaded once per device. A build takes the image
//! from the on-disk cache ([`super::disk_cache`]) when allowed and present,
//! else compiles it with NVRTC (and stores it there).

use super::compile::{build_image, BuildRequest};
use super::disk_cache::{self, DiskCache, KeyParts, Lookup};
use super::nvrtc::Image;
use super::source::{
    fold_entries, fold_entry, FoldMode, KernelVariant, CHUNK_SHA_ENTRY, FOLD_PROGRAM, FOLD_SRC,
    GENERATE_ENTRY, GENERATOR_PROGRAM, GENERATOR_SRC, NAN_CHUNKS_ENTRY, RANK_CHECK_PROGRAM,
    RANK_CHECK_SRC, RANK_DIFF_ENTRY,
};
use super::target::{option_list, CompileOptions, ResolvedTarget, Target};
use cudarc::driver::{CudaContext, CudaFunction, CudaModule};
use serde::Serialize;
use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Instant;

/// Where a loaded module's image came from, and what it cost (the report's
/// `kernel_cache` entry of each program).
#[derive(Debug, Clone, Serialize)]
pub struct ModuleOrigin {
    pub program: &'static str,
    /// The image was read from the on-disk cache (no NVRTC compile).
    pub from_cache: bool,
    /// The cache key (SHA-256 of program, source, NVRTC library SHA-256,
    /// options, target); `None` when the cache was not used.
    pub key: Option<String>,
    /// The cache entry read or written.
    pub entry: Option<String>,
    /// Why the cache was not used, or what went wrong with it.
    pub note: Option<String>,
    /// NVRTC time (0 for a cache hit).
    pub compile_ms: f64,
    /// Hashing inputs and reading/checking the entry.
    pub cache_ms: f64,
    /// The driver loading the image (and JIT-compiling PTX).
    pub load_ms: f64,
}

/// A program image loaded into a device's primary context.
pub struct LoadedProgram {
    pub image: Image,
    pub origin: ModuleOrigin,
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
    mut origin: ModuleOrigin,
    entries: &[&'static str],
) -> Result<LoadedProgram, String> {
    let started = Instant::now();
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
    origin.load_ms = ms(started);
    Ok(LoadedProgram {
        image,
        origin,
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

/// How many programs this process built, compiled or read from the disk
/// cache (tests check the per-process cache).
pub fn compile_count() -> usize {
    COMPILES.load(Ordering::Relaxed)
}
static COMPILES: AtomicUsize = AtomicUsize::new(0);

fn ms(since: Instant) -> f64 {
    since.elapsed().as_secs_f64() * 1e3
}

/// The SHA-256 of the NVRTC library file this process mapped, for the
/// cache key. Only asked when the disk cache is in use, so it may come from
/// the file-hash memo beside the cache (a ~100 MB file is not read on every
/// warm start). With `--no-kernel-cache` (and in every audit child) nothing
/// asks, and the report's library list hashes the files afresh, so the
/// library-version audit never rests on a remembered hash.
fn nvrtc_library_sha256(cache: &DiskCache) -> Result<String, String> {
    let lib = super::super::probe::nvrtc_library();
    let path = lib
        .path
        .ok_or("the NVRTC library's file is unknown (not in /proc/self/maps)")?;
    super::super::mapped::file_sha256(&path, Some(&cache.file_memo()))
        .0
        .ok_or_else(|| format!("cannot read {path} to hash it"))
}

/// Whether and where a build may use the on-disk cache.
#[derive(Debug, Clone)]
pub enum CacheChoice {
    /// `--no-kernel-cache` (and audit children): compile fresh.
    Off,
    At(DiskCache),
    /// Wanted, but there is no cache directory.
    Unusable(String),
}

impl CacheChoice {
    /// The default directory when `use_disk`, else `Off`.
    pub fn from_env(use_disk: bool) -> Self {
        if !use_disk {
            return CacheChoice::Off;
        }
        match disk_cache::default_dir() {
            Some(dir) => CacheChoice::At(DiskCache::at(dir)),
            None => {
                CacheChoice::Unusable("no cache directory (neither XDG_CACHE_HOME nor HOME)".into())
            }
        }
    }
}

/// The image for `request`: from the disk cache when allowed and intact,
/// else from NVRTC (then stored). Cache trouble never fails a build: it is
/// recorded in the origin's note and the image is compiled. Host-only.
pub fn image_for(
    request: BuildRequest,
    src: &str,
    choice: CacheChoice,
) -> Result<(Image, ModuleOrigin), String> {
    let mut origin = ModuleOrigin {
        program: request.program,
        from_cache: false,
        key: None,
        entry: None,
        note: None,
        compile_ms: 0.0,
        cache_ms: 0.0,
        load_ms: 0.0,
    };
    let started = Instant::now();
    let found = match choice {
        CacheChoice::Off => {
            origin.note = Some("kernel cache off: compiled fresh".into());
            None
        }
        CacheChoice::Unusable(why) => {
            origin.note = Some(format!("kernel cache unusable: {why}"));
            None
        }
        CacheChoice::At(c) => match nvrtc_library_sha256(&c) {
            Ok(sha) => Some((c, sha)),
            Err(why) => {
                origin.note = Some(format!("kernel cache unusable: {why}"));
                None
            }
        },
    };
    let mut cache = None;
    if let Some((c, nvrtc_sha256)) = found {
        let options = option_list(request.fmad, request.ftz, request.target);
        let key = disk_cache::key(&KeyParts {
            program: request.program,
            source: src,
            nvrtc_sha256: &nvrtc_sha256,
            options: &options,
            target: request.target,
            explicit: request.explicit,
        });
        origin.entry = Some(c.entry_path(&key).display().to_string());
        origin.key = Some(key.clone());
        match c.get(&key, request.program) {
            Lookup::Hit(image) => {
                origin.from_cache = true;
                origin.cache_ms = ms(started);
                return Ok((image, origin));
            }
            Lookup::Miss => {}
            Lookup::Corrupt(why) => {
                origin.note = Some(format!("untrusted entry compiled again ({why})"));
            }
        }
        cache = Some((c, key));
    }
    origin.cache_ms = ms(started);
    let compiled = Instant::now();
    let image = build_image(request, src)?;
    origin.compile_ms = ms(compiled);
    if let Some((c, key)) = cache {
        if let Err(e) = c.put(&key, &image) {
            let before = origin
                .note
                .take()
                .map(|n| format!("{n}; "))
                .unwrap_or_default();
            origin.note = Some(format!("{before}not stored: {e}"));
            origin.entry = None;
        }
    }
    Ok((image, origin))
}

fn cached(
    ctx: &Arc<CudaContext>,
    request: BuildRequest,
    use_disk: bool,
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
    let (image, origin) = image_for(request, src, CacheChoice::from_env(use_disk))?;
    COMPILES.fetch_add(1, Ordering::Relaxed);
    let loaded = Arc::new(load(ctx, image, origin, entries)?);
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
    cached(ctx, request, opts.disk_cache, &FOLD_SRC, &fold_entries())
}

/// A program of integer code, always built with the pinned options for the
/// device's own target (`use_disk`: the disk cache may be used).
fn pinned_program(
    ctx: &Arc<CudaContext>,
    program: &'static str,
    src: &str,
    entries: &[&'static str],
    target: ResolvedTarget,
    use_disk: bool,
) -> Result<Arc<LoadedProgram>, String> {
    let request = BuildRequest {
        program,
        fmad: false,
        ftz: false,
        target,
        explicit: false,
    };
    cached(ctx, request, use_disk, src, entries)
}

/// The generator program.
pub fn generator_program(
    ctx: &Arc<CudaContext>,
    target: ResolvedTarget,
    use_disk: bool,
) -> Result<Arc<LoadedProgram>, String> {
    let entries = [GENERATE_ENTRY];
    pinned_program(
        ctx,
        GENERATOR_PROGRAM,
        &GENERATOR_SRC,
        &entries,
        target,
        use_disk,
    )
}

/// The checks of reduced arenas: rank-copy comparison, chunk digests.
pub fn rank_check_program(
    ctx: &Arc<CudaContext>,
    target: ResolvedTarget,
    use_disk: bool,
) -> Result<Arc<LoadedProgram>, String> {
    let entries = [RANK_DIFF_ENTRY, CHUNK_SHA_ENTRY, NAN_CHUNKS_ENTRY];
    pinned_program(
        ctx,
        RANK_CHECK_PROGRAM,
        &RANK_CHECK_SRC,
        &entries,
        target,
        use_disk,
    )
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
