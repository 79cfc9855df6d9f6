//! The CPU oracle: all W ranks emulated on the host, through the same
//! dataflow the GPU backends run. Each rank owns a full arena of its
//! addends; owner o collects every rank's copy of shard o in delivery
//! order into slots by source rank, folds into its own arena, and the
//! reduced shard is copied over every other rank's shard o (a
//! reduce-scatter stops before that copy: rank o keeps shard o). Parallel over
//! (owner, chunk) with rayon; nothing beyond the W arenas is allocated
//! except per-thread scratch.

use super::{Backend, BackendError, CaseRun, ReducedArena, RoundTimings, RunOptions};
use crate::addends::AddendError;
use crate::data::Lane;
use crate::digest::{digest_arena_as, CHUNK_ELEMS};
use crate::dtype::Dtype;
use crate::experiment::Addends;
use crate::experiment::Case;
use crate::fold::{
    fold_rows_in_order, fold_rows_pairwise, mean_scale, scale_rows, shard_plan, Collective,
    Contract,
};
use crate::result::Scattered;
use rayon::prelude::*;
use std::time::Instant;

/// Elements per parallel task: large enough to amortize scheduling, small
/// enough that a task's W slots stay in cache.
const CHUNK: usize = 4 * 1024;

pub struct CpuBackend {
    threads: usize,
    /// What `auto`'s GPU probe found before falling back here, passed on
    /// to the report; the oracle itself never looks.
    platform: serde_json::Map<String, serde_json::Value>,
}

impl CpuBackend {
    pub fn new() -> Self {
        CpuBackend {
            threads: rayon::current_num_threads(),
            platform: serde_json::Map::new(),
        }
    }

