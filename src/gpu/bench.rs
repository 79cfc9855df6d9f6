//! The fold kernel alone, timed with CUDA events, next to a device-to-device
//! copy of the same number of bytes measured in the same run.

use super::device::row_stride_of;
use super::device::{Device, FoldArgs, LaunchTuning};
use super::error::GpuError;
use super::kernels::{
    CompileOptions, Fold16Trial, FoldMode, KernelVariant, LoadedProgram, FOLD16_TRIALS,
};
use super::mem::{copy_d2d, ArenaElem, DeviceBuffer};
use crate::data::{Distribution, Lane};
use crate::dtype::Dtype;
use crate::fold::fold_fixed;
use cudarc::driver::{sys::CUevent_flags, CudaStream};
use serde::Serialize;
use std::sync::Arc;

#[derive(Debug, Clone, Serialize)]
pub struct BenchConfig {
    pub ordinal: usize,
    /// (W, n) shapes.
    pub shapes: Vec<(usize, usize)>,
    pub warmup: usize,
    pub iters: usize,
    pub distribution: Distribution,
    pub seed: u64,
    pub compile: CompileOptions,
    pub tuning: LaunchTuning,
    /// Extra `fast` rows with these launch shapes (a tuning sweep).
    pub extra_fast: Vec<LaunchTuning>,
    /// What the rows and the output hold; the copy moves as many bytes.
    pub dtype: Dtype,
    /// For 16-bit dtypes: also every shape of `fold16_trials.cu`
    /// (rows `trial NAME`), with `tuning`.
    pub fold16_trials: bool,
}

