//! The CUDA bench: the fold kernel alone ([`crate::gpu::bench`]) and where
//! an end-to-end case's time goes on the CUDA backend.

use super::median;
use crate::backend::cuda::world::DigestProfile;
use crate::backend::cuda::CudaBackend;
use crate::backend::{Backend, BackendError, RoundTimings, RunOptions};
use crate::data::Distribution;
use crate::experiment::{Case, DeliveryOrder};
use crate::fold::Contract;
use crate::gpu::{DeviceConfig, GpuError, RankCheck};
use std::time::Instant;

pub use crate::gpu::bench::{bench_fold, BenchConfig, BenchReport, BenchRow};

/// The kernel rows of the default shapes in `dtype`, with or without the
/// disk cache.
pub fn kernel_rows(
    kernel_cache: bool,
    dtype: crate::dtype::Dtype,
) -> Result<BenchReport, GpuError> {
    let mut cfg = BenchConfig::default();
    cfg.compile.disk_cache = kernel_cache;
    cfg.dtype = dtype;
    bench_fold(&cfg)
}

/// One end-to-end measurement of a case on the CUDA backend.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Phases {
    pub rank_check: &'static str,
    pub world: usize,
    pub n: usize,
    /// `CudaBackend::new`: context, library probe, NVRTC (or cache).
    pub backend_start_ms: f64,
    /// Medians over the rounds after the first (the first allocates).
    pub generate_ms: f64,
    pub reduce_ms: f64,
    pub digest_ms: f64,
    pub round_ms: f64,
    /// The first round, allocations included: what a one-round `run` waits.
    pub first_round_ms: f64,
    pub rounds: u32,
    /// Elements per pinned read-back chunk.
    pub read_chunk: usize,
    /// Where the digest went (medians over the same rounds).
    pub digest: DigestSplit,
}

/// Medians of [`DigestProfile`] fields.
#[derive(Debug, Clone, serde::Serialize)]
pub struct DigestSplit {
    pub rank_diff_ms: f64,
    pub copy_wait_ms: f64,
    pub nan_scan_ms: f64,
    pub device_nan_scan_ms: f64,
    pub hash_ms: f64,
    pub device_chunks_wait_ms: f64,
}

/// Where a case's time goes on this machine: one case's phases under both
/// rank checks (and the device check with the older read chunk), each in a
/// fresh backend.
pub fn end_to_end(
    world: usize,
    n: usize,
    rounds: u32,
    kernel_cache: bool,
) -> Result<Vec<Phases>, BackendError> {
    let case = Case::builder(world, [n])
        .experiment("bench")
        .id("end-to-end")
        .order(DeliveryOrder::Ascending)
        .seed(1)
        .distribution(Distribution::Uniform)
        .contract(Contract::FixedOrder)
        .rounds(rounds)
        .build()
        .map_err(|e| crate::backend::unsupported("end-to-end", e.to_string()))?;
    let mut out = Vec::new();
    let default_chunk = DeviceConfig::default().chunk;
    let shapes = [
        (RankCheck::Device, default_chunk),
        // The 8 MiB chunk earlier builds used, for comparison.
        (RankCheck::Device, 1 << 21),
        (RankCheck::Host, default_chunk),
    ];
    for (check, chunk) in shapes {
        let t = Instant::now();
        let mut cfg = DeviceConfig {
            rank_check: check,
            chunk,
            ..DeviceConfig::default()
        };
        cfg.compile.disk_cache = kernel_cache;
        let mut be = CudaBackend::new(cfg)?;
        let backend_start_ms = t.elapsed().as_secs_f64() * 1e3;
        let run = be.run_case(&case, &RunOptions::default())?;
        let steady = &run.rounds[1.min(run.rounds.len() - 1)..];
        let pick = |f: fn(&RoundTimings) -> f64| median(steady.iter().map(f).collect());
        let profiles = be.digest_profiles();
        let steady_profiles = &profiles[1.min(profiles.len().saturating_sub(1))..];
        let split = |f: fn(&DigestProfile) -> f64| median(steady_profiles.iter().map(f).collect());
        let digest = DigestSplit {
            rank_diff_ms: split(|p| p.rank_diff_ms),
            copy_wait_ms: split(|p| p.read.copy_wait_ms),
            nan_scan_ms: split(|p| p.read.nan_scan_ms),
            device_nan_scan_ms: split(|p| p.read.device_nan_scan_ms),
            hash_ms: split(|p| p.read.hash_ms),
            device_chunks_wait_ms: split(|p| p.device_chunks_wait_ms),
        };
        out.push(Phases {
            rank_check: match check {
                RankCheck::Device => "device",
                RankCheck::Host => "host",
            },
            world,
            n,
            backend_start_ms,
            generate_ms: pick(|r| r.generate_ms),
            reduce_ms: pick(|r| r.reduce_ms),
            digest_ms: pick(|r| r.digest_ms),
            round_ms: pick(|r| r.total_ms),
            first_round_ms: run.rounds[0].total_ms,
            rounds,
            read_chunk: chunk,
            digest,
        });
    }
    Ok(out)
}