    pub fn with_platform_facts(self, platform: serde_json::Map<String, serde_json::Value>) -> Self {
        CpuBackend { platform, ..self }
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

    fn environment(&self) -> crate::environment::BackendEnvironment {
        let mut facts = serde_json::Map::new();
        facts.insert("threads".into(), self.threads.into());
        crate::environment::BackendEnvironment::new("cpu", facts)
    }

    fn skip_reason(&self, case: &Case) -> Option<String> {
        super::nccl_only(case)
    }

    fn platform_facts(&self) -> serde_json::Map<String, serde_json::Value> {
        self.platform.clone()
    }

    fn preflight(&self, case: &Case, opts: &RunOptions) -> Result<(), BackendError> {
        check_memory(case, opts)
    }

    fn run_case(&mut self, case: &Case, opts: &RunOptions) -> Result<CaseRun, BackendError> {
        if let Some(why) = self.skip_reason(case) {
            return Err(super::unsupported(case.id(), why));
        }
        check_memory(case, opts)?;
        super::repeat_rounds(case.rounds(), || run_round(case, opts))
    }
}

/// Allocations a case makes beside its arenas, as a margin.
const UNMODELLED_BYTES: u64 = 4 << 20;

/// The largest arena's W rank copies (plus, for `--dump`, the kept values
/// and their hashed bytes) must fit in what this process may allocate.
fn check_memory(case: &Case, opts: &RunOptions) -> Result<(), BackendError> {
    let largest = case.arenas().iter().copied().max().unwrap_or(0) as u64;
    let mut needed = largest * 4 * case.world() as u64;
    if opts.keep_values {
        needed += case.total_len() * 4 + largest * 4;
    }
    // What the count above does not model (worker threads' first
    // allocations, the digests, the report) must fit too: without it, a
    // limit just above the count passed here and then aborted the process
    // in a small allocation (measured: about 1 MiB of such use).
    needed += UNMODELLED_BYTES;
    if let Some(h) = crate::memory::headroom() {
        if needed > h.bytes {
            return Err(BackendError::OutOfMemory {
                case: case.id().to_string(),
                inputs: crate::backend::inputs_note(case),
                what: h.what,
                needed,
                available: h.bytes,
            });
        }
    }
    Ok(())
}

fn run_round(
    case: &Case,
    opts: &RunOptions,
) -> Result<(Vec<ReducedArena>, RoundTimings), BackendError> {
    let start = Instant::now();
    let mut t = RoundTimings::default();
    let mut out = Vec::with_capacity(case.arenas().len());
    for (a, &n) in case.arenas().iter().enumerate() {
        let g = Instant::now();
        let mut ranks = generate(case, a as u32, n).map_err(super::addends_error(case))?;
        t.generate_ms += ms(g);

        let r = Instant::now();
        reduce(case, &mut ranks);
        t.reduce_ms += ms(r);

        let d = Instant::now();
        if case.collective() == Collective::ReduceScatter {
            out.push(scattered(&mut ranks, case.dtype(), opts));
            t.digest_ms += ms(d);
            continue;
        }
        let (rank_digests, chunks) = rank_digests(&ranks, case.dtype(), opts);
        // Only differences the digests see (the NaN policy may merge some);
        // when every digest agrees there is nothing to locate, and the
        // arenas need no second pass.
        let mut differing = Vec::new();
        if rank_digests.iter().any(|d| *d != rank_digests[0]) {
            differing = differing_chunks(&ranks);
            differing.retain(|(r, _)| rank_digests[*r] != rank_digests[0]);
        }
        t.digest_ms += ms(d);
        let values = opts.keep_values.then(|| ranks.swap_remove(0));
        out.push(ReducedArena {
            len: n,
            rank_digests,
            scattered: None,
            chunks,
            values,
            differing,
        });
    }
    t.total_ms = ms(start);
    Ok((out, t))
}

/// A reduce-scatter's arena: each rank's own shard hashed where it lies,
/// then the shards gathered in rank order into rank 0's arena (whose other
/// shards are its unreduced addends until then) and hashed whole and per
/// chunk. Rank 0's arena, gathered, is the values kept.
fn scattered(ranks: &mut [Vec<f32>], dtype: Dtype, opts: &RunOptions) -> ReducedArena {
    let n = ranks[0].len();
    let plan = shard_plan(n, ranks.len()).expect("world >= 1 is validated");
    let shard_digests = plan
        .par_iter()
        .enumerate()
        .map(|(r, s)| digest_arena_as(&ranks[r][s.range()], dtype, opts.nan_policy))
        .collect();
    let (gathered, others) = ranks.split_first_mut().expect("world >= 1 is validated");
    for (peer, s) in others.iter().zip(&plan[1..]) {
        gathered[s.range()].copy_from_slice(&peer[s.range()]);
    }
    let (digest, chunks) = rank_digests(&ranks[..1], dtype, opts);
    ReducedArena {
        len: n,
        rank_digests: Vec::new(),
        scattered: Some(Scattered {
            shard_digests,
            gathered: digest[0],
        }),
        chunks,
        values: opts.keep_values.then(|| std::mem::take(&mut ranks[0])),
        differing: Vec::new(),
    }
}

/// For each rank whose bits differ from rank 0's, the differing chunks.
fn differing_chunks(ranks: &[Vec<f32>]) -> Vec<(usize, Vec<usize>)> {
    let same = |a: &[f32], b: &[f32]| a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits());
    (1..ranks.len())
        .filter_map(|r| {
            let c: Vec<usize> = ranks[r]
                .chunks(CHUNK_ELEMS)
                .zip(ranks[0].chunks(CHUNK_ELEMS))
                .enumerate()
                .filter(|(_, (x, y))| !same(x, y))
                .map(|(k, _)| k)
                .collect();
            (!c.is_empty()).then_some((r, c))
        })
        .collect()
}

/// Rank 0 is hashed (whole, and per chunk in parallel); a rank whose bytes
/// equal rank 0's has the same digest by definition, and any rank that
/// differs is hashed on its own.
fn rank_digests(
    ranks: &[Vec<f32>],
    dtype: Dtype,
    opts: &RunOptions,
) -> (Vec<crate::digest::Sha256>, Vec<crate::digest::Sha256>) {
    let policy = opts.nan_policy;
    let (d0, chunks) = rayon::join(
        || digest_arena_as(&ranks[0], dtype, policy),
        || {
            ranks[0]
                .par_chunks(CHUNK_ELEMS)
                .map(|c| digest_arena_as(c, dtype, policy))
                .collect::<Vec<_>>()
        },
    );
    let same_bits = |a: &[f32], b: &[f32]| a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits());
    let digests = ranks
        .par_iter()
        .map(|r| {
            if same_bits(r, &ranks[0]) {
                d0
            } else {
                digest_arena_as(r, dtype, policy)
            }
        })
        .collect();
    (digests, chunks)
}

fn ms(since: Instant) -> f64 {
    since.elapsed().as_secs_f64() * 1e3
}

