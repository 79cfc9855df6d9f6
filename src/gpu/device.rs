//! One opened GPU: its primary context, what it is, and the compiled
//! generator and fold programs, plus the two launch helpers.

use super::error::GpuError;
use super::kernels::{
    self, CompileOptions, FoldKernels, FoldMode, KernelVariant, LoadedProgram, ProgramSpec,
    ResolvedTarget,
};
use super::mem::{ArenaElem, DeviceView};
use super::probe::{self, DeviceProbe};
use crate::dtype::Dtype;
use cudarc::driver::{
    self, sys, CudaContext, CudaFunction, CudaStream, LaunchConfig, PushKernelArg,
};
use serde::Serialize;
use std::sync::Arc;
use std::time::Instant;

/// Where a backend's start went, in milliseconds (the report's
/// `startup_ms`; `bench` prints it).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Default)]
pub struct Startup {
    /// The library and device probe before the device is opened (driver
    /// init, `cuInit`); set by the backend that probed.
    pub probe: f64,
    /// The device's primary context: its own wall time, on the thread
    /// that created it while the images were made (see `overlapped`).
    pub context: f64,
    /// Library check, device facts, driver and NVRTC versions, target
    /// choice (before the context: they need only `cuInit`).
    pub queries: f64,
    /// The programs: `images` plus the module loads after the context.
    pub programs: f64,
    /// Of `programs`, summed over the programs (each is compiled on its
    /// own thread, so this may exceed `images`): NVRTC compile time (0
    /// when all came from the cache).
    pub nvrtc_compile: f64,
    /// Of `programs`, summed over the programs: hashing the cache inputs
    /// and reading entries.
    pub kernel_cache: f64,
    /// Of `programs`: the driver loading the images.
    pub module_load: f64,
    /// Wall time of making the images not yet loaded in this process (disk
    /// cache or NVRTC, concurrently), alongside the context; 0 when this
    /// process had them all.
    pub images: f64,
    /// Wall time of the context and the images side by side: what the
    /// start paid for both. `context + images - overlapped` was hidden.
    pub overlapped: f64,
}

/// Launch shapes. Bits do not depend on them (tests vary them). One `fast`
/// shape for every W: with the chains' batched loads, 256 threads x 64
/// blocks/SM measured within 1.4% of the best of 12 shapes, and above the
/// copy baseline, at every W from 8 to 128 on an H200 (docs/BENCHMARKS.md).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct LaunchTuning {
    /// Threads per block of the `seed` fold (one thread per element).
    pub seed_block: u32,
    /// Threads per block of the `fast` fold.
    pub fast_block: u32,
    /// Grid cap of the `fast` fold, in blocks per SM (grid-stride beyond).
    pub fast_blocks_per_sm: u32,
}

impl Default for LaunchTuning {
    fn default() -> Self {
        LaunchTuning {
            seed_block: 256,
            fast_block: 256,
            fast_blocks_per_sm: 64,
        }
    }
}

/// Arguments of one fold launch (device addresses).
#[derive(Debug, Clone, Copy)]
pub struct FoldArgs {
    pub out: sys::CUdeviceptr,
    /// Row 0, element 0 of the stacked slots; same 16-byte phase as `out`.
    pub stacked: sys::CUdeviceptr,
    /// Row stride in elements; a multiple of 4.
    pub ld: u64,
    pub len: u64,
    pub world: u32,
    /// Order (arrival) or postfix program (tree); 0 for fixed order.
    pub prog: sys::CUdeviceptr,
    pub prog_len: u32,
    pub scale: Option<f32>,
    /// What `out` and the rows hold: float32, or a 16-bit dtype's bits.
    pub dtype: Dtype,
}

/// Row stride for shards of up to `max_shard` elements placed at a phase
/// of up to 3 elements: a multiple of 32 elements, so every row starts on
/// a 128-byte line (a stride of n+4 costs an extra sector per warp load).
pub fn row_stride(max_shard: usize) -> usize {
    (max_shard + 3).div_ceil(32) * 32
}

