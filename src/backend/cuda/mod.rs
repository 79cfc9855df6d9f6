//! The CUDA loopback backend: all W ranks on one GPU, data generated on the
//! device, the fold compiled by NVRTC at run time with pinned options,
//! digests hashed on the host while the next chunk is copied back.
//!
//! The device itself (probe, programs, memory, read-back) is the platform
//! in [`crate::gpu`]; this module owns only the loopback world on it.

pub mod world;

use super::{
    gpu_failed, unsupported, Backend, BackendError, CaseRun, ReducedArena, RoundTimings, RunOptions,
};
use crate::dtype::Dtype;
use crate::experiment::{Addends, Case};
use crate::fold::{mean_scale, shard_plan, Contract};
use crate::gpu::in_place::{PinnedInPlace, PIN_ALIGN};
use crate::gpu::kernels::{self, FoldMode, KernelVariant};
use crate::gpu::mem::{DeviceBuffer, PinnedBuffer};
use crate::gpu::readback::Reader;
use crate::gpu::{device, mapped, probe, Device, DeviceConfig, GpuError, LaunchTuning, RankCheck};
use serde::Serialize;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;
use world::{AnyWorld, RoundSpec, WorldBuffers, WorldElem};

const NAME: &str = "cuda";

pub struct CudaBackend {
    cfg: DeviceConfig,
    dev: Device,
    main: Arc<cudarc::driver::CudaStream>,
    copy: Vec<Arc<cudarc::driver::CudaStream>>,
    readers: Vec<Reader>,
    /// Rank arenas + scratch per (W, n), reused across rounds.
    worlds: HashMap<(usize, usize), AnyWorld>,
    /// Per digested arena of the current case, in order: where its digest
    /// time went (`bench` prints it).
    profiles: Vec<world::DigestProfile>,
    /// Two pinned buffers rank files are read into on their way up, kept
    /// for the largest arena so far.
    staging: Option<[PinnedBuffer; 2]>,
    /// Bytes of rank files the current case sent up from where the files'
    /// pass keeps them, pinned in place.
    in_place: u64,
}

fn unavailable(reason: impl std::fmt::Display) -> BackendError {
    BackendError::Unavailable {
        backend: NAME,
        reason: reason.to_string(),
    }
}

impl CudaBackend {
    /// Open the device and build the kernels; `Unavailable` says what is missing.
    pub fn new(cfg: DeviceConfig) -> Result<Self, BackendError> {
        let started = Instant::now();
        let p = probe();
        let probe_ms = started.elapsed().as_secs_f64() * 1e3;
        if !p.usable {
            return Err(unavailable(format!(
                "{} (`foldprint doctor` lists every name tried)",
                p.short_reason()
            )));
        }
        if cfg.ordinal >= p.device_count {
            return Err(unavailable(format!(
                "device {} requested but the driver reports {} device(s)",
                cfg.ordinal, p.device_count
            )));
        }
        let mut dev = Device::open(cfg.ordinal, cfg.compile).map_err(unavailable)?;
        dev.startup.probe = probe_ms;
        let main = dev.new_stream().map_err(unavailable)?;
        let mut backend = CudaBackend {
            cfg: cfg.clone(),
            dev,
            main,
            copy: Vec::new(),
            readers: Vec::new(),
            worlds: HashMap::new(),
            profiles: Vec::new(),
            staging: None,
            in_place: 0,
        };
        backend.set_copy_streams(cfg.copy_streams)?;
        Ok(backend)
    }

    /// Where each arena's digest time went in the last case, in round order.
    pub fn digest_profiles(&self) -> &[world::DigestProfile] {
        &self.profiles
    }

    /// Bytes of rank files the last case sent to the device straight from
    /// where the files' pass keeps them (pinned in place), every round
    /// counted; the rest went through the staging buffers.
    pub fn in_place_bytes(&self) -> u64 {
        self.in_place
    }

    pub fn config(&self) -> &DeviceConfig {
        &self.cfg
    }

    pub fn device(&self) -> &Device {
        &self.dev
    }

    pub fn set_variant(&mut self, v: KernelVariant) {
        self.cfg.variant = v;
    }

    pub fn set_tuning(&mut self, t: LaunchTuning) {
        self.cfg.tuning = t;
    }

    /// Race the exchange copies over `k` streams (k < 2: in order on one).
    pub fn set_copy_streams(&mut self, k: usize) -> Result<(), BackendError> {
        let k = if k < 2 { 0 } else { k.min(64) };
        while self.copy.len() < k {
            self.copy.push(self.dev.new_stream().map_err(unavailable)?);
        }
        self.copy.truncate(k);
        self.cfg.copy_streams = k;
        Ok(())
    }

    fn ensure_readers(&mut self, world: usize) -> Result<(), GpuError> {
        let cores = std::thread::available_parallelism().map_or(4, |c| c.get());
        let want = if self.cfg.readers == 0 {
            cores.min(16)
        } else {
            self.cfg.readers
        };
        // Under the device check only rank 0 (and a rank that differs, on
        // the failure path) is read back: one reader, not one per rank.
        let world = match self.cfg.rank_check {
            RankCheck::Device => 1,
            RankCheck::Host => world,
        };
        let want = want.min(world).max(1);
        while self.readers.len() < want {
            self.readers
                .push(Reader::new(&self.dev, self.cfg.chunk.max(1024))?);
        }
        Ok(())
    }