/// Every rank's own copy of arena `a`, filled with its addends: the
/// generator's (rounded to the case's dtype), or read from its rank file
/// (widened exactly).
fn generate(case: &Case, a: u32, n: usize) -> Result<Vec<Vec<f32>>, AddendError> {
    (0..case.world())
        .map(|r| {
            // Zeroed allocation: large ones come as untouched zero pages
            // (calloc over fresh mmap), so this costs no pass over memory,
            // and no reference ever covers uninitialised floats.
            let mut v = vec![0f32; n];
            advise_huge_pages(&mut v);
            match case.addends() {
                Addends::Generated { seed, distribution } => {
                    let lane = Lane::new(*distribution, *seed, r as u32, a);
                    let dtype = case.dtype();
                    v.par_chunks_mut(CHUNK).enumerate().for_each(|(c, chunk)| {
                        lane.fill((c * CHUNK) as u64, chunk);
                        dtype.quantize_all(chunk);
                    });
                }
                Addends::Files(f) => f.read(r, a as usize, &mut v)?,
            }
            Ok(v)
        })
        .collect()
}

/// Rank 0's reduced values of elements `first .. first + out.len()` of
/// arena `a` of a generated case, computed column by column without the W
/// arenas: the same generation, fold, mean scale and one rounding as
/// [`reduce`], so a GPU result of any size can be checked against the
/// oracle element by element in bounded memory. `None` for a case this
/// cannot compute alone (rank files, NCCL's own sum, an element range past
/// the arena).
pub fn reduced_range(case: &Case, a: u32, first: usize, out: &mut [f32]) -> Option<()> {
    let Addends::Generated { seed, distribution } = case.addends() else {
        return None;
    };
    let n = *case.arenas().get(a as usize)?;
    if case.contract() == Contract::NcclAllreduce || first.checked_add(out.len())? > n {
        return None;
    }
    let world = case.world();
    let order = case.order().sequence(world);
    let scale = case.mean().then(|| mean_scale(world));
    let dtype = case.dtype();
    let lanes: Vec<Lane> = (0..world)
        .map(|r| Lane::new(*distribution, *seed, r as u32, a))
        .collect();
    out.par_chunks_mut(CHUNK).enumerate().for_each_init(
        Vec::new,
        |stacked: &mut Vec<f32>, (c, piece)| {
            let (len, at) = (piece.len(), first + c * CHUNK);
            stacked.resize(world * len, 0.0);
            for (r, lane) in lanes.iter().enumerate() {
                let slot = &mut stacked[r * len..(r + 1) * len];
                lane.fill(at as u64, slot);
                dtype.quantize_all(slot);
            }
            fold_scale_round(case.contract(), stacked, world, &order, scale, dtype, piece);
        },
    );
    Some(())
}

/// Ask for transparent huge pages on a fresh allocation: first-touch page
/// faults otherwise dominate generating a large arena.
fn advise_huge_pages(v: &mut Vec<f32>) {
    const HUGE: usize = 2 << 20;
    let start = v.as_mut_ptr() as usize;
    let end = start + v.capacity() * 4;
    let aligned = start.next_multiple_of(HUGE);
    if end > aligned + HUGE {
        let len = (end - aligned) / HUGE * HUGE;
        // SAFETY: the range lies inside this Vec's allocation; madvise only
        // changes how the kernel backs it. Failure is harmless.
        unsafe {
            libc::madvise(aligned as *mut libc::c_void, len, libc::MADV_HUGEPAGE);
        }
    }
}

/// One owner's chunk: the same element range in every rank's arena.
struct Column<'a> {
    owner: usize,
    ranks: Vec<&'a mut [f32]>,
}

