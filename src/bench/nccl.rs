//! The NCCL bench: fixed-order reduction next to ncclAllReduce, 1 MiB to
//! 1 GiB, through [`NcclBackend::bench`].

use crate::backend::nccl::{NcclBackend, NcclConfig};
use crate::backend::{Backend, BackendError};
use std::time::Duration;

pub use crate::backend::nccl::bench::NcclBenchRow;

/// Timed repetitions per size; each row is their median.
pub const ITERS: usize = 20;

/// One process's share of the NCCL bench.
pub struct NcclBench {
    pub world: usize,
    /// Only the reporting rank prints; the others stay silent.
    pub reporting: bool,
    /// Set when hosts are emulated on one machine: then the rows are not a
    /// bandwidth result.
    pub emulated_hosts: Option<serde_json::Value>,
    pub rows: Vec<NcclBenchRow>,
    /// Held until the caller drops this, after printing, so the
    /// communicators' destroy (which may wait on peers) comes after the
    /// table, as it always has.
    _backend: NcclBackend,
}

/// Run the sweep on `gpus` GPUs (under a launcher, the launcher decides).
pub fn run(gpus: usize) -> Result<NcclBench, BackendError> {
    let mut be = NcclBackend::new(NcclConfig {
        cuda: Default::default(),
        gpus,
        init_timeout: Duration::from_secs(120),
        timeout: Duration::from_secs(300),
        plan: crate::ranks::rendezvous::Plan::new(&["bench".into()], "nccl bench"),
        // A bandwidth benchmark on emulated hosts would measure loopback.
        emulate_hosts: false,
        own_inputs: Vec::new(),
    })?;
    let sizes: Vec<usize> = (18..=28).map(|k| 1usize << k).collect(); // 1 MiB .. 1 GiB of f32
    let rows = be.bench(&sizes, ITERS)?;
    let reporting = be.is_reporting_rank();
    Ok(NcclBench {
        world: be.world(),
        reporting,
        emulated_hosts: if reporting {
            crate::backend::nccl::facts::emulated_hosts()
        } else {
            None
        },
        rows,
        _backend: be,
    })
}
