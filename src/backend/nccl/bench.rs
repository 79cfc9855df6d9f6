//! `bench --backend nccl`: the fixed-order reduction next to
//! ncclAllReduce on the same buffers (nccl-tests conventions), with the
//! bits of both results checked: fixed-order against the CPU oracle,
//! NCCL's sum against fixed-order.

use super::dataflow::{on_every_rank, rank_arena, ArenaJob, RankOut};
use super::NcclBackend;
use crate::backend::{BackendError, RunOptions};
use crate::dtype::Dtype;
use crate::experiment::Case;
use crate::fold::Contract;
use crate::gpu::kernels::FoldMode;
use rayon::prelude::*;

/// One size of the NCCL benchmark (nccl-tests conventions).
#[derive(Debug, Clone, serde::Serialize)]
pub struct NcclBenchRow {
    /// Bytes of one rank's buffer (`count` elements of `dtype`).
    pub bytes: u64,
    pub count: u64,
    pub dtype: Dtype,
    pub world: usize,
    /// Median milliseconds of one fixed-order reduction (exchange, fold,
    /// redistribution) and of one in-place ncclAllReduce, same buffers.
    pub fixed_ms: f64,
    pub allreduce_ms: f64,
    /// algbw = bytes / time; busbw = algbw x 2(W-1)/W, in GB/s.
    pub fixed_algbw: f64,
    pub fixed_busbw: f64,
    pub allreduce_algbw: f64,
    pub allreduce_busbw: f64,
    /// Elements of rank 0's fixed-order result whose bits differ from the
    /// CPU oracle's (must be 0); known on the reporting rank only.
    pub fixed_vs_oracle: Option<u64>,
    /// Ranks whose fixed-order copy's digest differs from rank 0's (must
    /// be 0).
    pub fixed_ranks_differing: usize,
    /// Elements of NCCL's sum (rank 0's copy) whose bits differ from
    /// fixed-order's: its drift. Reporting rank only.
    pub allreduce_vs_fixed: Option<u64>,
}

/// One size of the reduce-scatter benchmark: fixed-order reduce-scatter
/// next to ncclReduceScatter and the fixed-order all-reduce of the same
/// arena, on the same buffers.
#[derive(Debug, Clone, serde::Serialize)]
pub struct NcclScatterRow {
    /// Bytes of one rank's whole arena (`count` elements of `dtype`); each
    /// rank ends with a shard of about count / W of them.
    pub bytes: u64,
    pub count: u64,
    pub dtype: Dtype,
    pub world: usize,
    /// Median milliseconds of one fixed-order reduce-scatter (exchange and
    /// fold, no redistribution), of one in-place ncclReduceScatter (none
    /// where W does not divide `count`: NCCL needs equal shards), and of
    /// one fixed-order all-reduce of the same arena.
    pub fixed_ms: f64,
    pub reducescatter_ms: Option<f64>,
    pub allreduce_ms: f64,
    /// algbw = bytes / time; busbw = algbw x (W-1)/W, in GB/s.
    pub fixed_algbw: f64,
    pub fixed_busbw: f64,
    pub reducescatter_algbw: Option<f64>,
    pub reducescatter_busbw: Option<f64>,
    /// Elements of the fixed-order shards, gathered on rank 0, whose bits
    /// differ from the CPU oracle's (must be 0); reporting rank only.
    pub fixed_vs_oracle: Option<u64>,
    /// Elements of NCCL's shards, gathered on rank 0, whose bits differ
    /// from fixed-order's: its drift. Reporting rank only.
    pub reducescatter_vs_fixed: Option<u64>,
}

/// Elements whose bits differ between `a` and `b` (same length).
fn differing(a: &[f32], b: &[f32]) -> u64 {
    a.par_chunks(1 << 16)
        .zip(b.par_chunks(1 << 16))
        .map(|(x, y)| {
            x.iter()
                .zip(y)
                .filter(|(p, q)| p.to_bits() != q.to_bits())
                .count() as u64
        })
        .sum()
}