/// Exchange, fold and redistribute in place: afterwards every rank's arena
/// holds the reduced values (of a reduce-scatter, rank r's shard r only).
fn reduce(case: &Case, ranks: &mut [Vec<f32>]) {
    let world = case.world();
    let n = ranks[0].len();
    let plan = shard_plan(n, world).expect("world >= 1 is validated");
    let order = case.order().sequence(world);
    let scale = case.mean().then(|| mean_scale(world));
    let dtype = case.dtype();
    let redistribute = case.collective() == Collective::AllReduce;

    // Cut every rank's arena at the same chunk boundaries inside each shard.
    let mut columns: Vec<Column<'_>> = Vec::new();
    let mut cuts: Vec<(usize, usize)> = Vec::new(); // (owner, len)
    for (o, s) in plan.iter().enumerate() {
        let mut left = s.len;
        while left > 0 {
            let len = left.min(CHUNK);
            cuts.push((o, len));
            left -= len;
        }
    }
    for &(owner, _) in &cuts {
        columns.push(Column {
            owner,
            ranks: Vec::with_capacity(world),
        });
    }
    for arena in ranks.iter_mut() {
        let mut rest: &mut [f32] = arena;
        for (col, &(_, len)) in columns.iter_mut().zip(&cuts) {
            let (piece, tail) = rest.split_at_mut(len);
            col.ranks.push(piece);
            rest = tail;
        }
    }

    columns
        .into_par_iter()
        .for_each_init(Vec::new, |stacked: &mut Vec<f32>, mut col| {
            let len = col.ranks[0].len();
            stacked.resize(world * len, 0.0);
            // Exchange: slots by source rank, copied in delivery order; the
            // order of the copies must not matter for fixed-order bits.
            for &src in &order {
                stacked[src * len..(src + 1) * len].copy_from_slice(col.ranks[src]);
            }
            let mine = &mut *col.ranks[col.owner];
            fold_scale_round(case.contract(), stacked, world, &order, scale, dtype, mine);
            if !redistribute {
                return;
            }
            // Redistribute: the owner's reduced shard overwrites every peer's.
            let (before, rest) = col.ranks.split_at_mut(col.owner);
            let (mine, after) = rest.split_first_mut().expect("owner is a rank");
            for peer in before.iter_mut().chain(after.iter_mut()) {
                peer.copy_from_slice(mine);
            }
        });
}

/// What an owner computes of its shard (docs/SPEC.md §3, §8): the
/// contract's float32 chain, the mean's scale in float32, then the one
/// rounding to the case's dtype.
fn fold_scale_round(
    contract: Contract,
    stacked: &[f32],
    world: usize,
    order: &[usize],
    scale: Option<f32>,
    dtype: crate::dtype::Dtype,
    out: &mut [f32],
) {
    // IEEE 754's default mode on whichever thread this runs (a pool's
    // worker inherits the mode of the thread that started the pool).
    let _ieee = crate::fpenv::IeeeMode::enter();
    fold_stacked(contract, stacked, world, order, out);
    if let Some(s) = scale {
        scale_rows(out, s);
    }
    dtype.quantize_all(out);
}