    /// Rank arenas and scratch for (W, n) in `T`, allocating after a
    /// memory check.
    fn ensure_world<T: WorldElem>(
        &mut self,
        case: &Case,
        n: usize,
        nbuf: usize,
    ) -> Result<(), BackendError> {
        let key = (case.world(), n);
        match self.worlds.get(&key) {
            Some(w) if T::unwrap(w).is_some() => return Ok(()),
            // The other width: give it back first.
            Some(_) => {
                self.worlds.remove(&key);
            }
            None => {}
        }
        let plan =
            shard_plan(n, case.world()).ok_or_else(|| unsupported(case.id(), "world = 0"))?;
        let needed = world::bytes_needed(case.world(), n, &plan, nbuf, case.dtype());
        let (mut free, _) = self
            .dev
            .memory()
            .map_err(|e| gpu_failed(case.id(), "memory query", e))?;
        if needed > free && !self.worlds.is_empty() {
            // Give back other lengths' buffers before declaring defeat.
            self.worlds.clear();
            free = self
                .dev
                .memory()
                .map_err(|e| gpu_failed(case.id(), "memory query", e))?
                .0;
        }
        // Keep a margin for the driver, streams and kernels.
        let margin = 256u64 << 20;
        if needed.saturating_add(margin) > free {
            return Err(BackendError::OutOfMemory {
                case: case.id().to_string(),
                inputs: crate::backend::inputs_note(case),
                what: "GPU memory",
                needed: needed + margin,
                available: free,
            });
        }
        let bufs = WorldBuffers::<T>::alloc(&self.dev, case.world(), n, &plan, nbuf)
            .map_err(|e| gpu_failed(case.id(), "allocating rank arenas", e))?;
        self.worlds.insert(key, T::wrap(bufs));
        Ok(())
    }

    fn check_case(&self, case: &Case, opts: &RunOptions) -> Result<(), BackendError> {
        if case.world() == 0 || case.world() > u32::MAX as usize {
            return Err(unsupported(
                case.id(),
                format!("world {} is out of range", case.world()),
            ));
        }
        // Kept values, and for rank files the two pinned buffers each rank's
        // arena is read into on its way to the device.
        let largest = case.arenas().iter().copied().max().unwrap_or(0) as u64 * 4;
        let staging = if case.files().is_some() {
            2 * largest.min(STAGE as u64 * 4)
        } else {
            0
        };
        let kept = if opts.keep_values { largest } else { 0 };
        if kept + staging > 0 {
            if let Some(h) = crate::memory::headroom() {
                if kept + staging > h.bytes {
                    return Err(BackendError::OutOfMemory {
                        case: case.id().to_string(),
                        inputs: crate::backend::inputs_note(case),
                        what: h.what,
                        needed: kept + staging,
                        available: h.bytes,
                    });
                }
            }
        }
        Ok(())
    }

