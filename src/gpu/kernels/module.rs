//! Loaded programs: an image loaded into a device's primary context, its
//! kernels looked up once, and a per-process cache so that each program and
//! option set is built and loaded once per device. A build takes the image
//! from the on-disk cache ([`super::disk_cache`]) when allowed and present,
//! else compiles it with NVRTC (and stores it there).

use super::compile::{build_image, BuildRequest};
use super::disk_cache::{self, DiskCache, KeyParts, Lookup};
use super::nvrtc::Image;
use super::source::{
    fold16_trial_entries, fold_entries, fold_entry, fold_entry16, FoldMode, KernelVariant,
    FOLD16_TRIALS_PROGRAM, FOLD16_TRIALS_SRC, FOLD_PROGRAM, FOLD_SRC, GENERATOR_ENTRIES,
    GENERATOR_PROGRAM, GENERATOR_SRC, RANK_CHECK_ENTRIES, RANK_CHECK_PROGRAM, RANK_CHECK_SRC,
};
use super::target::{option_list, CompileOptions, ResolvedTarget, Target};
use crate::gpu::error::GpuError;
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
    pub fn function(&self, name: &'static str) -> Result<&CudaFunction, GpuError> {
        self.functions.get(name).ok_or_else(|| {
            GpuError::bounds(format!(
                "kernel `{name}` missing from {}",
                self.image.program
            ))
        })
    }
}