impl Default for BenchConfig {
    fn default() -> Self {
        BenchConfig {
            ordinal: 0,
            shapes: vec![
                (8, 1 << 25),
                (16, 1 << 22),
                (32, 1 << 21),
                (64, 1 << 20),
                (8, 4096),
            ],
            warmup: 10,
            iters: 100,
            distribution: Distribution::MixedMagnitude,
            seed: 1,
            compile: CompileOptions::default(),
            tuning: LaunchTuning::default(),
            // The shape earlier builds used from W = 32 (before the chains
            // batched their loads), timed in the same run for comparison.
            extra_fast: vec![LaunchTuning {
                fast_block: 1024,
                fast_blocks_per_sm: 8,
                ..LaunchTuning::default()
            }],
            dtype: Dtype::F32,
            fold16_trials: false,
        }
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct BenchRow {
    pub world: usize,
    pub n: usize,
    /// The element type (`f32`, `bf16`, `f16`).
    pub dtype: Dtype,
    /// `seed`, `fast` or `d2d-copy`.
    pub what: String,
    pub median_ms: f64,
    pub min_ms: f64,
    /// Bytes counted: (W+1)·n·(bytes per element) (a copy moves half of
    /// that each way).
    pub bytes: u64,
    /// bytes / median time, in TB/s (10^12 bytes per second).
    pub effective_tb_s: f64,
    pub iters: usize,
    /// For kernels: output bits equal to the seed variant's and to the host
    /// fold on a sample; `None` for the copy.
    pub bits_ok: Option<bool>,
}

#[derive(Debug, Clone, Serialize)]
pub struct BenchReport {
    pub device: String,
    pub driver: String,
    pub nvrtc: String,
    pub target: String,
    pub options: Vec<String>,
    pub tuning: LaunchTuning,
    pub rows: Vec<BenchRow>,
    /// Where the backend start went (probe, context, kernels).
    pub startup: super::Startup,
    /// Per program: from the kernel cache or compiled.
    pub kernel_cache: Vec<super::kernels::ModuleOrigin>,
}

fn median(mut v: Vec<f64>) -> (f64, f64) {
    v.sort_by(f64::total_cmp);
    let min = v.first().copied().unwrap_or(f64::NAN);
    let mid = if v.is_empty() {
        f64::NAN
    } else if v.len() % 2 == 1 {
        v[v.len() / 2]
    } else {
        (v[v.len() / 2 - 1] + v[v.len() / 2]) / 2.0
    };
    (mid, min)
}

/// Time `launch` `iters` times, each between its own pair of events.
fn time_each(
    stream: &Arc<CudaStream>,
    warmup: usize,
    iters: usize,
    mut launch: impl FnMut() -> Result<(), GpuError>,
) -> Result<Vec<f64>, GpuError> {
    let sync = |e| GpuError::driver("cuStreamSynchronize", e);
    let record = |e| GpuError::driver("cuEventRecord", e);
    for _ in 0..warmup {
        launch()?;
    }
    stream.synchronize().map_err(sync)?;
    let timed = Some(CUevent_flags::CU_EVENT_DEFAULT);
    let mut pairs = Vec::with_capacity(iters);
    for _ in 0..iters {
        let a = stream.record_event(timed).map_err(record)?;
        launch()?;
        let b = stream.record_event(timed).map_err(record)?;
        pairs.push((a, b));
    }
    stream.synchronize().map_err(sync)?;
    pairs
        .iter()
        .map(|(a, b)| {
            a.elapsed_ms(b)
                .map(f64::from)
                .map_err(|e| GpuError::driver("cuEventElapsedTime", e))
        })
        .collect()
}

/// Measure the fold (`seed` and `fast`) and a D2D copy for each shape.
pub fn bench_fold(cfg: &BenchConfig) -> Result<BenchReport, GpuError> {
    let started = std::time::Instant::now();
    let p = super::probe();
    let probe_ms = started.elapsed().as_secs_f64() * 1e3;
    if !p.usable {
        return Err(GpuError::missing(format!(
            "CUDA is not usable here: {}",
            p.reason()
        )));
    }
    let mut dev = Device::open(cfg.ordinal, cfg.compile)?;
    dev.startup.probe = probe_ms;
    let stream = dev.new_stream()?;
    let trials = if cfg.fold16_trials && !cfg.dtype.is_f32() {
        Some(dev.load_fold16_trials()?)
    } else {
        None
    };
    let mut rows = Vec::new();
    for &(w, n) in &cfg.shapes {
        rows.extend(if cfg.dtype.is_f32() {
            bench_shape::<f32>(&dev, &stream, cfg, w, n, None)?
        } else {
            bench_shape::<u16>(&dev, &stream, cfg, w, n, trials.as_ref())?
        });
    }
    Ok(BenchReport {
        device: format!(
            "{} (sm_{}{}, {} SMs)",
            dev.info.name,
            dev.info.compute_capability.0,
            dev.info.compute_capability.1,
            dev.info.sm_count
        ),
        driver: super::probe::version_text(dev.driver_version),
        nvrtc: format!("{}.{}", dev.nvrtc_version.0, dev.nvrtc_version.1),
        target: dev.fold_target.arch_option(),
        options: dev.fold.program.image.options.clone(),
        tuning: cfg.tuning,
        rows,
        startup: dev.startup,
        kernel_cache: [&dev.fold.program.origin, &dev.generator.origin]
            .into_iter()
            .chain(trials.as_ref().map(|t| &t.origin))
            .cloned()
            .collect(),
    })
}

fn bench_shape<T: ArenaElem>(
    dev: &Device,
    stream: &Arc<CudaStream>,
    cfg: &BenchConfig,
    w: usize,
    n: usize,
    trials: Option<&LoadedProgram>,
) -> Result<Vec<BenchRow>, GpuError> {
    let dtype = cfg.dtype;
    let size = T::BYTES as usize;
    let bytes = ((w + 1) * n * size) as u64;
    let (free, _) = dev.memory()?;
    let ld = row_stride_of(n, dtype);
    let copy_len = (w + 1) * n / 2;
    let need = ((w * ld + 2 * n + copy_len) * size) as u64;
    if need > free {
        return Err(GpuError::missing(format!(
            "bench W={w} n={n} needs {need} bytes of device memory, {free} free"
        )));
    }
    let stacked = DeviceBuffer::<T>::alloc(&dev.ctx, w * ld)?;
    let out_seed = DeviceBuffer::<T>::alloc(&dev.ctx, n)?;
    let out_fast = DeviceBuffer::<T>::alloc(&dev.ctx, n)?;
    let copy_dst = DeviceBuffer::<T>::alloc(&dev.ctx, copy_len)?;
    for r in 0..w {
        let row = stacked.slice(r * ld, n)?;
        // SAFETY: `row` is a checked view of n elements of the dtype.
        unsafe {
            dev.generate(
                row.ptr(),
                n as u64,
                0,
                cfg.distribution,
                cfg.seed,
                r as u32,
                0,
                dtype,
                stream,
            )?;
        }
    }
    stream
        .synchronize()
        .map_err(|e| GpuError::driver("cuStreamSynchronize", e))?;

    let mut rows = Vec::new();
    let row = |what: &str, times: Vec<f64>, bits_ok| {
        let (med, min) = median(times);
        BenchRow {
            world: w,
            n,
            dtype,
            what: what.into(),
            median_ms: med,
            min_ms: min,
            bytes,
            effective_tb_s: bytes as f64 / (med * 1e-3) / 1e12,
            iters: cfg.iters,
            bits_ok,
        }
    };
    // The kernel of a run: a variant of the fold program, or a trial.
    type Kernel = Result<KernelVariant, Fold16Trial>;
    let mut runs: Vec<(String, Kernel, &DeviceBuffer<T>, LaunchTuning)> = vec![
        (
            "seed".into(),
            Ok(KernelVariant::PerElement),
            &out_seed,
            cfg.tuning,
        ),
        (
            "fast".into(),
            Ok(KernelVariant::Fast),
            &out_fast,
            cfg.tuning,
        ),
    ];
    for t in &cfg.extra_fast {
        let label = format!("fast {}x{}/SM", t.fast_block, t.fast_blocks_per_sm);
        runs.push((label, Ok(KernelVariant::Fast), &out_fast, *t));
    }
    if trials.is_some() {
        for t in FOLD16_TRIALS {
            let label = format!("trial {}", t.entry.trim_start_matches("fp_fold16_"));
            runs.push((label, Err(t), &out_fast, cfg.tuning));
        }
    }
    let mut outputs = Vec::new();
    for (label, kernel, out, tuning) in runs {
        let args = FoldArgs {
            out: out.ptr(),
            stacked: stacked.ptr(),
            ld: ld as u64,
            len: n as u64,
            world: w as u32,
            prog: 0,
            prog_len: 0,
            scale: None,
            dtype,
        };
        // Each run's output starts as garbage, so a kernel that writes
        // nothing cannot pass on the previous run's bits.
        out.upload(&T::from_carriers(
            &vec![f32::from_bits(0x7FA5_A5A5); n],
            dtype,
        ))?;
        let times = time_each(stream, cfg.warmup, cfg.iters, || match (kernel, trials) {
            // SAFETY: buffers sized above, both at phase 0.
            (Ok(variant), _) => unsafe {
                dev.fold(variant, FoldMode::Fixed, &args, &tuning, stream)
            },
            // SAFETY: the same buffers; `trials` was loaded for this device.
            (Err(t), Some(p)) => unsafe { dev.fold16_trial(p, t, &args, &tuning, stream) },
            (Err(_), None) => Err(GpuError::bounds("a trial row without the trials program")),
        })?;
        let mut host = Vec::with_capacity(n);
        T::carry(&out.to_host()?, dtype, &mut host);
        outputs.push((label, times, host));
    }
    // The copy: half the counted bytes read, half written.
    let (to, from) = (copy_dst.view(), stacked.slice(0, copy_len)?);
    let times = time_each(stream, cfg.warmup, cfg.iters, || {
        // SAFETY: checked views of two distinct buffers of this context.
        unsafe { copy_d2d(to, from, stream) }
    })?;

    let lanes: Vec<Lane> = (0..w as u32)
        .map(|r| Lane::new(cfg.distribution, cfg.seed, r, 0))
        .collect();
    let _ieee = crate::fpenv::IeeeMode::enter();
    let sample_ok = |vals: &[f32]| {
        let step = (n / 4096).max(1);
        let mut slots = vec![0f32; w];
        (0..n).step_by(step).chain(n.saturating_sub(7)..n).all(|i| {
            for (s, l) in slots.iter_mut().zip(&lanes) {
                *s = dtype.quantize(l.value(i as u64));
            }
            // The float32 chain, then one rounding to the dtype.
            let canon =
                |v: f32| crate::digest::NanPolicy::Canonical.apply_in(dtype, dtype.narrow(v));
            canon(vals[i]) == canon(fold_fixed(&slots))
        })
    };
    let seed_vals = outputs[0].2.clone();
    for (label, times, host) in outputs {
        let same = host
            .iter()
            .zip(&seed_vals)
            .all(|(a, b)| a.to_bits() == b.to_bits());
        rows.push(row(&label, times, Some(same && sample_ok(&host))));
    }
    rows.push(row("d2d-copy", times, None));
    Ok(rows)
}