    #[allow(clippy::too_many_arguments)]
    fn round<'c>(
        &mut self,
        case: &'c Case,
        opts: &RunOptions,
        mode: FoldMode,
        prog: &Option<DeviceBuffer<u32>>,
        prog_len: u32,
        pins: &mut CasePins<'c>,
        last: bool,
    ) -> Result<(Vec<ReducedArena>, RoundTimings), BackendError> {
        let start = Instant::now();
        let mut t = RoundTimings::default();
        let mut out = Vec::with_capacity(case.arenas().len());
        let order = case.order().sequence(case.world());
        let scale = case.mean().then(|| mean_scale(case.world()));
        let racing = self.copy.len() >= 2;
        let arenas = case.arenas().len();
        for (a, &n) in case.arenas().iter().enumerate() {
            let arena = ArenaStep {
                a,
                n,
                mode,
                prog: prog.as_ref().map_or(0, |p| p.ptr()),
                prog_len,
                order: &order,
                scale,
                racing,
                last: last && a + 1 == arenas,
            };
            let reduced = if case.dtype().is_f32() {
                self.arena_round::<f32>(case, opts, &arena, &mut t, pins)?
            } else {
                self.arena_round::<u16>(case, opts, &arena, &mut t, pins)?
            };
            out.push(reduced);
        }
        t.total_ms = start.elapsed().as_secs_f64() * 1e3;
        Ok((out, t))
    }

    /// One arena of a round in `T` (the case's dtype's width): rank files
    /// uploaded or addends generated, exchange, fold, redistribution, digests.
    fn arena_round<'c, T: WorldElem>(
        &mut self,
        case: &'c Case,
        opts: &RunOptions,
        step: &ArenaStep<'_>,
        t: &mut RoundTimings,
        pins: &mut CasePins<'c>,
    ) -> Result<ReducedArena, BackendError> {
        let (a, n) = (step.a, step.n);
        let dtype = case.dtype();
        let plan =
            shard_plan(n, case.world()).ok_or_else(|| unsupported(case.id(), "world = 0"))?;
        let nonempty = plan.iter().filter(|s| s.len > 0).count();
        let nbuf = if step.racing {
            nonempty.min(2)
        } else {
            nonempty.min(1)
        };
        self.ensure_world::<T>(case, n, nbuf)?;
        self.ensure_readers(case.world())
            .map_err(|e| gpu_failed(case.id(), "read-back buffers", e))?;
        let bufs = self
            .worlds
            .get(&(case.world(), n))
            .and_then(T::unwrap)
            .ok_or_else(|| {
                gpu_failed(
                    case.id(),
                    "rank arenas",
                    GpuError::bounds("no buffers of the case's dtype"),
                )
            })?;
        let mut spec = RoundSpec {
            plan: &plan,
            order: step.order,
            mode: step.mode,
            prog: step.prog,
            prog_len: step.prog_len,
            scale: step.scale,
            variant: self.cfg.variant,
            tuning: self.cfg.tuning,
            generate: None,
            arena: a as u32,
            dtype,
            redistribute: case.collective().is_all_reduce(),
        };
        let (mut rank0, mut started) = (None, None);
        match case.addends() {
            Addends::Generated { seed, distribution } => {
                spec.generate = Some((*distribution, *seed));
                let (gen_ms, reduce_ms) =
                    world::run_round(&self.dev, &self.main, &self.copy, bufs, &spec)
                        .map_err(|e| gpu_failed(case.id(), "round", e))?;
                t.generate_ms += gen_ms;
                t.reduce_ms += reduce_ms;
            }
            Addends::Files(f) => {
                let u = Instant::now();
                let files = FileRound {
                    files: f,
                    a,
                    dtype,
                    stream: &self.main,
                    in_place: std::sync::atomic::AtomicU64::new(0),
                };
                // An all-reduce's rank 0 is hashed while the later stages
                // still arrive (the digest is one sequential stream).
                let hashed_early = spec.redistribute && self.cfg.rank_check == RankCheck::Device;
                let reader0 = self.readers.first_mut().filter(|_| hashed_early && n > 0);
                let Reduced {
                    uploaded,
                    fold_ms,
                    rank0: hashed,
                } = files
                    .reduce(
                        &self.dev,
                        &self.copy,
                        bufs,
                        &spec,
                        &mut self.staging,
                        reader0,
                        opts,
                        (pins, step.last),
                    )
                    .map_err(|e| match e {
                        Upload::Read(e) => crate::backend::addends_error(case)(e),
                        Upload::Gpu(e) => gpu_failed(case.id(), "round", e),
                    })?;
                self.in_place += files.in_place.into_inner();
                t.generate_ms += uploaded.duration_since(u).as_secs_f64() * 1e3;
                t.reduce_ms += fold_ms;
                if let Some((h, since, checks)) = hashed {
                    // Rank 0's digest counts from the end of the upload.
                    t.digest_ms += since.duration_since(uploaded).as_secs_f64() * 1e3;
                    (rank0, started) = (Some(h), checks);
                }
            }
        }
        let d = Instant::now();
        if !case.collective().is_all_reduce() {
            let reduced = scattered_digests(
                &self.dev,
                &self.main,
                &mut self.readers[0],
                bufs,
                &plan,
                dtype,
                opts,
            )
            .map_err(|e| gpu_failed(case.id(), "digest", e))?;
            t.digest_ms += d.elapsed().as_secs_f64() * 1e3;
            self.profiles.push(world::DigestProfile::default());
            return Ok(reduced);
        }
        let got = world::digest_ranks(
            &self.dev,
            &mut self.readers,
            bufs,
            dtype,
            opts.nan_policy,
            opts.keep_values,
            self.cfg.rank_check,
            rank0,
            started,
        )
        .map_err(|e| gpu_failed(case.id(), "digest", e))?;
        t.digest_ms += d.elapsed().as_secs_f64() * 1e3;
        self.profiles.push(got.profile);
        Ok(ReducedArena {
            scattered: None,
            len: n,
            rank_digests: got.digests,
            chunks: got.chunks,
            values: got.values,
            differing: got.differing,
        })
    }

    /// Bits of elements `first .. first + n` of one generated lane, made on
    /// the device (for checking the generator against `data::Lane`).
    pub fn generate_lane(
        &mut self,
        dist: crate::data::Distribution,
        seed: u64,
        rank: u32,
        arena: u32,
        first: u64,
        n: usize,
    ) -> Result<Vec<u32>, BackendError> {
        self.generate_lane_as(Dtype::F32, dist, seed, rank, arena, first, n)
    }

    /// [`CudaBackend::generate_lane`] in `dtype`: the dtype's bits of each
    /// element (low 16 bits for bf16 and f16).
    #[allow(clippy::too_many_arguments)]
    pub fn generate_lane_as(
        &mut self,
        dtype: Dtype,
        dist: crate::data::Distribution,
        seed: u64,
        rank: u32,
        arena: u32,
        first: u64,
        n: usize,
    ) -> Result<Vec<u32>, BackendError> {
        let id = "generate-lane";
        let failed = |e| gpu_failed(id, "generating a lane", e);
        let run = |ptr| {
            // SAFETY: `ptr` is a buffer of `n` elements of `dtype` below.
            unsafe {
                self.dev.generate(
                    ptr, n as u64, first, dist, seed, rank, arena, dtype, &self.main,
                )
            }?;
            self.main
                .synchronize()
                .map_err(|e| GpuError::driver("cuStreamSynchronize", e))
        };
        if dtype.is_f32() {
            let buf = DeviceBuffer::<f32>::alloc(&self.dev.ctx, n).map_err(failed)?;
            run(buf.ptr()).map_err(failed)?;
            let v = buf.to_host().map_err(failed)?;
            Ok(v.into_iter().map(f32::to_bits).collect())
        } else {
            let buf = DeviceBuffer::<u16>::alloc(&self.dev.ctx, n).map_err(failed)?;
            run(buf.ptr()).map_err(failed)?;
            let v = buf.to_host().map_err(failed)?;
            Ok(v.into_iter().map(u32::from).collect())
        }
    }

    /// The device's conversions of `dtype` over bit patterns: the dtype
    /// bits of float32 patterns `first .. first + narrow`, and the float32
    /// bits of the first `widen` 16-bit patterns from `first mod 2^16`;
    /// `hw`: the f16 folds' hardware conversions ([`Device::convert_bits`]).
    pub fn convert_bits(
        &mut self,
        dtype: Dtype,
        first: u32,
        hw: bool,
        narrow: usize,
        widen: usize,
    ) -> Result<(Vec<u16>, Vec<u32>), BackendError> {
        let id = "convert-bits";
        let failed = |e| gpu_failed(id, "converting bit patterns", e);
        let out = DeviceBuffer::<u16>::alloc(&self.dev.ctx, narrow).map_err(failed)?;
        let wide = DeviceBuffer::<u32>::alloc(&self.dev.ctx, widen).map_err(failed)?;
        // SAFETY: both buffers live until after the synchronize below.
        unsafe {
            self.dev
                .convert_bits(dtype, first, hw, out.view(), wide.view(), &self.main)
                .map_err(failed)?;
        }
        self.main
            .synchronize()
            .map_err(|e| failed(GpuError::driver("cuStreamSynchronize", e)))?;
        Ok((
            out.to_host().map_err(failed)?,
            wide.to_host().map_err(failed)?,
        ))
    }

    /// The fold kernel alone over host-given addends (slot r = `addends[r]`):
    /// `order` is the delivery order (used by `arrival-order`).
    pub fn fold_slices(
        &mut self,
        addends: &[&[f32]],
        contract: Contract,
        order: &[usize],
        mean: bool,
    ) -> Result<Vec<f32>, BackendError> {
        let id = "fold-slices";
        let failed = |e| gpu_failed(id, "folding", e);
        let w = addends.len();
        let n = addends.first().map_or(0, |a| a.len());
        if w == 0 || addends.iter().any(|a| a.len() != n) || order.len() != w {
            return Err(unsupported(
                id,
                "need W >= 1 equal-length addends and a W-long order",
            ));
        }
        let ld = device::row_stride(n);
        let stacked = DeviceBuffer::<f32>::alloc(&self.dev.ctx, w * ld).map_err(failed)?;
        let out = DeviceBuffer::<f32>::alloc(&self.dev.ctx, n).map_err(failed)?;
        let mut host = vec![0f32; w * ld];
        for (r, a) in addends.iter().enumerate() {
            host[r * ld..r * ld + n].copy_from_slice(a);
        }
        stacked.upload(&host).map_err(failed)?;
        let (mode, prog) =
            kernels::fold_program(contract, w, order).map_err(|m| unsupported(id, m))?;
        let prog_buf = upload_prog(&self.dev, &prog).map_err(failed)?;
        let args = device::FoldArgs {
            out: out.ptr(),
            stacked: stacked.ptr(),
            ld: ld as u64,
            len: n as u64,
            world: w as u32,
            prog: prog_buf.as_ref().map_or(0, |p| p.ptr()),
            prog_len: prog.len() as u32,
            scale: mean.then(|| mean_scale(w)),
            dtype: Dtype::F32,
        };
        // SAFETY: buffers sized above, same (zero) phase.
        unsafe {
            self.dev
                .fold(self.cfg.variant, mode, &args, &self.cfg.tuning, &self.main)
                .map_err(failed)?;
        }
        self.main
            .synchronize()
            .map_err(|e| failed(GpuError::driver("cuStreamSynchronize", e)))?;
        out.to_host().map_err(failed)
    }

    /// The 16-bit fold trials program (`fold16_trials.cu`) for this device.
    pub fn fold16_trials(&self) -> Result<kernels::LoadedProgram, BackendError> {
        self.dev
            .load_fold16_trials()
            .map_err(|e| gpu_failed("fold16-trials", "building the trials", e))
    }

    /// [`CudaBackend::fold_slices`] over 16-bit addends of `dtype` (their
    /// bits), returning the result's bits: with `trial`, that kernel of the
    /// trials program (fixed order only) instead of the configured variant.
    pub fn fold_slices16(
        &mut self,
        dtype: Dtype,
        addends: &[&[u16]],
        contract: Contract,
        order: &[usize],
        mean: bool,
        trial: Option<(&kernels::LoadedProgram, kernels::Fold16Trial)>,
    ) -> Result<Vec<u16>, BackendError> {
        let id = "fold-slices16";
        let failed = |e| gpu_failed(id, "folding", e);
        let w = addends.len();
        let n = addends.first().map_or(0, |a| a.len());
        if dtype.is_f32() || w == 0 || addends.iter().any(|a| a.len() != n) || order.len() != w {
            return Err(unsupported(
                id,
                "need a 16-bit dtype and W >= 1 equal-length addends and a W-long order",
            ));
        }
        if trial.is_some() && contract != Contract::FixedOrder {
            return Err(unsupported(id, "the trials fold in fixed order only"));
        }
        let ld = device::row_stride_of(n, dtype);
        let stacked = DeviceBuffer::<u16>::alloc(&self.dev.ctx, w * ld).map_err(failed)?;
        let out = DeviceBuffer::<u16>::alloc(&self.dev.ctx, n).map_err(failed)?;
        let mut host = vec![0u16; w * ld];
        for (r, a) in addends.iter().enumerate() {
            host[r * ld..r * ld + n].copy_from_slice(a);
        }
        stacked.upload(&host).map_err(failed)?;
        let (mode, prog) =
            kernels::fold_program(contract, w, order).map_err(|m| unsupported(id, m))?;
        let prog_buf = upload_prog(&self.dev, &prog).map_err(failed)?;
        let args = device::FoldArgs {
            out: out.ptr(),
            stacked: stacked.ptr(),
            ld: ld as u64,
            len: n as u64,
            world: w as u32,
            prog: prog_buf.as_ref().map_or(0, |p| p.ptr()),
            prog_len: prog.len() as u32,
            scale: mean.then(|| mean_scale(w)),
            dtype,
        };
        // SAFETY: buffers sized above, same (zero) phase.
        unsafe {
            match trial {
                Some((p, t)) => self
                    .dev
                    .fold16_trial(p, t, &args, &self.cfg.tuning, &self.main),
                None => self
                    .dev
                    .fold(self.cfg.variant, mode, &args, &self.cfg.tuning, &self.main),
            }
            .map_err(failed)?;
        }
        self.main
            .synchronize()
            .map_err(|e| failed(GpuError::driver("cuStreamSynchronize", e)))?;
        out.to_host().map_err(failed)
    }

    /// Write the inputs and output of `case`'s first arena for
    /// `bench/torch_peer.py`: `addends.f32` (W x n f32 LE, rank-major, as
    /// generated on the device) and `reduced.f32` (rank 0's reduced arena).
    pub fn write_peer_files(&mut self, case: &Case, dir: &Path) -> Result<PeerFiles, BackendError> {
        use std::io::Write as _;
        let id = case.id();
        let failed = |e| gpu_failed(id, "writing peer files", e);
        let io = |path: &Path| {
            let what = path.display().to_string();
            move |source| GpuError::Io { what, source }
        };
        let n = *case
            .arenas()
            .first()
            .ok_or_else(|| unsupported(id, "case has no arena"))?;
        let Addends::Generated { seed, distribution } = *case.addends() else {
            return Err(unsupported(
                id,
                "peer files are written from generated addends",
            ));
        };
        if !case.dtype().is_f32() {
            return Err(unsupported(id, "peer files are float32"));
        }
        std::fs::create_dir_all(dir)
            .map_err(io(dir))
            .map_err(failed)?;
        let addends = dir.join("addends.f32");
        let reduced = dir.join("reduced.f32");
        let write = |path: &PathBuf,
                     vals: &mut dyn FnMut(&mut dyn std::io::Write) -> Result<(), GpuError>|
         -> Result<(), GpuError> {
            let f = std::fs::File::create(path).map_err(io(path))?;
            let mut w = std::io::BufWriter::with_capacity(8 << 20, f);
            vals(&mut w)?;
            w.flush().map_err(io(path))
        };
        {
            let chunk = 1usize << 22;
            let buf =
                DeviceBuffer::<f32>::alloc(&self.dev.ctx, chunk.min(n.max(1))).map_err(failed)?;
            let mut host = vec![0f32; chunk.min(n.max(1))];
            let dev = &self.dev;
            let main = &self.main;
            write(&addends, &mut |w| {
                for r in 0..case.world() {
                    let mut first = 0usize;
                    while first < n {
                        let k = chunk.min(n - first);
                        // SAFETY: `buf` holds at least `k` f32s.
                        unsafe {
                            dev.generate(
                                buf.ptr(),
                                k as u64,
                                first as u64,
                                distribution,
                                seed,
                                r as u32,
                                0,
                                Dtype::F32,
                                main,
                            )?;
                        }
                        main.synchronize()
                            .map_err(|e| GpuError::driver("cuStreamSynchronize", e))?;
                        buf.download(0, &mut host[..k])?;
                        for v in &host[..k] {
                            w.write_all(&v.to_le_bytes()).map_err(io(&addends))?;
                        }
                        first += k;
                    }
                }
                Ok(())
            })
            .map_err(failed)?;
        }
        let one = case
            .to_builder()
            .arenas([n])
            .rounds(1)
            .build()
            .map_err(|e| crate::backend::unsupported(id, e.to_string()))?;
        let run = self.run_case(
            &one,
            &RunOptions {
                keep_values: true,
                ..RunOptions::default()
            },
        )?;
        let arena = run
            .arenas
            .first()
            .ok_or_else(|| failed(GpuError::bounds("no arena came back")))?;
        let values = arena
            .values
            .as_ref()
            .ok_or_else(|| failed(GpuError::bounds("values were not kept")))?;
        write(&reduced, &mut |w| {
            for v in values {
                w.write_all(&v.to_le_bytes()).map_err(io(&reduced))?;
            }
            Ok(())
        })
        .map_err(failed)?;
        Ok(PeerFiles {
            addends,
            reduced,
            world: case.world(),
            len: n,
            digest: arena.digest(),
        })
    }
}

