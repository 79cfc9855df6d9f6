//! The reducer's numeric contract on the host: the shard plan and the
//! per-element folds. Backends move bytes; only these functions (and the
//! device kernel that mirrors `fold_fixed`) add floats.

use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

/// One rank's contiguous slice of an arena.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Shard {
    pub start: usize,
    pub len: usize,
}

impl Shard {
    pub fn range(&self) -> std::ops::Range<usize> {
        self.start..self.start + self.len
    }
}

/// Contiguous shards in rank order covering `0..n`; the remainder goes to
/// the lowest ranks, and ranks past `n` get empty shards starting at `n`.
/// Returns `None` for `world == 0`.
pub fn shard_plan(n: usize, world: usize) -> Option<Vec<Shard>> {
    if world == 0 {
        return None;
    }
    let base = n / world;
    let extra = n % world;
    let mut start = 0;
    let plan = (0..world)
        .map(|r| {
            let len = base + usize::from(r < extra);
            let s = Shard { start, len };
            start += len;
            s
        })
        .collect();
    Some(plan)
}

/// The reduction semantics a case runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "kebab-case")]
pub enum Contract {
    /// The product: start from rank 0, add ranks 1..W-1 in ascending order.
    #[default]
    FixedOrder,
    /// Negative control: fold in delivery order (must see reordering).
    ArrivalOrder,
    /// Negative control: deterministic pairwise tree over source ranks.
    PairwiseTree,
    /// Negative control: NCCL's own all-reduce sum (NCCL backend only);
    /// its bits may move with NCCL_ALGO, NCCL_PROTO and message size.
    NcclAllreduce,
}

pub const ALL_CONTRACTS: [Contract; 4] = [
    Contract::FixedOrder,
    Contract::ArrivalOrder,
    Contract::PairwiseTree,
    Contract::NcclAllreduce,
];

impl Contract {
    pub const fn name(self) -> &'static str {
        match self {
            Contract::FixedOrder => "fixed-order",
            Contract::ArrivalOrder => "arrival-order",
            Contract::PairwiseTree => "pairwise-tree",
            Contract::NcclAllreduce => "nccl-allreduce",
        }
    }

    /// What delivery order does to the contract's bits: the question its
    /// invariance groups ask.
    pub const fn order_role(self) -> OrderRole {
        match self {
            Contract::FixedOrder | Contract::PairwiseTree => OrderRole::Invariant,
            Contract::ArrivalOrder => OrderRole::Changes,
            Contract::NcclAllreduce => OrderRole::Ignored,
        }
    }

    /// Whether the bits may depend on delivery order by design.
    pub const fn order_dependent(self) -> bool {
        match self.order_role() {
            OrderRole::Changes => true,
            OrderRole::Invariant | OrderRole::Ignored => false,
        }
    }

    /// Whether only the NCCL backend can run the contract: the CPU oracle
    /// and the CUDA loopback skip it, and the audit has no oracle for it.
    pub const fn needs_nccl(self) -> bool {
        match self {
            Contract::FixedOrder | Contract::ArrivalOrder | Contract::PairwiseTree => false,
            Contract::NcclAllreduce => true,
        }
    }
}

/// What delivery order does to a contract's bits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum OrderRole {
    /// Every delivery order gives the same bits: the contract fixes the
    /// order it folds in.
    Invariant,
    /// Orders that fold in different sequences give different bits, wherever
    /// the data can see it: a negative control.
    Changes,
    /// The contract never sees our delivery order (NCCL folds in its own
    /// order), so orders are not the question.
    Ignored,
}

impl fmt::Display for Contract {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Contract {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        ALL_CONTRACTS
            .iter()
            .copied()
            .find(|c| c.name() == s)
            .ok_or_else(|| format!("unknown contract `{s}` (expected {})", contract_names()))
    }
}

/// Every contract's name, as "a, b, c or d".
fn contract_names() -> String {
    let names: Vec<&str> = ALL_CONTRACTS.iter().map(|c| c.name()).collect();
    match names.split_last() {
        Some((last, [])) => (*last).to_string(),
        Some((last, rest)) => format!("{} or {last}", rest.join(", ")),
        None => String::new(),
    }
}

/// What each rank ends with: the whole reduced arena (all-reduce), or
/// only its own shard of it (reduce-scatter: rank r keeps shard r of
/// [`shard_plan`], and nothing is redistributed).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "kebab-case")]
pub enum Collective {
    #[default]
    AllReduce,
    ReduceScatter,
}