/// [`row_stride`] for an arena of `dtype`: 16-bit rows are placed at a
/// phase of up to 7 elements and start on 128-byte lines (64 elements).
pub fn row_stride_of(max_shard: usize, dtype: Dtype) -> usize {
    if dtype.is_f32() {
        row_stride(max_shard)
    } else {
        (max_shard + 7).div_ceil(64) * 64
    }
}

pub struct Device {
    pub ctx: Arc<CudaContext>,
    pub info: DeviceProbe,
    pub uuid: String,
    pub driver_version: i32,
    pub nvrtc_version: (i32, i32),
    pub nvrtc_archs: Vec<i32>,
    pub options: CompileOptions,
    pub fold_target: ResolvedTarget,
    pub fold: FoldKernels,
    pub generator: Arc<LoadedProgram>,
    /// Bitwise per-chunk comparison of rank copies (`rank_check.cu`).
    pub rank_check: Arc<LoadedProgram>,
    pub startup: Startup,
}

fn uuid_text(u: &sys::CUuuid) -> String {
    let b: Vec<u8> = u.bytes.iter().map(|&c| c as u8).collect();
    format!(
        "GPU-{}-{}-{}-{}-{}",
        hex::encode(&b[0..4]),
        hex::encode(&b[4..6]),
        hex::encode(&b[6..8]),
        hex::encode(&b[8..10]),
        hex::encode(&b[10..16])
    )
}

impl Device {
    /// Open `ordinal` and build (or fetch from the process cache) its programs.
    ///
    /// Everything that needs no context comes first (device facts, driver
    /// and NVRTC versions, targets: `cuInit` suffices for those); then the
    /// primary context is created on one thread while the images are read
    /// from the disk cache or compiled by NVRTC on others, and finally the
    /// images are loaded into the context.
    pub fn open(ordinal: usize, options: CompileOptions) -> Result<Device, GpuError> {
        let started = Instant::now();
        probe::ensure_libraries()?;
        let cannot_open = |e| GpuError::driver(format!("cannot open CUDA device {ordinal}"), e);
        // What `CudaContext::new` would do first, so a missing device or
        // driver says the same as before the context moved to a thread.
        driver::result::init().map_err(cannot_open)?;
        let cu_device = driver::result::device::get(ordinal as i32).map_err(cannot_open)?;
        let info = probe::device_info(ordinal)?;
        let uuid = driver::result::device::get_uuid(cu_device)
            .map(|u| uuid_text(&u))
            .map_err(|e| GpuError::driver("cuDeviceGetUuid", e))?;
        let mut driver_version = 0i32;
        // SAFETY: out-parameter; symbol checked by ensure_libraries.
        unsafe { sys::cuDriverGetVersion(&mut driver_version) }
            .result()
            .map_err(|e| GpuError::driver("cuDriverGetVersion", e))?;
        let nvrtc_version = probe::nvrtc_version()?;
        let nvrtc_archs = probe::nvrtc_supported_archs()?;
        let fold_target = kernels::resolve_target(
            options.target,
            info.compute_capability,
            &nvrtc_archs,
            nvrtc_version,
            Some(driver_version),
        )?;
        // The generator is integer code; build it for the device's own
        // target with the pinned options whatever the fold uses.
        let gen_target = kernels::resolve_target(
            kernels::Target::Auto,
            info.compute_capability,
            &nvrtc_archs,
            nvrtc_version,
            Some(driver_version),
        )?;
        let queries = ms(started);
        let specs = [
            ProgramSpec::fold(options, fold_target),
            ProgramSpec::generator(gen_target, options.disk_cache),
            ProgramSpec::rank_check(gen_target, options.disk_cache),
        ];
        let (ctx, programs, times) = kernels::open_with_programs(
            ordinal,
            &specs,
            || CudaContext::new(ordinal).map_err(cannot_open),
            kernels::load_into_context,
        )?;
        // The context was made current on its own thread; callers expect
        // it current on this one, as it was when it was created here.
        ctx.bind_to_thread().map_err(cannot_open)?;
        let [fold, generator, rank_check]: [Arc<LoadedProgram>; 3] = programs
            .try_into()
            .map_err(|_| GpuError::bounds("kernel cache: not one program per request"))?;
        let fold = FoldKernels { program: fold };
        // What was actually built (a flag check may have chosen PTX).
        let fold_target = fold.program.image.target;
        let startup = Startup {
            probe: 0.0,
            context: times.context,
            queries,
            programs: times.images + times.load,
            nvrtc_compile: times.nvrtc_compile,
            kernel_cache: times.kernel_cache,
            module_load: times.module_load,
            images: times.images,
            overlapped: times.overlapped,
        };
        Ok(Device {
            ctx,
            info,
            uuid,
            driver_version,
            nvrtc_version,
            nvrtc_archs,
            options,
            fold_target,
            fold,
            generator,
            rank_check,
            startup,
        })
    }