/// Fold `world` stacked slots (`[world][len]`, slot = source rank) into `out`.
fn fold_stacked(
    contract: Contract,
    stacked: &[f32],
    world: usize,
    order: &[usize],
    out: &mut [f32],
) {
    match contract {
        Contract::FixedOrder => {
            let ascending: Vec<usize> = (0..world).collect();
            fold_rows_in_order(stacked, &ascending, out);
        }
        Contract::ArrivalOrder => fold_rows_in_order(stacked, order, out),
        // Never reached: `skip_reason` keeps NCCL-only cases away.
        Contract::NcclAllreduce => out.fill(f32::NAN),
        Contract::PairwiseTree => fold_rows_pairwise(stacked, world, out),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Threads left flushing subnormals and rounding toward zero (as
    /// PyTorch's `set_flush_denormal(True)` leaves the thread that called
    /// it, and any pool that thread starts) get the same digests from the
    /// oracle as threads in the default mode, and keep their mode after.
    #[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
    #[test]
    fn the_oracle_ignores_threads_left_flushing_subnormals() {
        use crate::data::{Distribution, Lane};
        let case = Case::builder(5, [40_009])
            .seed(11)
            .distribution(Distribution::SubnormalHeavy)
            .contract(Contract::FixedOrder)
            .build()
            .unwrap();
        let digests = |case: &Case| {
            let run = CpuBackend::new()
                .run_case(case, &RunOptions::default())
                .unwrap();
            run.arenas
                .iter()
                .map(|a| a.rank_digests.clone())
                .collect::<Vec<_>>()
        };
        let clean = digests(&case);
        let flushing = rayon::ThreadPoolBuilder::new()
            .num_threads(3)
            .start_handler(|_| crate::fpenv::leave_ieee_mode_on_this_thread())
            .build()
            .unwrap();
        let flushed = flushing.install(|| {
            // Negative control: on these threads the data's own sums flush.
            let lane = Lane::new(Distribution::SubnormalHeavy, 11, 0, 0);
            let sum = |i: u64| {
                let (a, b) = (lane.value(i), lane.value(i + 1));
                std::hint::black_box(std::hint::black_box(a) + std::hint::black_box(b)).to_bits()
            };
            let differs = (0..64).any(|i| {
                let raw = sum(i);
                let _ieee = crate::fpenv::IeeeMode::enter();
                raw != sum(i)
            });
            assert!(differs, "no sum of the data flushed in this mode");
            let d = digests(&case);
            assert!(crate::fpenv::is_altered(), "the thread's mode comes back");
            d
        });
        assert_eq!(flushed, clean);
    }

    /// Rank r of a reduce-scatter holds the all-reduce's shard r and, in
    /// its other shards, its own addends untouched: nothing is
    /// redistributed. Shards of 5 over W = 3 are 2, 2, 1.
    #[test]
    fn a_reduce_scatter_leaves_each_rank_its_own_shard_only() {
        let case = |collective| {
            Case::builder(3, [5])
                .seed(3)
                .contract(Contract::FixedOrder)
                .collective(collective)
                .build()
                .unwrap()
        };
        let (all, scatter) = (case(Collective::AllReduce), case(Collective::ReduceScatter));
        let addends = generate(&all, 0, 5).unwrap();
        let mut reduced = addends.clone();
        reduce(&all, &mut reduced);
        let mut scattered = addends.clone();
        reduce(&scatter, &mut scattered);
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<u32>>();
        let plan = shard_plan(5, 3).unwrap();
        for (r, arena) in scattered.iter().enumerate() {
            for (o, s) in plan.iter().enumerate() {
                let want = if o == r { &reduced[0] } else { &addends[r] };
                assert_eq!(
                    bits(&arena[s.range()]),
                    bits(&want[s.range()]),
                    "rank {r} shard {o}"
                );
            }
            // Control: the sum changed every shard it reduced.
            assert_ne!(
                bits(&arena[plan[r].range()]),
                bits(&addends[r][plan[r].range()])
            );
        }
        // The gathered arena is the all-reduce's, and its digest too.
        let opts = RunOptions::default();
        let a = super::scattered(&mut scattered, Dtype::F32, &opts);
        assert_eq!(
            a.digest(),
            digest_arena_as(&reduced[0], Dtype::F32, opts.nan_policy)
        );
        assert_eq!(a.rank_digests.len(), 0);
        assert_eq!(a.shard_digests().len(), 3);
    }

    #[test]
    fn differing_chunks_name_the_rank_and_the_chunk() {
        let n = 2 * CHUNK_ELEMS + 3;
        let base: Vec<f32> = (0..n).map(|i| i as f32 * 0.5).collect();
        let mut ranks = vec![base.clone(); 4];
        assert!(differing_chunks(&ranks).is_empty());
        // -0.0 against +0.0 and a NaN payload are differences in bits.
        ranks[2][0] = -0.0;
        ranks[3][n - 1] = f32::from_bits(0x7FC0_0001);
        ranks[3][CHUNK_ELEMS] = f32::from_bits(0x7FC0_0002);
        assert_eq!(
            differing_chunks(&ranks),
            vec![(2, vec![0]), (3, vec![1, 2])]
        );
    }

    /// The column-by-column oracle gives the whole-arena oracle's bits, at
    /// any offset, for f32 and the 16-bit dtypes, sum and mean; a range
    /// shifted by one element (the negative control) does not.
    #[test]
    fn reduced_range_is_the_oracle_bit_for_bit() {
        use crate::data::Distribution;
        let n = 3 * CHUNK + 77;
        for dtype in [Dtype::F32, Dtype::Bf16, Dtype::F16] {
            for mean in [false, true] {
                let case = Case::builder(5, [n])
                    .experiment("t")
                    .id("r")
                    .seed(7)
                    .distribution(Distribution::MixedMagnitude)
                    .dtype(Some(dtype))
                    .mean(mean)
                    .build()
                    .unwrap();
                let whole = CpuBackend::new()
                    .run_case(
                        &case,
                        &RunOptions {
                            keep_values: true,
                            ..Default::default()
                        },
                    )
                    .unwrap()
                    .arenas
                    .remove(0)
                    .values
                    .unwrap();
                let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                let mut all = vec![0f32; n];
                reduced_range(&case, 0, 0, &mut all).unwrap();
                assert_eq!(bits(&all), bits(&whole), "{dtype} mean={mean}");
                let (first, len) = (CHUNK - 5, CHUNK + 9);
                let mut part = vec![0f32; len];
                reduced_range(&case, 0, first, &mut part).unwrap();
                assert_eq!(bits(&part), bits(&whole[first..first + len]));
                reduced_range(&case, 0, first + 1, &mut part).unwrap();
                assert_ne!(bits(&part), bits(&whole[first..first + len]));
                assert!(reduced_range(&case, 0, n - 3, &mut part).is_none());
            }
        }
    }
}
