//! The CPU oracle: all W ranks emulated on the host, through the same
//! dataflow the GPU backends run. Each rank owns a full arena; an owner
//! collects peers' copies of its shard in delivery order into slots by
//! source rank, folds, and the reduced shards are copied back to every
//! rank. Parallel over (owner, chunk) with rayon.

use super::{Backend, BackendError, CaseRun, ReducedArena, RoundTimings, RunOptions};
use crate::data::Lane;
use crate::digest::digest_arena;
use crate::experiment::Case;
use crate::fold::{fold_pairwise, mean_scale, shard_plan, Contract};
use rayon::prelude::*;
use std::time::Instant;

/// Elements per parallel task: large enough to amortize scheduling, small
/// enough that a task's W slots stay in cache.
const CHUNK: usize = 8 * 1024;

pub struct CpuBackend {
    threads: usize,
}

impl CpuBackend {
    pub fn new() -> Self {
        CpuBackend {
            threads: rayon::current_num_threads(),
        }
    }
}

impl Default for CpuBackend {
    fn default() -> Self {
        Self::new()
    }
}

impl Backend for CpuBackend {
    fn name(&self) -> &'static str {
        "cpu"
    }

    fn environment(&self) -> serde_json::Value {
        serde_json::json!({ "kind": "cpu", "threads": self.threads })
    }

    fn run_case(&mut self, case: &Case, opts: &RunOptions) -> Result<CaseRun, BackendError> {
        check_memory(case)?;
        let mut rounds = Vec::new();
        let mut first: Option<Vec<ReducedArena>> = None;
        let mut identical = true;
        let mut last = Vec::new();
        for _ in 0..case.rounds {
            let (arenas, t) = run_round(case, opts);
            match &first {
                None => first = Some(arenas.clone()),
                Some(f) => identical &= super::same_digests(f, &arenas),
            }
            rounds.push(t);
            last = arenas;
        }
        Ok(CaseRun {
            arenas: last,
            rounds,
            rounds_identical: identical,
        })
    }
}

/// The largest arena's W rank copies plus one reduced buffer must fit.
fn check_memory(case: &Case) -> Result<(), BackendError> {
    let largest = case.arenas.iter().copied().max().unwrap_or(0) as u64;
    let needed = largest * 4 * (case.world as u64 + 1);
    if let Some(available) = available_memory() {
        if needed > available {
            return Err(BackendError::OutOfMemory {
                case: case.id.clone(),
                what: "host memory",
                needed,
                available,
            });
        }
    }
    Ok(())
}

/// MemAvailable from /proc/meminfo, when the OS says.
pub fn available_memory() -> Option<u64> {
    let info = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = info.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

fn run_round(case: &Case, opts: &RunOptions) -> (Vec<ReducedArena>, RoundTimings) {
    let start = Instant::now();
    let mut t = RoundTimings::default();
    let mut out = Vec::with_capacity(case.arenas.len());
    for (a, &n) in case.arenas.iter().enumerate() {
        let g = Instant::now();
        let mut ranks = generate(case, a as u32, n);
        t.generate_ms += ms(g);

        let r = Instant::now();
        reduce(case, &mut ranks);
        t.reduce_ms += ms(r);

        let d = Instant::now();
        let rank_digests: Vec<String> = ranks
            .par_iter()
            .map(|arena| digest_arena(arena, opts.nan_policy))
            .collect();
        t.digest_ms += ms(d);
        let values = opts.keep_values.then(|| ranks.swap_remove(0));
        out.push(ReducedArena {
            len: n,
            rank_digests,
            values,
        });
    }
    t.total_ms = ms(start);
    (out, t)
}

fn ms(since: Instant) -> f64 {
    since.elapsed().as_secs_f64() * 1e3
}

/// Every rank's own copy of arena `a`, filled with its addends.
fn generate(case: &Case, a: u32, n: usize) -> Vec<Vec<f32>> {
    (0..case.world)
        .map(|r| {
            let lane = Lane::new(case.distribution, case.seed, r as u32, a);
            let mut v = vec![0f32; n];
            v.par_chunks_mut(CHUNK)
                .enumerate()
                .for_each(|(c, chunk)| lane.fill((c * CHUNK) as u64, chunk));
            v
        })
        .collect()
}

/// Exchange, fold and redistribute in place: afterwards every rank's arena
/// holds the reduced values.
fn reduce(case: &Case, ranks: &mut [Vec<f32>]) {
    let world = case.world;
    let n = ranks[0].len();
    let plan = shard_plan(n, world).expect("world >= 1 is validated");
    let order = case.order.sequence(world);
    let scale = case.mean.then(|| mean_scale(world));
    let mut reduced = vec![0f32; n];

    // Phase A: owner o folds shard o. Split `reduced` by shard, then chunk.
    let mut tasks: Vec<(usize, &mut [f32])> = Vec::new();
    let mut rest: &mut [f32] = &mut reduced;
    for s in &plan {
        let (mine, tail) = rest.split_at_mut(s.len);
        rest = tail;
        for (c, chunk) in mine.chunks_mut(CHUNK).enumerate() {
            tasks.push((s.start + c * CHUNK, chunk));
        }
    }
    let inputs: &[Vec<f32>] = ranks;
    tasks.into_par_iter().for_each(|(start, out)| {
        let len = out.len();
        // Slots by source rank, filled in delivery order: the order of the
        // copies must not matter for fixed-order bits.
        let mut stacked = vec![0f32; world * len];
        for &src in &order {
            stacked[src * len..(src + 1) * len].copy_from_slice(&inputs[src][start..start + len]);
        }
        fold_stacked(case.contract, &stacked, world, &order, out);
        if let Some(s) = scale {
            for v in out.iter_mut() {
                *v *= s;
            }
        }
    });

    // Phase B: every owner's reduced shard reaches every rank.
    ranks.par_iter_mut().for_each(|arena| arena.copy_from_slice(&reduced));
}

/// Fold `world` stacked slots (`[world][len]`, slot = source rank) into `out`.
fn fold_stacked(contract: Contract, stacked: &[f32], world: usize, order: &[usize], out: &mut [f32]) {
    let len = out.len();
    let slot = |r: usize| &stacked[r * len..(r + 1) * len];
    match contract {
        Contract::FixedOrder | Contract::ArrivalOrder => {
            let seq: Vec<usize> = if contract == Contract::FixedOrder {
                (0..world).collect()
            } else {
                order.to_vec()
            };
            // Row by row: per element this is exactly acc = s[seq0] + s[seq1] + ...
            out.copy_from_slice(slot(seq[0]));
            for &r in &seq[1..] {
                for (o, x) in out.iter_mut().zip(slot(r)) {
                    *o += *x;
                }
            }
        }
        Contract::PairwiseTree => {
            let mut slots = vec![0f32; world];
            for (i, o) in out.iter_mut().enumerate() {
                for (r, s) in slots.iter_mut().enumerate() {
                    *s = stacked[r * len + i];
                }
                *o = fold_pairwise(&slots);
            }
        }
    }
}