pub const ALL_COLLECTIVES: [Collective; 2] = [Collective::AllReduce, Collective::ReduceScatter];

impl Collective {
    pub const fn name(self) -> &'static str {
        match self {
            Collective::AllReduce => "all-reduce",
            Collective::ReduceScatter => "reduce-scatter",
        }
    }

    pub const fn is_all_reduce(self) -> bool {
        matches!(self, Collective::AllReduce)
    }
}

impl fmt::Display for Collective {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Collective {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        ALL_COLLECTIVES
            .iter()
            .copied()
            .find(|c| c.name() == s)
            .ok_or_else(|| {
                format!("unknown collective `{s}` (expected all-reduce or reduce-scatter)")
            })
    }
}

/// The fixed-order fold of one element: `slots[0] + slots[1] + ... ` left to right.
#[inline(always)]
pub fn fold_fixed(slots: &[f32]) -> f32 {
    let mut acc = slots[0];
    for &x in &slots[1..] {
        acc += x;
    }
    acc
}

/// Fold in the given order of source ranks (arrival order, or reversed).
#[inline(always)]
pub fn fold_in_order(slots: &[f32], order: &[usize]) -> f32 {
    let mut acc = slots[order[0]];
    for &r in &order[1..] {
        acc += slots[r];
    }
    acc
}

/// Pairwise tree: split `k` slots into a first half of `ceil(k/2)` and the
/// rest, sum each half recursively, add the two.
pub fn fold_pairwise(slots: &[f32]) -> f32 {
    match slots.len() {
        1 => slots[0],
        k => {
            let mid = k.div_ceil(2);
            fold_pairwise(&slots[..mid]) + fold_pairwise(&slots[mid..])
        }
    }
}

/// The mean scale: a correctly rounded f32 reciprocal of W, applied as one
/// multiply after the sum (exact only for power-of-two W). Rounded to
/// nearest whatever mode the calling thread was left in: the GPU backends
/// take it from here.
pub fn mean_scale(world: usize) -> f32 {
    let _ieee = crate::fpenv::IeeeMode::enter();
    // Through `black_box` both ways, so the division happens inside the
    // mode, not moved across its change.
    let w = std::hint::black_box(world as f32);
    std::hint::black_box(1.0f32 / w)
}

/// Fold a column of `seq.len()` rows stacked as `[slot][len]` (slot = source
/// rank) into `out`, row after row in the order `seq`. Per element this is
/// exactly [`fold_in_order`]; going by rows lets the adds vectorize.
pub fn fold_rows_in_order(stacked: &[f32], seq: &[usize], out: &mut [f32]) {
    let len = out.len();
    let row = |r: usize| &stacked[r * len..(r + 1) * len];
    out.copy_from_slice(row(seq[0]));
    for &r in &seq[1..] {
        for (o, x) in out.iter_mut().zip(row(r)) {
            *o += *x;
        }
    }
}

/// [`fold_pairwise`] of every element of a `[world][len]` column into `out`.
pub fn fold_rows_pairwise(stacked: &[f32], world: usize, out: &mut [f32]) {
    let len = out.len();
    let mut slots = vec![0f32; world];
    for (i, o) in out.iter_mut().enumerate() {
        for (r, s) in slots.iter_mut().enumerate() {
            *s = stacked[r * len + i];
        }
        *o = fold_pairwise(&slots);
    }
}

/// The mean: one multiply by [`mean_scale`] per element, after the sum.
pub fn scale_rows(out: &mut [f32], scale: f32) {
    for v in out.iter_mut() {
        *v *= scale;
    }
}