/// A reduce-scatter's arena on the loopback world: each rank's shard
/// hashed where it lies, then the shards gathered in rank order into rank
/// 0's arena (after the timed round), hashed whole and per chunk.
fn scattered_digests<T: WorldElem>(
    dev: &Device,
    main: &cudarc::driver::CudaStream,
    reader: &mut Reader,
    bufs: &WorldBuffers<T>,
    plan: &[crate::fold::Shard],
    dtype: Dtype,
    opts: &RunOptions,
) -> Result<ReducedArena, GpuError> {
    let policy = opts.nan_policy;
    let shard_digests = world::shard_digests(dev, reader, bufs, plan, dtype, policy)?;
    world::gather_shards(main, bufs, plan)?;
    let (gathered, values) = if bufs.len == 0 {
        let d = crate::digest::digest_chunked(&[], policy);
        (d, opts.keep_values.then(Vec::new))
    } else {
        reader.digest(dev, &bufs.ranks[0], dtype, policy, opts.keep_values, true)?
    };
    Ok(ReducedArena {
        len: bufs.len,
        rank_digests: Vec::new(),
        scattered: Some(crate::result::Scattered {
            shard_digests,
            gathered: gathered.sha256,
        }),
        chunks: gathered.chunks,
        values,
        differing: Vec::new(),
    })
}