/// Elements of `values` (rank 0's result of `case`) that differ from the
/// CPU oracle's, computed column by column in bounded memory.
fn differing_from_oracle(case: &Case, values: &[f32]) -> Option<u64> {
    const SPAN: usize = 1 << 16;
    values
        .par_chunks(SPAN)
        .enumerate()
        .map(|(k, got)| {
            let mut want = vec![0f32; got.len()];
            crate::backend::cpu::reduced_range(case, 0, k * SPAN, &mut want)?;
            Some(differing(got, &want))
        })
        .sum()
}

impl NcclBackend {
    /// Time the fixed-order reduction next to ncclAllReduce on the same
    /// buffers for each arena length in `sizes` (elements of `dtype`), and
    /// check the bits of one fresh result of each.
    pub fn bench(
        &mut self,
        sizes: &[usize],
        iters: usize,
        dtype: Dtype,
    ) -> Result<Vec<NcclBenchRow>, BackendError> {
        let mut rows = Vec::new();
        for &n in sizes {
            let id = format!("bench-{n}");
            let case = Case::builder(self.world.size(), [n])
                .experiment("bench")
                .id(&id)
                .seed(1)
                .distribution(crate::data::Distribution::MixedMagnitude)
                .contract(Contract::FixedOrder)
                .dtype(Some(dtype))
                .build()
                .map_err(|e| crate::backend::unsupported(&id, e.to_string()))?;
            let median = |be: &mut Self, case: &Case| -> Result<f64, BackendError> {
                let mut times = Vec::with_capacity(iters);
                for _ in 0..iters {
                    let outs = be.bench_once(case, n, true)?;
                    times.push(outs.iter().map(|o| o.reduce_ms).fold(0f64, f64::max));
                }
                Ok(crate::bench::median(times))
            };
            // A fresh result of each (generated, reduced, read back), then
            // the timed repetitions on the same buffers.
            let fresh = |outs: Vec<RankOut>| {
                let digests: Vec<_> = outs.iter().map(|o| o.digest.sha256).collect();
                let values = outs.into_iter().find_map(|o| o.values);
                (digests, values)
            };
            let (digests, fixed) = fresh(self.bench_once(&case, n, false)?);
            let fixed_ms = median(self, &case)?;
            let nccl = case.clone().with_contract(Contract::NcclAllreduce);
            let (_, summed) = fresh(self.bench_once(&nccl, n, false)?);
            let allreduce_ms = median(self, &nccl)?;
            let all = self
                .gather(&digests)
                .map_err(|e| e.into_backend(case.id()))?;
            let fixed_ranks_differing = all.iter().filter(|d| **d != all[0]).count();
            let fixed_vs_oracle = fixed
                .as_deref()
                .and_then(|v| differing_from_oracle(&case, v));
            let allreduce_vs_fixed = match (&fixed, &summed) {
                (Some(f), Some(s)) => Some(differing(f, s)),
                _ => None,
            };
            let bytes = (n * dtype.bytes()) as u64;
            let w = self.world.size() as f64;
            let factor = 2.0 * (w - 1.0) / w;
            let bw = |ms: f64| bytes as f64 / (ms * 1e-3) / 1e9;
            rows.push(NcclBenchRow {
                bytes,
                count: n as u64,
                dtype,
                world: self.world.size(),
                fixed_ms,
                allreduce_ms,
                fixed_algbw: bw(fixed_ms),
                fixed_busbw: bw(fixed_ms) * factor,
                allreduce_algbw: bw(allreduce_ms),
                allreduce_busbw: bw(allreduce_ms) * factor,
                fixed_vs_oracle,
                fixed_ranks_differing,
                allreduce_vs_fixed,
            });
        }
        Ok(rows)
    }

