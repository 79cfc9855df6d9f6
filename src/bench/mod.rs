//! What `foldprint bench` measures, as plain rows; the binary only prints
//! them. The kernel timing itself stays in [`crate::gpu::bench`] and the
//! NCCL sweep in [`crate::backend::nccl::bench`], next to the internals
//! they use.

pub mod cpu;
pub mod cuda;
pub mod inputs;
pub mod nccl;

use crate::backend::BackendError;

/// Why a CPU bench row could not be measured.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    #[error("building a thread pool: {0}")]
    ThreadPool(#[source] rayon::ThreadPoolBuildError),
    #[error(transparent)]
    Backend(#[from] BackendError),
    /// The measured case is not one foldprint runs (e.g. `--world 0`).
    #[error("the measured case: {0}")]
    Case(#[from] crate::experiment::CaseError),
    /// Writing the benchmark's rank files.
    #[error("writing the benchmark's rank files: {0}")]
    Io(#[source] std::io::Error),
    #[error("the benchmark's rank files: {0}")]
    Addends(#[from] crate::addends::AddendError),
}

/// Median of `v` (the upper one for an even count); NaN when empty.
pub fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}