/// Files written by [`CudaBackend::write_peer_files`].
#[derive(Debug, Clone, Serialize)]
pub struct PeerFiles {
    pub addends: PathBuf,
    pub reduced: PathBuf,
    pub world: usize,
    pub len: usize,
    /// Digest (canonical NaN policy) of the reduced arena.
    pub digest: crate::digest::Sha256,
}

fn upload_prog(dev: &Device, prog: &[u32]) -> Result<Option<DeviceBuffer<u32>>, GpuError> {
    if prog.is_empty() {
        return Ok(None);
    }
    let buf = DeviceBuffer::<u32>::alloc(&dev.ctx, prog.len())?;
    buf.upload(prog)?;
    Ok(Some(buf))
}

impl Backend for CudaBackend {
    fn name(&self) -> &'static str {
        NAME
    }

    fn environment(&self) -> crate::environment::BackendEnvironment {
        // The device's facts, its configuration, and what was mapped.
        let mut facts = match self.dev.environment() {
            serde_json::Value::Object(map) => map,
            _ => serde_json::Map::new(),
        };
        facts.insert(
            "config".into(),
            serde_json::to_value(&self.cfg).unwrap_or(serde_json::Value::Null),
        );
        facts.insert("rank_check".into(), self.cfg.rank_check.describe().into());
        let mut env = crate::environment::BackendEnvironment::new("cuda-loopback", facts);
        // With the kernel cache, the memo that keyed it (see `mapped`);
        // `--no-kernel-cache` (audit children) hashes every file afresh.
        env.libraries = Some(mapped::loaded_libraries_with(
            mapped::Hashing::with_kernel_cache(self.cfg.compile.disk_cache),
        ));
        env.env = Some(mapped::relevant_env());
        env
    }

    fn platform_facts(&self) -> serde_json::Map<String, serde_json::Value> {
        super::gpu_platform_facts()
    }

    fn skip_reason(&self, case: &Case) -> Option<String> {
        super::nccl_only(case)
    }

    /// Host memory for kept values, and each arena's buffers against the
    /// device's total memory (free memory is checked again per case, when
    /// other shapes' buffers have been given back).
    fn preflight(&self, case: &Case, opts: &RunOptions) -> Result<(), BackendError> {
        self.check_case(case, opts)?;
        let (_, total) = self
            .dev
            .memory()
            .map_err(|e| gpu_failed(case.id(), "memory query", e))?;
        let racing = self.copy.len() >= 2;
        let margin = 256u64 << 20;
        for &n in case.arenas() {
            let plan =
                shard_plan(n, case.world()).ok_or_else(|| unsupported(case.id(), "world = 0"))?;
            let nonempty = plan.iter().filter(|s| s.len > 0).count();
            let nbuf = nonempty.min(if racing { 2 } else { 1 });
            let needed = world::bytes_needed(case.world(), n, &plan, nbuf, case.dtype()) + margin;
            if needed > total {
                return Err(BackendError::OutOfMemory {
                    case: case.id().to_string(),
                    inputs: crate::backend::inputs_note(case),
                    what: "GPU memory (the device's total)",
                    needed,
                    available: total,
                });
            }
        }
        Ok(())
    }

    fn run_case(&mut self, case: &Case, opts: &RunOptions) -> Result<CaseRun, BackendError> {
        if let Some(why) = self.skip_reason(case) {
            return Err(super::unsupported(case.id(), why));
        }
        self.check_case(case, opts)?;
        // Keep only this case's buffers: other shapes would pin memory.
        self.worlds
            .retain(|&(w, n), _| w == case.world() && case.arenas().contains(&n));
        self.profiles.clear();
        self.in_place = 0;
        let (mode, prog) = super::fold_program(case)?;
        let prog_buf = upload_prog(&self.dev, &prog)
            .map_err(|e| gpu_failed(case.id(), "uploading the fold program", e))?;
        // Rank files stay pinned in place through the case's rounds.
        let mut pins = CasePins::new();
        let mut left = case.rounds().max(1);
        super::repeat_rounds(case.rounds(), || {
            left = left.saturating_sub(1);
            let last = left == 0;
            let prog_len = prog.len() as u32;
            self.round(case, opts, mode, &prog_buf, prog_len, &mut pins, last)
        })
    }
}