    pub fn new_stream(&self) -> Result<Arc<CudaStream>, GpuError> {
        self.ctx
            .new_stream()
            .map_err(|e| GpuError::driver("cuStreamCreate", e))
    }

    /// Make this device's context current on the calling thread.
    pub fn bind(&self) -> Result<(), GpuError> {
        self.ctx
            .bind_to_thread()
            .map_err(|e| GpuError::driver("making the context current", e))
    }

    /// Free and total device memory in bytes.
    pub fn memory(&self) -> Result<(u64, u64), GpuError> {
        self.bind()?;
        let (free, total) = self
            .ctx
            .mem_get_info()
            .map_err(|e| GpuError::driver("cuMemGetInfo", e))?;
        Ok((free as u64, total as u64))
    }

    /// Enqueue generation of elements `first .. first + n` of one lane into
    /// `out`, in `dtype` (a 16-bit dtype: each value rounded once).
    ///
    /// # Safety
    /// `out` must address `n` writable elements of `dtype` of this context
    /// for the launch.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn generate(
        &self,
        out: sys::CUdeviceptr,
        n: u64,
        first: u64,
        dist: crate::data::Distribution,
        seed: u64,
        rank: u32,
        arena: u32,
        dtype: Dtype,
        stream: &CudaStream,
    ) -> Result<(), GpuError> {
        if n == 0 {
            return Ok(());
        }
        let key = crate::data::lane_key(seed, rank, arena);
        let pair_key = crate::data::lane_key(seed, rank & !1, arena);
        let code = dist.code();
        let entry = if dtype.is_f32() {
            kernels::GENERATE_ENTRY
        } else {
            kernels::GENERATE16_ENTRY
        };
        let f = self.generator.function(entry)?;
        let block = 256u32;
        let blocks = n
            .div_ceil(block as u64)
            .min(self.info.sm_count.max(1) as u64 * 32) as u32;
        let cfg = LaunchConfig {
            grid_dim: (blocks.max(1), 1, 1),
            block_dim: (block, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut b = stream.launch_builder(f);
        b.arg(&out)
            .arg(&n)
            .arg(&first)
            .arg(&key)
            .arg(&pair_key)
            .arg(&rank)
            .arg(&code);
        let dtype_code = kernels::dtype_code(dtype);
        if !dtype.is_f32() {
            b.arg(&dtype_code);
        }
        // SAFETY: argument list matches `fp_generate` (`fp_generate16` with
        // the dtype); `out` per the contract.
        unsafe { b.launch(cfg) }
            .map(|_| ())
            .map_err(|e| GpuError::driver("fp_generate launch", e))
    }

    /// Enqueue the comparison of `other` with `reference`: `flags[c]` becomes
    /// 1 when chunk `c` (of `chunk` elements) differs in any bit, else 0.
    ///
    /// # Safety
    /// The three views must stay allocated and unwritten by other streams
    /// until `stream` has passed the launch.
    pub unsafe fn rank_diff<T: ArenaElem>(
        &self,
        reference: DeviceView<'_, T>,
        other: DeviceView<'_, T>,
        chunk: usize,
        flags: DeviceView<'_, u32>,
        stream: &CudaStream,
    ) -> Result<(), GpuError> {
        let n = reference.len();
        let chunks = n.div_ceil(chunk.max(1));
        // Chunks start 16-byte aligned: 4 float32s or 8 16-bit elements.
        let lanes = 16 / T::BYTES as usize;
        if other.len() != n
            || flags.len() != chunks
            || !chunk.is_multiple_of(lanes)
            || chunk > u32::MAX as usize
        {
            return Err(GpuError::bounds(format!(
                "rank check: {} vs {} elements, {} flags for {chunks} chunks of {chunk}",
                n,
                other.len(),
                flags.len()
            )));
        }
        if n == 0 {
            return Ok(());
        }
        let entry = if T::BYTES == 4 {
            kernels::RANK_DIFF_ENTRY
        } else {
            kernels::RANK_DIFF16_ENTRY
        };
        let f = self.rank_check.function(entry)?;
        let cfg = LaunchConfig {
            grid_dim: (
                u32::try_from(chunks)
                    .map_err(|_| GpuError::bounds("rank check: too many chunks"))?,
                1,
                1,
            ),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        let (r, o, fl) = (reference.ptr(), other.ptr(), flags.ptr());
        let (n64, c32) = (n as u64, chunk as u32);
        let mut b = stream.launch_builder(f);
        b.arg(&r).arg(&o).arg(&n64).arg(&c32).arg(&fl);
        // SAFETY: arguments match `fp_rank_diff` and `fp_rank_diff16`;
        // lengths checked above.
        unsafe { b.launch(cfg) }
            .map(|_| ())
            .map_err(|e| GpuError::driver("fp_rank_diff launch", e))
    }

    /// Enqueue flags[c] = 1 if chunk c (of `chunk` elements) of `arena`
    /// holds a NaN, else 0.
    ///
    /// # Safety
    /// `arena` and `flags` must stay allocated, and `arena` unwritten,
    /// until `stream` has passed the launch.
    pub unsafe fn nan_chunks<T: ArenaElem>(
        &self,
        arena: DeviceView<'_, T>,
        chunk: usize,
        flags: DeviceView<'_, u32>,
        stream: &CudaStream,
    ) -> Result<(), GpuError> {
        let n = arena.len();
        let chunks = n.div_ceil(chunk.max(1));
        // Float32 arenas only: a 16-bit arena's hasher applies the NaN
        // policy to every element anyway.
        if T::BYTES != 4
            || flags.len() != chunks
            || !chunk.is_multiple_of(4)
            || chunk > u32::MAX as usize
        {
            return Err(GpuError::bounds(format!(
                "NaN scan: {} flags for {chunks} chunks of {chunk}",
                flags.len()
            )));
        }
        if n == 0 {
            return Ok(());
        }
        let f = self.rank_check.function(kernels::NAN_CHUNKS_ENTRY)?;
        let cfg = LaunchConfig {
            grid_dim: (
                u32::try_from(chunks).map_err(|_| GpuError::bounds("NaN scan: too many chunks"))?,
                1,
                1,
            ),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        let (a, fl) = (arena.ptr(), flags.ptr());
        let (n64, c32) = (n as u64, chunk as u32);
        let mut b = stream.launch_builder(f);
        b.arg(&a).arg(&n64).arg(&c32).arg(&fl);
        // SAFETY: arguments match `fp_nan_chunks`; lengths checked above.
        unsafe { b.launch(cfg) }
            .map(|_| ())
            .map_err(|e| GpuError::driver("fp_nan_chunks launch", e))
    }

    /// Enqueue the SHA-256 of every `chunk`-element chunk of `arena` under
    /// `policy` into `out` (8 big-endian words per chunk).
    ///
    /// # Safety
    /// `arena` and `out` must stay allocated, and `arena` unwritten, until
    /// `stream` has passed the launch.
    pub unsafe fn chunk_sha256<T: ArenaElem>(
        &self,
        arena: DeviceView<'_, T>,
        chunk: usize,
        policy: crate::digest::NanPolicy,
        out: DeviceView<'_, u32>,
        stream: &CudaStream,
    ) -> Result<(), GpuError> {
        let n = arena.len();
        let chunks = n.div_ceil(chunk.max(1));
        // Float32 arenas only (16-bit chunk digests are the host's).
        if T::BYTES != 4
            || out.len() != 8 * chunks
            || !chunk.is_multiple_of(16)
            || chunk > u32::MAX as usize
        {
            return Err(GpuError::bounds(format!(
                "chunk digests: {} output words for {chunks} chunks of {chunk}",
                out.len()
            )));
        }
        if n == 0 {
            return Ok(());
        }
        let f = self.rank_check.function(kernels::CHUNK_SHA_ENTRY)?;
        let block = 64u32;
        let blocks = u32::try_from(chunks.div_ceil(block as usize))
            .map_err(|_| GpuError::bounds("chunk digests: too many chunks"))?;
        let cfg = LaunchConfig {
            grid_dim: (blocks, 1, 1),
            block_dim: (block, 1, 1),
            shared_mem_bytes: 0,
        };
        let canonical = u32::from(policy == crate::digest::NanPolicy::Canonical);
        let (a, o) = (arena.ptr(), out.ptr());
        let (n64, c32) = (n as u64, chunk as u32);
        let mut b = stream.launch_builder(f);
        b.arg(&a).arg(&n64).arg(&c32).arg(&canonical).arg(&o);
        // SAFETY: arguments match `fp_chunk_sha256`; sizes checked above.
        unsafe { b.launch(cfg) }
            .map(|_| ())
            .map_err(|e| GpuError::driver("fp_chunk_sha256 launch", e))
    }

    /// Enqueue the device's conversions over a range of bit patterns, for
    /// checking them against the host's: `narrow[j]` = the `dtype` bits of
    /// float32 pattern `first + j`, and `wide[j]` = the float32 bits of
    /// 16-bit pattern `(first + j) mod 2^16`. Either may be empty. `hw`:
    /// the hardware conversions of the f16 folds' fast path (exact on
    /// non-NaN inputs only; `wide` then of even length), else the exact
    /// ones (bf16 has only those).
    ///
    /// # Safety
    /// Both views must stay allocated until `stream` has passed the launches.
    pub unsafe fn convert_bits(
        &self,
        dtype: Dtype,
        first: u32,
        hw: bool,
        narrow: DeviceView<'_, u16>,
        wide: DeviceView<'_, u32>,
        stream: &CudaStream,
    ) -> Result<(), GpuError> {
        if dtype.is_f32() {
            return Err(GpuError::bounds("conversions are of 16-bit dtypes"));
        }
        if hw && !wide.len().is_multiple_of(2) {
            return Err(GpuError::bounds("hardware widening checks pairs"));
        }
        let code = kernels::dtype_code(dtype);
        let hw = u32::from(hw);
        for (entry, ptr, n) in [
            (kernels::NARROW_BITS_ENTRY, narrow.ptr(), narrow.len()),
            (kernels::WIDEN_BITS_ENTRY, wide.ptr(), wide.len()),
        ] {
            if n == 0 {
                continue;
            }
            let f = self.generator.function(entry)?;
            let block = 256u32;
            let blocks = (n as u64)
                .div_ceil(block as u64)
                .min(self.info.sm_count.max(1) as u64 * 32) as u32;
            let cfg = LaunchConfig {
                grid_dim: (blocks.max(1), 1, 1),
                block_dim: (block, 1, 1),
                shared_mem_bytes: 0,
            };
            let n64 = n as u64;
            let mut b = stream.launch_builder(f);
            b.arg(&ptr).arg(&n64).arg(&first).arg(&code).arg(&hw);
            // SAFETY: arguments match `fp_narrow_bits` / `fp_widen_bits`;
            // each writes exactly its view's `n` elements.
            unsafe { b.launch(cfg) }
                .map(|_| ())
                .map_err(|e| GpuError::driver(format!("{entry} launch"), e))?;
        }
        Ok(())
    }

    /// Enqueue one fold launch.
    ///
    /// # Safety
    /// `a.out` must address `a.len` writable elements of `a.dtype`;
    /// `a.stacked` must address `a.world` rows of stride `a.ld` holding
    /// `a.len` readable elements each,
    /// with the same 16-byte phase as `a.out`; `a.prog` must hold
    /// `a.prog_len` u32s (or `a.world` for the order mode). All of this
    /// context, valid for the launch, not overlapping `a.out`.
    pub unsafe fn fold(
        &self,
        variant: KernelVariant,
        mode: FoldMode,
        a: &FoldArgs,
        tuning: &LaunchTuning,
        stream: &CudaStream,
    ) -> Result<(), GpuError> {
        if a.len == 0 {
            return Ok(());
        }
        // Elements per 16-byte vector, and bytes per element.
        let (lanes, bytes) = if a.dtype.is_f32() { (4, 4) } else { (8, 2) };
        if a.world == 0 || !a.ld.is_multiple_of(lanes) || a.ld < a.len {
            return Err(GpuError::bounds(format!(
                "fold launch refused: world {} ld {} len {}",
                a.world, a.ld, a.len
            )));
        }
        if (a.out & 15) != (a.stacked & 15) || (a.out & (bytes - 1)) != 0 {
            return Err(GpuError::bounds(
                "fold launch refused: out and stacked differ in 16-byte phase",
            ));
        }
        let f = if a.dtype.is_f32() {
            self.fold.function(mode, variant)?
        } else {
            self.fold.function16(mode, variant)?
        };
        // SAFETY: the caller's contract, checked above.
        unsafe { self.launch_fold(f, variant, lanes, a, tuning, stream) }
    }

    /// The 16-bit fold trials (`fold16_trials.cu`), built with this
    /// device's fold options and target (disk cache as configured).
    pub fn load_fold16_trials(&self) -> Result<LoadedProgram, GpuError> {
        let spec = ProgramSpec::fold16_trials(self.options, self.fold_target);
        let (image, origin) = spec.image()?;
        kernels::load_into_context(&self.ctx, image, origin, &spec.entries)
    }

    /// Enqueue one launch of a 16-bit trial kernel over the fixed order:
    /// [`Device::fold`]'s `fast` launch with the trial's elements per thread.
    ///
    /// # Safety
    /// As for [`Device::fold`] (a 16-bit dtype, `prog` unused).
    pub unsafe fn fold16_trial(
        &self,
        trials: &LoadedProgram,
        trial: kernels::Fold16Trial,
        a: &FoldArgs,
        tuning: &LaunchTuning,
        stream: &CudaStream,
    ) -> Result<(), GpuError> {
        if a.dtype.is_f32() || a.len == 0 {
            return Err(GpuError::bounds("fold trials are of 16-bit arenas"));
        }
        if a.world == 0
            || !a.ld.is_multiple_of(8)
            || a.ld < a.len
            || (a.out & 15) != (a.stacked & 15)
        {
            return Err(GpuError::bounds(
                "fold trial launch refused: shape or phase",
            ));
        }
        let f = trials.function(trial.entry)?;
        let lanes = u64::from(trial.elems_per_thread.max(1));
        // SAFETY: the caller's contract, checked above.
        unsafe { self.launch_fold(f, KernelVariant::Fast, lanes, a, tuning, stream) }
    }

    /// Launch fold kernel `f` (the signature of `FP_FOLD_ENTRY`, with the
    /// dtype for 16-bit ones), `lanes` elements per `fast` thread.
    unsafe fn launch_fold(
        &self,
        f: &CudaFunction,
        variant: KernelVariant,
        lanes: u64,
        a: &FoldArgs,
        tuning: &LaunchTuning,
        stream: &CudaStream,
    ) -> Result<(), GpuError> {
        let (block, blocks) = match variant {
            KernelVariant::PerElement => {
                let block = tuning.seed_block.clamp(32, 1024);
                let blocks = a.len.div_ceil(block as u64);
                if blocks > i32::MAX as u64 {
                    return Err(GpuError::bounds(format!(
                        "arena shard of {} elements exceeds the seed grid",
                        a.len
                    )));
                }
                (block, blocks as u32)
            }
            KernelVariant::Fast => {
                let block = tuning.fast_block.clamp(32, 1024);
                let vecs = (a.len / lanes).max(1);
                let cap =
                    self.info.sm_count.max(1) as u64 * tuning.fast_blocks_per_sm.max(1) as u64;
                (block, vecs.div_ceil(block as u64).clamp(1, cap) as u32)
            }
        };
        let cfg = LaunchConfig {
            grid_dim: (blocks, 1, 1),
            block_dim: (block, 1, 1),
            shared_mem_bytes: 0,
        };
        let (scale, use_scale) = match a.scale {
            Some(s) => (s, 1u32),
            None => (1.0f32, 0u32),
        };
        let mut b = stream.launch_builder(f);
        b.arg(&a.out)
            .arg(&a.stacked)
            .arg(&a.ld)
            .arg(&a.len)
            .arg(&a.world)
            .arg(&a.prog)
            .arg(&a.prog_len)
            .arg(&scale)
            .arg(&use_scale);
        let dtype_code = kernels::dtype_code(a.dtype);
        if !a.dtype.is_f32() {
            b.arg(&dtype_code);
        }
        // SAFETY: argument list matches the FP_FOLD_ENTRY signature (for
        // 16-bit FP_FOLD16_ENTRY's, with the dtype); memory per the
        // contract above.
        unsafe { b.launch(cfg) }
            .map(|_| ())
            .map_err(|e| GpuError::driver("fold launch", e))
    }

    /// What this device and its programs are, for reports.
    pub fn environment(&self) -> serde_json::Value {
        let (free, total) = self.memory().unwrap_or((0, 0));
        serde_json::json!({
            "gpu": {
                "ordinal": self.info.ordinal,
                "name": self.info.name,
                "uuid": self.uuid,
                "compute_capability": format!("{}.{}", self.info.compute_capability.0, self.info.compute_capability.1),
                "sm_count": self.info.sm_count,
                "total_memory_bytes": total.max(self.info.total_memory_bytes),
                "free_memory_bytes": free,
            },
            "driver": {
                "version": self.driver_version,
                "cuda_driver_api": probe::version_text(self.driver_version),
            },
            "nvrtc": {
                "version": format!("{}.{}", self.nvrtc_version.0, self.nvrtc_version.1),
                "supported_archs": self.nvrtc_archs,
            },
            "fold_program": image_json(&self.fold.program.image),
            "generator_program": image_json(&self.generator.image),
            "rank_check_program": image_json(&self.rank_check.image),
            "kernel_cache": {
                "fold_program": self.fold.program.origin,
                "generator_program": self.generator.origin,
                "rank_check_program": self.rank_check.origin,
            },
            "startup_ms": self.startup,
        })
    }
}

fn ms(since: Instant) -> f64 {
    since.elapsed().as_secs_f64() * 1e3
}

fn image_json(i: &kernels::Image) -> serde_json::Value {
    serde_json::json!({
        "program": i.program,
        "target": format!("{} {}", i.target.kind, i.target.arch_option()),
        "options": i.options,
        "sha256": i.sha256,
        "bytes": i.bytes,
        "nvrtc_version": format!("{}.{}", i.nvrtc_version.0, i.nvrtc_version.1),
        "log": i.log,
        "note": i.note,
    })
}
