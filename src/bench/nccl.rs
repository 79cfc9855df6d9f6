//! The NCCL bench: fixed-order reduction next to ncclAllReduce, 1 MiB to
//! 1 GiB, through [`NcclBackend::bench`].

use crate::backend::nccl::{NcclBackend, NcclConfig};
use crate::backend::BackendError;
use crate::ranks::world::{self, World};
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
    let mut world = World::new(
        world::discover(gpus)?,
        crate::ranks::rendezvous::Plan::new(&["bench".into()], "nccl bench"),
        Duration::from_secs(world::DEFAULT_INIT_TIMEOUT_S),
    )
    // A bandwidth benchmark on emulated hosts would measure loopback.
    .with_emulated_hosts(false);
    let mut be = NcclBackend::new(
        NcclConfig {
            cuda: Default::default(),
            timeout: Duration::from_secs(crate::backend::DEFAULT_TIMEOUT_S),
        },
        &mut world,
    )?;
    let sizes: Vec<usize> = (18..=28).map(|k| 1usize << k).collect(); // 1 MiB .. 1 GiB of f32
    let rows = be.bench(&sizes, ITERS)?;
    let reporting = world.reports();
    Ok(NcclBench {
        world: world.size(),
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