/// One arena of a round: what [`CudaBackend::arena_round`] needs beside
/// the case.
struct ArenaStep<'a> {
    a: usize,
    n: usize,
    mode: FoldMode,
    prog: u64,
    prog_len: u32,
    order: &'a [usize],
    scale: Option<f32>,
    racing: bool,
    /// The case's last round and arena: its rank files are unpinned
    /// during it.
    last: bool,
}

/// Each rank's file bytes pinned in place for a case's rounds and arenas
/// (every arena's tensor lies in the same pinned prefix of its file;
/// `None`: that rank goes through the staging buffers).
type CasePins<'c> = Vec<Option<PinnedInPlace<'c>>>;

/// The pinned staging buffers, reallocated when `n`'s float32s outgrow them.
fn staging_for<'a>(
    slot: &'a mut Option<[PinnedBuffer; 2]>,
    dev: &Device,
    n: usize,
) -> Result<&'a mut [PinnedBuffer; 2], GpuError> {
    if slot.as_ref().is_some_and(|s| s[0].len() < n) {
        *slot = None;
    }
    if slot.is_none() {
        let len = n.max(1);
        *slot = Some([
            PinnedBuffer::alloc(&dev.ctx, len)?,
            PinnedBuffer::alloc(&dev.ctx, len)?,
        ]);
    }
    slot.as_mut()
        .ok_or_else(|| GpuError::bounds("no staging buffers".to_string()))
}