/// Straight-line reference over whole addend arrays (no sharding, no
/// exchange): what every backend's fixed-order result must equal.
pub fn reference_fixed(addends: &[&[f32]], out: &mut [f32]) {
    let mut slots = vec![0.0f32; addends.len()];
    for (i, o) in out.iter_mut().enumerate() {
        for (s, a) in slots.iter_mut().zip(addends) {
            *s = a[i];
        }
        *o = fold_fixed(&slots);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The mean's scale is rounded to nearest on a thread left rounding
    /// toward zero, and that thread's mode comes back after.
    #[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
    #[test]
    fn the_mean_scale_is_rounded_to_nearest_whatever_the_thread_mode() {
        let want: Vec<u32> = (1..=64).map(|w| mean_scale(w).to_bits()).collect();
        assert_eq!(want[2], 0x3EAA_AAAB, "1/3 to nearest");
        std::thread::spawn(move || {
            crate::fpenv::leave_ieee_mode_on_this_thread();
            // Negative control: this thread's own 1/3 rounds toward zero.
            let three = std::hint::black_box(3.0f32);
            assert_eq!(std::hint::black_box(1.0f32 / three).to_bits(), 0x3EAA_AAAA);
            let got: Vec<u32> = (1..=64).map(|w| mean_scale(w).to_bits()).collect();
            assert_eq!(got, want);
            assert!(crate::fpenv::is_altered());
        })
        .join()
        .unwrap();
    }

    /// Today's roles, written out by hand (docs/REPORT.md, "A group"; the
    /// audit's oracle; the backends' skip reasons). A method that drifted
    /// from them fails here.
    #[test]
    fn contract_roles_are_the_documented_ones() {
        let table = [
            ("fixed-order", OrderRole::Invariant, false, false),
            ("arrival-order", OrderRole::Changes, true, false),
            ("pairwise-tree", OrderRole::Invariant, false, false),
            ("nccl-allreduce", OrderRole::Ignored, false, true),
        ];
        assert_eq!(ALL_CONTRACTS.len(), table.len());
        for (c, (name, role, dependent, nccl)) in ALL_CONTRACTS.into_iter().zip(table) {
            assert_eq!(c.name(), name);
            assert_eq!(c.order_role(), role, "{c}");
            assert_eq!(c.order_dependent(), dependent, "{c}");
            assert_eq!(c.needs_nccl(), nccl, "{c}");
        }
        // The table can tell contracts apart: it is not one answer for all.
        assert_ne!(
            Contract::FixedOrder.order_role(),
            Contract::ArrivalOrder.order_role()
        );
        assert_ne!(
            Contract::NcclAllreduce.needs_nccl(),
            Contract::FixedOrder.needs_nccl()
        );
    }

    #[test]
    fn unknown_contract_names_every_contract() {
        let err = "fixed".parse::<Contract>().unwrap_err();
        assert_eq!(
            err,
            "unknown contract `fixed` (expected fixed-order, arrival-order, pairwise-tree or nccl-allreduce)"
        );
        for c in ALL_CONTRACTS {
            assert_eq!(c.name().parse::<Contract>(), Ok(c));
        }
    }

    #[test]
    fn shard_plan_matches_the_contract() {
        let lens =
            |n, w| -> Vec<usize> { shard_plan(n, w).unwrap().iter().map(|s| s.len).collect() };
        assert_eq!(lens(10, 4), vec![3, 3, 2, 2]);
        let p = shard_plan(3, 5).unwrap();
        let pairs: Vec<_> = p.iter().map(|s| (s.start, s.len)).collect();
        assert_eq!(pairs, vec![(0, 1), (1, 1), (2, 1), (3, 0), (3, 0)]);
        assert!(shard_plan(5, 0).is_none());
        for n in 0..40 {
            for w in 1..12 {
                let p = shard_plan(n, w).unwrap();
                assert_eq!(p.iter().map(|s| s.len).sum::<usize>(), n);
                let mut next = 0;
                for s in &p {
                    assert_eq!(s.start, next);
                    next += s.len;
                }
            }
        }
    }

    #[test]
    fn pinned_example_from_upstream() {
        // a=[1e8, 2.5], b=[-1e8, 0.5], c=[1, -1]: ascending gives 1, reversed 0.
        let slots = [1e8f32, -1e8, 1.0];
        assert_eq!(fold_fixed(&slots).to_bits(), 1.0f32.to_bits());
        assert_eq!(
            fold_in_order(&slots, &[2, 1, 0]).to_bits(),
            0.0f32.to_bits()
        );
    }

    #[test]
    fn fold_starts_from_rank_zero_not_zero() {
        // -0.0 + -0.0 stays -0.0; starting from +0.0 would give +0.0.
        let slots = [-0.0f32, -0.0, -0.0];
        assert_eq!(fold_fixed(&slots).to_bits(), (-0.0f32).to_bits());
    }

    #[test]
    fn pairwise_differs_from_fixed_on_some_input() {
        let slots = [1e8f32, 1.0, -1e8, 1.0];
        // fixed: ((1e8 + 1) - 1e8) + 1 = 0 + 1 = 1 (1e8+1 rounds to 1e8)
        // tree:  (1e8 + 1) + (-1e8 + 1) = 1e8 - 1e8 = 0
        assert_ne!(
            fold_fixed(&slots).to_bits(),
            fold_pairwise(&slots).to_bits()
        );
    }
}
