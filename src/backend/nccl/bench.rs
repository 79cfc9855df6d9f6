//! `bench --backend nccl`: the fixed-order reduction next to
//! ncclAllReduce on the same buffers (nccl-tests conventions).

use super::dataflow::{on_every_rank, rank_arena, ArenaJob};
use super::NcclBackend;
use crate::backend::{BackendError, RunOptions};
use crate::experiment::Case;
use crate::fold::Contract;
use crate::gpu::kernels::FoldMode;

/// One size of the NCCL benchmark (nccl-tests conventions).
#[derive(Debug, Clone, serde::Serialize)]
pub struct NcclBenchRow {
    pub bytes: u64,
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
}

impl NcclBackend {
    /// Time the fixed-order reduction next to ncclAllReduce on the same
    /// buffers for each arena length in `sizes` (elements).
    pub fn bench(
        &mut self,
        sizes: &[usize],
        iters: usize,
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
                .build()
                .map_err(|e| crate::backend::unsupported(&id, e.to_string()))?;
            let mut median =
                |case: &Case, timing_only: bool, reps: usize| -> Result<f64, BackendError> {
                    let mut times = Vec::with_capacity(reps);
                    for _ in 0..reps {
                        let job = ArenaJob {
                            case,
                            arena: 0,
                            n,
                            world: self.world.size(),
                            mode: FoldMode::Fixed,
                            variant: self.cfg.cuda.variant,
                            cuda: &self.cfg.cuda,
                            opts: &RunOptions::default(),
                            timing_only,
                        };
                        let (dog, timeout) = (&self.watchdog, self.cfg.timeout);
                        let outs = on_every_rank(&mut self.ranks, |ctx| {
                            rank_arena(ctx, &job, 0, 0, dog, timeout)
                        });
                        let mut worst = 0f64;
                        for o in outs {
                            worst = worst.max(o.map_err(|e| e.into_backend(case.id()))?.reduce_ms);
                        }
                        times.push(worst);
                    }
                    times.sort_by(f64::total_cmp);
                    Ok(times[times.len() / 2])
                };
            // Warm up (and fill the arena) once, then time.
            median(&case, false, 1)?;
            let fixed_ms = median(&case, true, iters)?;
            let case = case.with_contract(Contract::NcclAllreduce);
            median(&case, true, 2)?;
            let allreduce_ms = median(&case, true, iters)?;
            let bytes = n as u64 * 4;
            let w = self.world.size() as f64;
            let factor = 2.0 * (w - 1.0) / w;
            let bw = |ms: f64| bytes as f64 / (ms * 1e-3) / 1e9;
            rows.push(NcclBenchRow {
                bytes,
                world: self.world.size(),
                fixed_ms,
                allreduce_ms,
                fixed_algbw: bw(fixed_ms),
                fixed_busbw: bw(fixed_ms) * factor,
                allreduce_algbw: bw(allreduce_ms),
                allreduce_busbw: bw(allreduce_ms) * factor,
            });
        }
        Ok(rows)
    }
}