    /// Time the fixed-order reduce-scatter next to ncclReduceScatter and
    /// the fixed-order all-reduce of the same arena, for each length in
    /// `sizes`, and check the bits of one fresh result of each
    /// reduce-scatter (its shards gathered to rank 0, outside the timing).
    pub fn bench_scatter(
        &mut self,
        sizes: &[usize],
        iters: usize,
        dtype: Dtype,
    ) -> Result<Vec<NcclScatterRow>, BackendError> {
        use crate::fold::Collective;
        let mut rows = Vec::new();
        let world = self.world.size();
        for &n in sizes {
            let id = format!("bench-scatter-{n}");
            let all_reduce = Case::builder(world, [n])
                .experiment("bench")
                .id(&id)
                .seed(1)
                .distribution(crate::data::Distribution::MixedMagnitude)
                .contract(Contract::FixedOrder)
                .dtype(Some(dtype))
                .build()
                .map_err(|e| crate::backend::unsupported(&id, e.to_string()))?;
            let scatter = all_reduce
                .to_builder()
                .collective(Collective::ReduceScatter)
                .build()
                .map_err(|e| crate::backend::unsupported(&id, e.to_string()))?;
            let median = |be: &mut Self, case: &Case| -> Result<f64, BackendError> {
                let mut times = Vec::with_capacity(iters);
                for _ in 0..iters {
                    let outs = be.bench_once(case, n, true)?;
                    times.push(outs.iter().map(|o| o.reduce_ms).fold(0f64, f64::max));
                }
                Ok(crate::bench::median(times))
            };
            let gathered = |outs: Vec<RankOut>| outs.into_iter().find_map(|o| o.values);
            let fixed = gathered(self.bench_once(&scatter, n, false)?);
            let fixed_ms = median(self, &scatter)?;
            let nccl = scatter.clone().with_contract(Contract::NcclAllreduce);
            let (reducescatter_ms, theirs) = if super::control_skip_reason(&nccl).is_none() {
                let theirs = gathered(self.bench_once(&nccl, n, false)?);
                (Some(median(self, &nccl)?), theirs)
            } else {
                (None, None)
            };
            let allreduce_ms = median(self, &all_reduce)?;
            let fixed_vs_oracle = fixed
                .as_deref()
                .and_then(|v| differing_from_oracle(&scatter, v));
            let reducescatter_vs_fixed = match (&fixed, &theirs) {
                (Some(f), Some(t)) => Some(differing(f, t)),
                _ => None,
            };
            let bytes = (n * dtype.bytes()) as u64;
            let factor = (world as f64 - 1.0) / world as f64;
            let bw = |ms: f64| bytes as f64 / (ms * 1e-3) / 1e9;
            rows.push(NcclScatterRow {
                bytes,
                count: n as u64,
                dtype,
                world,
                fixed_ms,
                reducescatter_ms,
                allreduce_ms,
                fixed_algbw: bw(fixed_ms),
                fixed_busbw: bw(fixed_ms) * factor,
                reducescatter_algbw: reducescatter_ms.map(bw),
                reducescatter_busbw: reducescatter_ms.map(|ms| bw(ms) * factor),
                fixed_vs_oracle,
                reducescatter_vs_fixed,
            });
        }
        Ok(rows)
    }

    /// Every local rank's outcome of one arena job of `case`, in rank
    /// order; rank 0 keeps its values unless `timing_only`.
    fn bench_once(
        &mut self,
        case: &Case,
        n: usize,
        timing_only: bool,
    ) -> Result<Vec<RankOut>, BackendError> {
        let keep = RunOptions {
            keep_values: true,
            ..RunOptions::default()
        };
        let job = ArenaJob {
            case,
            arena: 0,
            n,
            world: self.world.size(),
            mode: FoldMode::Fixed,
            variant: self.cfg.cuda.variant,
            cuda: &self.cfg.cuda,
            opts: &keep,
            timing_only,
        };
        let (dog, timeout) = (&self.watchdog, self.cfg.timeout);
        on_every_rank(&mut self.ranks, |ctx| {
            rank_arena(ctx, &job, 0, 0, dog, timeout)
        })
        .into_iter()
        .map(|o| o.map_err(|e| e.into_backend(case.id())))
        .collect()
    }
}
