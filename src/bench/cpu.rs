//! Host throughput of generate + fold and of the SHA-256 digest path, with
//! `openssl speed -evp sha256` as the baseline measured in the same run.

use super::BenchError;
use crate::backend::{cpu::CpuBackend, Backend, RunOptions};
use crate::data::Distribution;
use crate::digest::{digest_arena, ArenaHasher, NanPolicy};
use crate::experiment::{Case, DeliveryOrder};
use crate::fold::Contract;
use std::time::Instant;

/// One row of the CPU bench table.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Row {
    pub what: String,
    pub threads: usize,
    pub bytes: u64,
    pub seconds: f64,
    pub gb_per_s: f64,
}

/// The case the fold rows time: `world` ranks of one arena of `n`.
pub fn fold_case(world: usize, n: usize) -> Result<Case, BenchError> {
    Ok(Case::builder(world, [n])
        .experiment("bench")
        .id("bench")
        .order(DeliveryOrder::Descending)
        .seed(1)
        .distribution(Distribution::MixedMagnitude)
        .contract(Contract::FixedOrder)
        .rounds(3)
        .build()?)
}

/// Best round of generate + fold of `case` on a pool of `threads`.
pub fn fold_row(case: &Case, threads: usize) -> Result<Row, BenchError> {
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .map_err(BenchError::ThreadPool)?;
    let mut be = CpuBackend::new();
    let run = pool.install(|| be.run_case(case, &RunOptions::default()))?;
    let best = run
        .rounds
        .iter()
        .map(|t| t.generate_ms + t.reduce_ms)
        .fold(f64::INFINITY, f64::min)
        / 1e3;
    let bytes = case.addend_bytes();
    Ok(Row {
        what: format!(
            "generate + fold, W={} n=2^{}",
            case.world(),
            case.arenas()[0].trailing_zeros()
        ),
        threads,
        bytes,
        seconds: best,
        gb_per_s: bytes as f64 / best / 1e9,
    })
}

/// The digest path on one thread: a `mib` MiB arena streamed from memory,
/// as a run hashes it, then 16 KiB blocks hashed repeatedly in cache, the
/// way `openssl speed` measures.
pub fn sha_rows(mib: u32) -> [Row; 2] {
    let values: Vec<f32> = (0..mib as usize * (1 << 18)).map(|i| i as f32).collect();
    let bytes = (values.len() * 4) as u64;
    let t = Instant::now();
    let _ = digest_arena(&values, NanPolicy::Canonical);
    let s = t.elapsed().as_secs_f64();
    let streaming = Row {
        what: format!("sha256 digest path, {mib} MiB arena (streaming)"),
        threads: 1,
        bytes,
        seconds: s,
        gb_per_s: bytes as f64 / s / 1e9,
    };
    let block = &values[..4096];
    let reps = (bytes / 16384).max(1);
    let t = Instant::now();
    let mut h = ArenaHasher::new(NanPolicy::Canonical);
    for _ in 0..reps {
        h.update(block);
    }
    let _ = h.finish();
    let s = t.elapsed().as_secs_f64();
    let in_cache = Row {
        what: "sha256 digest path, 16 KiB blocks (in cache)".into(),
        threads: 1,
        bytes: reps * 16384,
        seconds: s,
        gb_per_s: (reps * 16384) as f64 / s / 1e9,
    };
    [streaming, in_cache]
}

/// `openssl speed -evp sha256` on 16 KiB blocks; `None` when openssl is
/// missing or its output is not understood (the baseline is optional).
pub fn openssl_row() -> Option<Row> {
    let out = std::process::Command::new("openssl")
        .args([
            "speed", "-evp", "sha256", "-bytes", "16384", "-seconds", "3",
        ])
        .output()
        .ok()?;
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text.lines().rev().find(|l| l.starts_with("sha256"))?;
    let k: f64 = line
        .split_whitespace()
        .last()?
        .trim_end_matches('k')
        .parse()
        .ok()?;
    Some(Row {
        what: "openssl speed -evp sha256 (16 KiB blocks)".into(),
        threads: 1,
        bytes: 0,
        seconds: 3.0,
        gb_per_s: k * 1e3 / 1e9,
    })
}
