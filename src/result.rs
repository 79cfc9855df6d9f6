//! What a backend is and hands back, as plain data: which backend a run
//! asks for ([`BackendChoice`], the word a report's `backend` holds), and
//! of each case the reduced arenas and each round's timings. It sits below
//! both `backend`, which makes them, and `report`, which judges them, so
//! the report format that `compare` reads stands on no backend.

use serde::Serialize;
use std::fmt;

/// Which backend a run asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum BackendChoice {
    /// CUDA when a driver and device are usable, else the CPU oracle.
    Auto,
    /// The CPU oracle: all W ranks emulated on the host.
    Cpu,
    /// All W ranks emulated on one GPU (CUDA loopback).
    Cuda,
    /// One rank per GPU over a live NCCL communicator.
    Nccl,
}

impl BackendChoice {
    /// The `environment.backend.kind` its reports carry (`auto` runs one of
    /// the others), checked on every read.
    pub const fn environment_kind(self) -> Option<&'static str> {
        match self {
            BackendChoice::Auto => None,
            BackendChoice::Cpu => Some("cpu"),
            BackendChoice::Cuda => Some("cuda-loopback"),
            BackendChoice::Nccl => Some("nccl"),
        }
    }
}

impl fmt::Display for BackendChoice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            BackendChoice::Auto => "auto",
            BackendChoice::Cpu => "cpu",
            BackendChoice::Cuda => "cuda",
            BackendChoice::Nccl => "nccl",
        })
    }
}

/// One reduced arena as every rank ended up holding it.
#[derive(Debug, Clone)]
pub struct ReducedArena {
    pub len: usize,
    /// SHA-256 of each rank's copy, rank order; empty for a reduce-scatter
    /// (no rank holds a copy of the whole arena).
    pub rank_digests: Vec<crate::digest::Sha256>,
    /// A reduce-scatter's shards; `None` for an all-reduce.
    pub scattered: Option<Scattered>,
    /// Rank 0's per-chunk digests (`digest::CHUNK_ELEMS` elements each);
    /// of a reduce-scatter, the gathered arena's.
    pub chunks: Vec<crate::digest::Sha256>,
    /// Rank 0's values when `keep_values` was asked for; of a
    /// reduce-scatter, the shards gathered in rank order.
    pub values: Option<Vec<f32>>,
    /// Ranks whose copy differs from rank 0's, with the differing chunks
    /// (`digest::CHUNK_ELEMS` elements each); empty when all agree.
    pub differing: Vec<(usize, Vec<usize>)>,
}

impl ReducedArena {
    pub fn ranks_identical(&self) -> bool {
        self.rank_digests.windows(2).all(|w| w[0] == w[1])
    }

    /// The arena's digest: rank 0's (every rank's, when they agree); of a
    /// reduce-scatter, the gathered arena's.
    pub fn digest(&self) -> crate::digest::Sha256 {
        if let Some(s) = &self.scattered {
            return s.gathered;
        }
        // A world has at least one rank; an arena without digests is a
        // backend's bug, and the all-zero value never matches a real one.
        self.rank_digests.first().copied().unwrap_or_default()
    }

    /// Each rank's shard digest, rank order; empty for an all-reduce.
    pub fn shard_digests(&self) -> &[crate::digest::Sha256] {
        self.scattered
            .as_ref()
            .map_or(&[], |s| s.shard_digests.as_slice())
    }
}

/// What a reduce-scatter leaves: rank r's shard r, and the arena those
/// shards make when concatenated in rank order.
#[derive(Debug, Clone, PartialEq)]
pub struct Scattered {
    /// SHA-256 of rank r's shard, rank order.
    pub shard_digests: Vec<crate::digest::Sha256>,
    /// SHA-256 of the shards concatenated in rank order (the gathered
    /// arena): for fixed-order, the all-reduce's arena digest.
    pub gathered: crate::digest::Sha256,
}

/// Wall-clock milliseconds of one round's phases.
#[derive(Debug, Clone, Default, Serialize, serde::Deserialize, PartialEq)]
pub struct RoundTimings {
    pub generate_ms: f64,
    pub reduce_ms: f64,
    pub digest_ms: f64,
    pub total_ms: f64,
}