fn load(
    ctx: &Arc<CudaContext>,
    image: Image,
    mut origin: ModuleOrigin,
    entries: &[&'static str],
) -> Result<LoadedProgram, GpuError> {
    let started = Instant::now();
    let ptx = if image.target.kind == "cubin" {
        cudarc::nvrtc::Ptx::from_binary(image.data.clone())
    } else {
        let text = image.data.strip_suffix(&[0]).unwrap_or(&image.data);
        let text = String::from_utf8(text.to_vec())
            .map_err(|_| GpuError::bounds(format!("{}: PTX is not UTF-8", image.program)))?;
        cudarc::nvrtc::Ptx::from_src(text)
    };
    let module = ctx.load_module(ptx).map_err(|e| {
        GpuError::driver(
            format!(
                "the driver could not load the {} {} image for arch {}",
                image.program, image.target.kind, image.target.arch,
            ),
            e,
        )
    })?;
    let mut functions = HashMap::new();
    for &name in entries {
        let f = module
            .load_function(name)
            .map_err(|e| GpuError::driver(format!("kernel `{name}`"), e))?;
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

/// One program of one device in this process: empty until it is loaded.
/// Whoever builds it holds the slot's lock from before the image is made
/// until the module is loaded, so a second open of the same program waits
/// and then takes it instead of building it again.
type Slot = Arc<Mutex<Option<Arc<LoadedProgram>>>>;
type Cache = Mutex<HashMap<CacheKey, Slot>>;

fn cache() -> &'static Cache {
    static CACHE: OnceLock<Cache> = OnceLock::new();
    CACHE.get_or_init(|| Mutex::new(HashMap::new()))
}

fn slot(key: CacheKey) -> Result<Slot, GpuError> {
    let mut map = cache()
        .lock()
        .map_err(|_| GpuError::panicked("a holder of the kernel cache lock", None))?;
    Ok(map.entry(key).or_default().clone())
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
fn nvrtc_library_sha256(cache: &DiskCache) -> Result<crate::digest::Sha256, GpuError> {
    let lib = super::super::probe::nvrtc_library();
    let path = lib.path.ok_or_else(|| {
        GpuError::missing("the NVRTC library's file is unknown (not in /proc/self/maps)")
    })?;
    super::super::mapped::file_sha256(&path, Some(&cache.file_memo()))
        .0
        .ok_or_else(|| GpuError::missing(format!("cannot read {path} to hash it")))
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
) -> Result<(Image, ModuleOrigin), GpuError> {
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
            nvrtc_sha256,
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

/// One program a device needs: what to build, from which source, and the
/// kernels to look up in it.
#[derive(Debug, Clone)]
pub struct ProgramSpec {
    pub request: BuildRequest,
    /// The on-disk cache may be used.
    pub use_disk: bool,
    pub src: &'static str,
    pub entries: Vec<&'static str>,
}

impl ProgramSpec {
    /// The fold program for one option set.
    pub fn fold(opts: CompileOptions, target: ResolvedTarget) -> Self {
        ProgramSpec {
            request: BuildRequest {
                program: FOLD_PROGRAM,
                fmad: opts.fmad,
                ftz: opts.ftz,
                target,
                explicit: opts.target != Target::Auto,
            },
            use_disk: opts.disk_cache,
            src: &FOLD_SRC,
            entries: fold_entries(),
        }
    }

    /// The 16-bit fold trials (`fold16_trials.cu`), with the fold's options.
    pub fn fold16_trials(opts: CompileOptions, target: ResolvedTarget) -> Self {
        let fold = Self::fold(opts, target);
        ProgramSpec {
            request: BuildRequest {
                program: FOLD16_TRIALS_PROGRAM,
                ..fold.request
            },
            src: &FOLD16_TRIALS_SRC,
            entries: fold16_trial_entries(),
            ..fold
        }
    }

    /// The generator: integer code, always built with the pinned options
    /// for the device's own target.
    pub fn generator(target: ResolvedTarget, use_disk: bool) -> Self {
        Self::pinned(
            GENERATOR_PROGRAM,
            &GENERATOR_SRC,
            GENERATOR_ENTRIES.to_vec(),
            target,
            use_disk,
        )
    }

    /// The checks of reduced arenas: rank-copy comparison, chunk digests
    /// (integer code, pinned options, the device's own target).
    pub fn rank_check(target: ResolvedTarget, use_disk: bool) -> Self {
        Self::pinned(
            RANK_CHECK_PROGRAM,
            &RANK_CHECK_SRC,
            RANK_CHECK_ENTRIES.to_vec(),
            target,
            use_disk,
        )
    }

    fn pinned(
        program: &'static str,
        src: &'static str,
        entries: Vec<&'static str>,
        target: ResolvedTarget,
        use_disk: bool,
    ) -> Self {
        ProgramSpec {
            request: BuildRequest {
                program,
                fmad: false,
                ftz: false,
                target,
                explicit: false,
            },
            use_disk,
            src,
            entries,
        }
    }

    /// The image, from the disk cache or NVRTC ([`image_for`]). Host-only:
    /// needs no context.
    pub fn image(&self) -> Result<(Image, ModuleOrigin), GpuError> {
        let built = image_for(self.request, self.src, CacheChoice::from_env(self.use_disk))?;
        COMPILES.fetch_add(1, Ordering::Relaxed);
        Ok(built)
    }
}

/// The images of `specs`, one after another on the calling thread (which
/// runs beside the context's). Not one thread per program: on the H200 host
/// three NVRTC compiles side by side took 77-220 ms of wall time where one
/// after another took about 51 ms (docs/BENCHMARKS.md).
pub fn images(specs: &[&ProgramSpec]) -> Vec<Result<(Image, ModuleOrigin), GpuError>> {
    specs.iter().map(|s| s.image()).collect()
}

/// Wall times of [`open_with_programs`], in ms.
#[derive(Debug, Clone, Copy, Default)]
pub struct OpenTimes {
    /// Creating the context, on its own thread.
    pub context: f64,
    /// Producing the images not yet loaded in this process (all threads).
    pub images: f64,
    /// Context and images side by side, until both were done.
    pub overlapped: f64,
    /// Loading the new images into the context.
    pub load: f64,
    /// Sums over the programs built by this open (none for a program this
    /// process had already loaded): NVRTC, disk-cache work, module loads.
    pub nvrtc_compile: f64,
    pub kernel_cache: f64,
    pub module_load: f64,
}

/// Open a context with `open_context` (on its own thread) while the images
/// of `specs` that this process has not loaded yet for device `ordinal` are
/// produced, then load them into it. Returns the context, one program per
/// spec (in order), and the wall times.
///
/// Each program is built at most once per process and device: its slot in
/// the per-process cache stays locked from before its image is made until
/// it is loaded. Slots are locked in one global order, and `open_context`
/// takes none, so two opens cannot wait on each other.
pub fn open_with_programs<C: Send>(
    ordinal: usize,
    specs: &[ProgramSpec],
    open_context: impl FnOnce() -> Result<C, GpuError> + Send,
    load_into: impl Fn(&C, Image, ModuleOrigin, &[&'static str]) -> Result<LoadedProgram, GpuError>,
) -> Result<(C, Vec<Arc<LoadedProgram>>, OpenTimes), GpuError> {
    let keys: Vec<CacheKey> = specs
        .iter()
        .map(|s| CacheKey {
            ordinal,
            request: s.request,
        })
        .collect();
    // Distinct keys, in one order for every caller.
    let mut order: Vec<usize> = (0..keys.len()).collect();
    order.sort_by_key(|&i| format!("{:?}", keys[i]));
    order.dedup_by_key(|i| keys[*i]);
    let slots: Vec<Slot> = order
        .iter()
        .map(|&i| slot(keys[i]))
        .collect::<Result<_, _>>()?;
    let mut guards = slots
        .iter()
        .map(|s| s.lock())
        .collect::<Result<Vec<_>, _>>()
        .map_err(|_| GpuError::panicked("a holder of the kernel cache lock", None))?;
    let todo: Vec<usize> = (0..order.len()).filter(|&k| guards[k].is_none()).collect();
    let todo_specs: Vec<&ProgramSpec> = todo.iter().map(|&k| &specs[order[k]]).collect();
    let side =
        super::super::overlap::side_by_side("creating the CUDA context", open_context, || {
            if todo_specs.is_empty() {
                Vec::new()
            } else {
                images(&todo_specs)
            }
        });
    // The context's error first: it is what a missing or broken device says.
    let ctx = side.a?;
    let built = side.b.into_iter().collect::<Result<Vec<_>, _>>()?;
    let loading = Instant::now();
    let mut times = OpenTimes::default();
    for (&k, (image, origin)) in todo.iter().zip(built) {
        let spec = &specs[order[k]];
        let loaded = load_into(&ctx, image, origin, &spec.entries)?;
        times.nvrtc_compile += loaded.origin.compile_ms;
        times.kernel_cache += loaded.origin.cache_ms;
        times.module_load += loaded.origin.load_ms;
        *guards[k] = Some(Arc::new(loaded));
    }
    times.context = side.a_ms;
    times.images = if todo.is_empty() { 0.0 } else { side.b_ms };
    times.overlapped = side.both_ms;
    times.load = ms(loading);
    let programs = keys
        .iter()
        .map(|key| {
            let k = order
                .iter()
                .position(|&i| keys[i] == *key)
                .expect("every key has a slot");
            guards[k]
                .clone()
                .ok_or_else(|| GpuError::bounds("kernel cache slot left empty"))
        })
        .collect::<Result<Vec<_>, _>>()?;
    drop(guards);
    Ok((ctx, programs, times))
}

/// Load `image` into the context `ctx` (the `load_into` of a real device).
pub fn load_into_context(
    ctx: &Arc<CudaContext>,
    image: Image,
    origin: ModuleOrigin,
    entries: &[&'static str],
) -> Result<LoadedProgram, GpuError> {
    load(ctx, image, origin, entries)
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
    ) -> Result<&CudaFunction, GpuError> {
        self.program.function(fold_entry(mode, variant))
    }

    /// The 16-bit fold of a mode and variant.
    pub fn function16(
        &self,
        mode: FoldMode,
        variant: KernelVariant,
    ) -> Result<&CudaFunction, GpuError> {
        self.program.function(fold_entry16(mode, variant))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A program NVRTC refuses (or cannot be asked about, where there is no
    /// NVRTC): its image is an error either way.
    fn broken(name: &'static str) -> ProgramSpec {
        ProgramSpec {
            request: BuildRequest {
                program: name,
                fmad: false,
                ftz: false,
                target: ResolvedTarget {
                    kind: "ptx",
                    arch: 90,
                },
                explicit: false,
            },
            use_disk: false,
            src: "this is not CUDA C++ {",
            entries: vec![],
        }
    }

    fn no_load(
        _: &(),
        _: Image,
        _: ModuleOrigin,
        _: &[&'static str],
    ) -> Result<LoadedProgram, GpuError> {
        Err(GpuError::missing("nothing to load into without a device"))
    }

    #[test]
    fn a_failed_context_is_the_error_even_when_a_build_fails_too() {
        let specs = [broken("foldprint_test_a")];
        let r = open_with_programs(
            usize::MAX,
            &specs,
            || -> Result<(), GpuError> {
                Err(GpuError::missing(
                    "cannot open CUDA device 7: no such device",
                ))
            },
            no_load,
        );
        assert_eq!(
            r.err().map(|e| e.to_string()).as_deref(),
            Some("cannot open CUDA device 7: no such device")
        );
    }

    #[test]
    fn a_failed_build_is_the_error_when_the_context_opens() {
        let spec = broken("foldprint_test_b");
        // What the same build says on its own, run on this thread.
        let alone = spec
            .image()
            .expect_err("the broken program has no image")
            .to_string();
        // Twice the same program in one open: one slot, locked once (a
        // second lock of it would never return).
        let specs = [spec.clone(), spec];
        let r = open_with_programs(usize::MAX - 1, &specs, || Ok(()), no_load);
        assert_eq!(r.err().map(|e| e.to_string()), Some(alone.clone()));
        // The slot stays empty after the failure: the next open tries again
        // and fails the same way (a filled slot would give Ok here).
        let again = open_with_programs(usize::MAX - 1, &specs[..1], || Ok(()), no_load);
        assert_eq!(again.err().map(|e| e.to_string()), Some(alone));
    }
}