/// The two pinned staging buffers a round's uploads take turns with,
/// allocated (or grown) only when a copy needs them: float32 files pinned
/// in place need them only for a page's worth at each stage's end.
struct Staging<'s> {
    slot: &'s mut Option<[PinnedBuffer; 2]>,
    dev: &'s Device,
    turn: usize,
}

impl Staging<'_> {
    /// The next buffer in turn, holding at least `n` float32s.
    fn take(&mut self, n: usize) -> Result<&mut PinnedBuffer, GpuError> {
        let k = self.turn % 2;
        self.turn += 1;
        Ok(&mut staging_for(self.slot, self.dev, n)?[k])
    }
}

/// Why rank files did not reach the device.
enum Upload {
    Read(crate::addends::AddendError),
    Gpu(GpuError),
}

impl From<GpuError> for Upload {
    fn from(e: GpuError) -> Self {
        Upload::Gpu(e)
    }
}

/// Elements per pinned staging buffer (32 MiB): small enough to pin
/// quickly (pinning a whole 128 MiB arena twice cost more than reading it),
/// large enough that each read runs on several threads.
const STAGE: usize = 1 << 23;

/// One arena's round from rank files.
struct FileRound<'a, 'c> {
    files: &'c crate::addends::AddendFiles,
    a: usize,
    dtype: Dtype,
    stream: &'a Arc<cudarc::driver::CudaStream>,
    /// Bytes sent up from where the files' pass keeps them.
    in_place: std::sync::atomic::AtomicU64,
}

/// A files' round reduced: when the upload and the files' end checks
/// ended, and the device ms of the folds.
struct Reduced {
    uploaded: Instant,
    fold_ms: f64,
    /// Rank 0's digest with when it was done, when it was made during the
    /// round, and the device's checks, started while it was made.
    rank0: Option<(world::HashedRank, Instant, Option<world::DeviceChecks>)>,
}

impl<'a, 'c> FileRound<'a, 'c> {
    /// Upload every rank's arena from its file a stage at a time, each
    /// shard folded as soon as its stages are in ([`world::run_round_staged`]);
    /// with `reader0`, rank 0's reduced arena is read back and hashed on
    /// its own thread as its sections become final, and the device's
    /// checks start once the last section is folded, beside that hash.
    /// The files' end checks come before anything is returned: a file that
    /// changed since its opening fails the round, whatever was folded.
    #[allow(clippy::too_many_arguments)]
    fn reduce<T: WorldElem>(
        &self,
        dev: &Device,
        copy: &[Arc<cudarc::driver::CudaStream>],
        bufs: &WorldBuffers<T>,
        spec: &RoundSpec<'_>,
        staging: &mut Option<[PinnedBuffer; 2]>,
        reader0: Option<&mut Reader>,
        opts: &RunOptions,
        (kept, last): (&mut CasePins<'c>, bool),
    ) -> Result<Reduced, Upload> {
        let (sections, heard) = std::sync::mpsc::channel();
        let mut staging = Staging {
            slot: staging,
            dev,
            turn: 0,
        };
        // Each rank's file bytes pinned where the pass keeps them, while
        // they go up that way (kept from the case's earlier rounds); after
        // its last round, unpinned once the upload's time is taken, beside
        // rank 0's hash.
        if kept.len() != bufs.world {
            *kept = (0..bufs.world)
                .map(|_| Some(PinnedInPlace::new(&dev.ctx)))
                .collect();
        }
        let pins = std::cell::RefCell::new(std::mem::take(kept));
        let pinned = &pins;
        let unpin = || {
            if last {
                pins.borrow_mut().clear();
            }
        };
        let upload = move |first: usize, len: usize| -> Result<(), Upload> {
            for (r, pin) in pinned.borrow_mut().iter_mut().enumerate() {
                if let Some(p) = pin {
                    if self.stage_in_place(r, first, len, bufs, p, &mut staging)? {
                        continue;
                    }
                    // Not kept as the arena's bytes, or not pinnable: the
                    // rest of this rank goes through the staging buffers.
                    *pin = None;
                }
                self.stage(r, first, len, bufs, staging.take(len)?)?;
            }
            Ok(())
        };
        let staged = |sections: &std::sync::mpsc::Sender<_>| -> Result<(f64, Instant), Upload> {
            let ms = world::run_round_staged(
                dev,
                self.stream,
                copy,
                bufs,
                spec,
                STAGE,
                upload,
                sections,
            )?;
            // Folded while the files were still being read: nothing is
            // reported unless every file was read to its end unchanged.
            for r in 0..bufs.world {
                self.files.read_through(r).map_err(Upload::Read)?;
            }
            Ok((ms, Instant::now()))
        };
        let Some(reader) = reader0 else {
            let done = staged(&sections);
            unpin();
            *kept = pins.into_inner();
            let (fold_ms, uploaded) = done?;
            return Ok(Reduced {
                uploaded,
                fold_ms,
                rank0: None,
            });
        };
        let out = std::thread::scope(|scope| {
            let hashing = std::thread::Builder::new()
                .name("foldprint-rank0-digest".into())
                .spawn_scoped(scope, move || {
                    let d = reader.digest_sections(
                        dev,
                        &bufs.ranks[0],
                        self.dtype,
                        opts.nan_policy,
                        opts.keep_values,
                        world::host_chunks::<T>(RankCheck::Device, bufs.len),
                        &heard,
                    );
                    let times = reader.last_times();
                    (d.map(|(d, v)| (d, v, times)), Instant::now())
                })
                .map_err(|e| Upload::Gpu(GpuError::bounds(format!("no digest thread: {e}"))))?;
            let done = staged(&sections);
            // Hung up: a digest still waiting for sections ends now.
            drop(sections);
            // The arenas are written: the device compares the ranks' copies
            // and digests rank 0's chunks while the host still hashes it
            // (rank 0 is hashed early only under the device check).
            let checks = done
                .is_ok()
                .then(|| {
                    world::DeviceChecks::start(
                        dev,
                        self.stream,
                        bufs,
                        opts.nan_policy,
                        RankCheck::Device,
                    )
                })
                .transpose();
            unpin();
            let (digest, at) = hashing
                .join()
                .map_err(|_| Upload::Gpu(GpuError::panicked("the rank-0 digest thread", None)))?;
            let (fold_ms, uploaded) = done?;
            Ok(Reduced {
                uploaded,
                fold_ms,
                rank0: Some((digest?, at, checks?)),
            })
        });
        *kept = pins.into_inner();
        out
    }

    /// Elements `first .. first + len` of rank `r`'s arena straight from the
    /// bytes the files' pass keeps, pinned in place by `pin`; the few
    /// elements past the last whole page pinned go through `staging`. `false`
    /// (nothing sent) when the bytes are not the arena's as they lie, or
    /// cannot be pinned.
    fn stage_in_place<'f, T: WorldElem>(
        &self,
        r: usize,
        first: usize,
        len: usize,
        bufs: &WorldBuffers<T>,
        pin: &mut PinnedInPlace<'f>,
        staging: &mut Staging<'_>,
    ) -> Result<bool, Upload>
    where
        'c: 'f,
    {
        if !self.dtype.is_f32() || size_of::<T>() != 4 {
            return Ok(false);
        }
        let end = first + len;
        let Some(kept) = self.files.kept_f32(r, self.a, end).map_err(Upload::Read)? else {
            return Ok(false);
        };
        if pin.pin_through(kept.bytes, kept.tensor + end * 4).is_err() {
            return Ok(false);
        }
        let split = (pin.pinned().saturating_sub(kept.tensor) / 4).clamp(first, end);
        let dst = bufs.ranks[r].slice(first, split - first)?;
        // SAFETY: part of rank r's arena of this context, which the round
        // reads only later on this same stream.
        unsafe { pin.upload_async(kept.tensor + first * 4, dst, self.stream) }?;
        self.in_place.fetch_add(
            (split - first) as u64 * 4,
            std::sync::atomic::Ordering::Relaxed,
        );
        if split < end {
            let stage = staging.take((PIN_ALIGN / 4 + 1).max(end - split))?;
            self.stage(r, split, end - split, bufs, stage)?;
        }
        Ok(true)
    }

    /// Elements `first .. first + len` of rank `r`'s arena from its file to
    /// the device through one pinned `stage` buffer, on the round's stream.
    fn stage<T: WorldElem>(
        &self,
        r: usize,
        first: usize,
        len: usize,
        bufs: &WorldBuffers<T>,
        stage: &mut PinnedBuffer,
    ) -> Result<(), Upload> {
        // Waits for this buffer's previous copy (two stages ago).
        if self.dtype.is_f32() {
            let host = stage.values_mut::<f32>(len)?;
            self.files
                .read_range(r, self.a, first, host)
                .map_err(Upload::Read)?;
        } else {
            // The file's tensors are the dtype's (the case checked):
            // their stored bits go up as they are, 2 bytes each.
            let host = stage.values_mut::<u16>(len)?;
            self.files
                .read_bits16_range(r, self.a, first, host)
                .map_err(Upload::Read)?;
        }
        let dst = bufs.ranks[r].slice(first, len)?;
        // SAFETY: part of rank r's arena of this context, which the round
        // reads only later on this same stream.
        unsafe { stage.upload_async(dst, self.stream) }?;
        Ok(())
    }
}

#[cfg(test)]
mod driver_error_tests {
    use super::{gpu_failed, GpuError};
    use crate::exit::{ExitCode, HasExitCode};
    use cudarc::driver::sys::cudaError_enum as C;

    fn driver(code: C) -> GpuError {
        GpuError::Driver {
            op: "cuMemAlloc of 4096 bytes".into(),
            code,
        }
    }

    #[test]
    fn driver_errors_are_never_failed_checks() {
        let oom = gpu_failed(
            "c",
            "allocating rank arenas",
            driver(C::CUDA_ERROR_OUT_OF_MEMORY),
        );
        assert_eq!(oom.exit_code(), ExitCode::Unavailable);
        let lost = gpu_failed("c", "round", driver(C::CUDA_ERROR_LAUNCH_FAILED));
        assert_eq!(lost.exit_code(), ExitCode::Infrastructure);
        assert!(lost
            .to_string()
            .contains("case `c`: round: cuMemAlloc of 4096 bytes: CUDA_ERROR_LAUNCH_FAILED"));
    }

    #[test]
    fn a_tree_the_device_cannot_fold_is_no_failed_check() {
        let (_, e) = (
            (),
            crate::gpu::kernels::fold_program(crate::fold::Contract::NcclAllreduce, 3, &[0, 1, 2])
                .unwrap_err(),
        );
        let err = super::unsupported("c", e);
        assert_eq!(err.exit_code(), ExitCode::Unavailable);
    }
}
