//! A report is verified, not trusted: before `compare`, `verify` or
//! `attest` believe one, every digest in it must be well formed and every
//! derived field must follow from the fields it is derived from (rank
//! digests -> arena digest and `ranks_identical`, chunk digests ->
//! `chunk_root`, params -> case key, cases -> groups and summary,
//! experiments), and the fields no field derives from must be ones a run
//! can write. A report that fails is corrupt input, never "agree".

use super::{build_groups, check_params, printable, ArenaReport, CaseReport, Group, Report};
use crate::digest::{NanPolicy, CHUNK_ELEMS};
use crate::result::BackendChoice;
use serde_json::Value;
use std::collections::{BTreeMap, HashMap};

fn check_case(c: &CaseReport, nan_policy: NanPolicy, problems: &mut Vec<String>) {
    let mut bad = |m: String| problems.push(format!("case `{}` ({}): {m}", c.id, c.key));
    if let Some(e) = &c.expect {
        for m in e.problems(
            &c.params.arenas,
            c.params.dtype.unwrap_or_default(),
            nan_policy,
        ) {
            bad(m);
        }
    }
    check_expect_ranks(c, nan_policy, &mut bad);
    // A tensor's shape gives its length (an empty shape: one element).
    for (i, a) in c.params.addends.iter().flat_map(|f| &f.arenas).enumerate() {
        let product = a
            .shape
            .iter()
            .try_fold(1u64, |n, &d| n.checked_mul(d))
            .and_then(|n| usize::try_from(n).ok());
        if product != Some(a.len) {
            let dims: Vec<String> = a.shape.iter().map(|d| d.to_string()).collect();
            bad(format!(
                "params.addends.arenas[{i}] (`{}`): shape [{}] does not hold {} elements",
                printable(&a.name),
                dims.join(", "),
                a.len
            ));
        }
    }
    if let Some(case) = check_params::params(c, &mut bad) {
        check_params::sensitivity(c, &case, &mut bad);
    }
    let (key, group) = (c.params.key(), c.params.group_key());
    if c.key != key {
        bad(format!("its parameters make the key {key}"));
    }
    if c.group != group {
        bad(format!("its parameters make the group {group}"));
    }
    if c.arenas.len() != c.params.arenas.len() {
        bad(format!(
            "{} arenas, its parameters declare {}",
            c.arenas.len(),
            c.params.arenas.len()
        ));
    }
    for (i, a) in c.arenas.iter().enumerate() {
        let mut bad_arena = |m: String| bad(format!("arena {i}: {m}"));
        if a.index != i {
            bad_arena(format!("index says {}", a.index));
        }
        if let Some(&n) = c.params.arenas.get(i) {
            if a.len != n {
                bad_arena(format!("len {} but the parameters say {n}", a.len));
            }
        }
        if c.params.collective.is_some_and(|k| !k.is_all_reduce()) {
            check_shards(a, c.params.world, &mut bad_arena);
        } else {
            if a.rank_sha256.len() != c.params.world {
                bad_arena(format!(
                    "{} rank digests for W={}",
                    a.rank_sha256.len(),
                    c.params.world
                ));
            }
            if !a.shard_sha256.is_empty() {
                bad_arena(format!(
                    "{} shard digests, but an all-reduce has none",
                    a.shard_sha256.len()
                ));
            }
        }
        if a.rank_sha256.first().is_some_and(|r0| *r0 != a.sha256) {
            bad_arena("sha256 is not rank 0's digest".into());
        }
        let mut last = 0usize;
        for d in &a.rank_differing_chunks {
            let chunks = a.len.div_ceil(a.chunk_elems.max(1));
            if d.rank <= last || d.rank >= c.params.world {
                bad_arena(format!(
                    "rank_differing_chunks names rank {} (ranks 1..{} in ascending order expected)",
                    d.rank, c.params.world
                ));
            }
            if d.chunks.is_empty()
                || d.chunks.windows(2).any(|w| w[0] >= w[1])
                || d.chunks.iter().any(|&k| k >= chunks)
            {
                bad_arena(format!(
                    "rank_differing_chunks of rank {}: chunk indices must be ascending and below {chunks}",
                    d.rank
                ));
            }
            last = d.rank;
        }
        let identical = a.rank_sha256.windows(2).all(|w| w[0] == w[1]);
        if a.ranks_identical != identical {
            bad_arena(format!(
                "ranks_identical is {} but the rank digests say {identical}",
                a.ranks_identical
            ));
        }
        check_chunks(a, &mut bad_arena);
    }
    let identical = c.arenas.iter().all(|a| a.ranks_identical);
    if c.ranks_identical != identical {
        bad(format!(
            "ranks_identical is {} but its arenas say {identical}",
            c.ranks_identical
        ));
    }
}

/// A reduce-scatter's per-rank `expect` results: one per rank, each of
/// that rank's shard lengths, and none on an all-reduce.
fn check_expect_ranks(c: &CaseReport, nan_policy: NanPolicy, bad: &mut dyn FnMut(String)) {
    if c.expect_ranks.is_empty() {
        return;
    }
    if c.params.collective.is_none_or(|k| k.is_all_reduce()) {
        bad(format!(
            "{} per-rank expect results, but an all-reduce is compared with one file",
            c.expect_ranks.len()
        ));
        return;
    }
    if c.expect_ranks.len() != c.params.world {
        bad(format!(
            "{} per-rank expect results for W={}",
            c.expect_ranks.len(),
            c.params.world
        ));
        return;
    }
    for (r, e) in c.expect_ranks.iter().enumerate() {
        let lens = crate::experiment::shard_lens(&c.params.arenas, c.params.world, r);
        for m in e.problems(&lens, c.params.dtype.unwrap_or_default(), nan_policy) {
            bad(format!("rank {r}'s {m}"));
        }
    }
}

/// A reduce-scatter's arena: W shard digests, no rank copies, and what the
/// shard plan lets a reader recompute: an empty shard's digest, and with
/// one shard holding every element, the arena digest itself.
fn check_shards(a: &ArenaReport, world: usize, bad: &mut dyn FnMut(String)) {
    if !a.rank_sha256.is_empty() {
        bad(format!(
            "{} rank digests, but no rank of a reduce-scatter holds the whole arena",
            a.rank_sha256.len()
        ));
    }
    if a.shard_sha256.len() != world {
        bad(format!(
            "{} shard digests for W={world}",
            a.shard_sha256.len()
        ));
        return;
    }
    let Some(plan) = crate::fold::shard_plan(a.len, world) else {
        return;
    };
    let empty = crate::digest::Sha256::of(&[]);
    for (r, (s, d)) in plan.iter().zip(&a.shard_sha256).enumerate() {
        if s.len == 0 && *d != empty {
            bad(format!(
                "rank {r}'s shard is empty, but its digest is not SHA-256 of no bytes"
            ));
        } else if s.len == a.len && *d != a.sha256 {
            bad(format!(
                "rank {r}'s shard is the whole arena, but its digest is not the arena's sha256"
            ));
        }
    }
}

/// The chunk digests docs/SPEC.md §5 requires of every arena: one per
/// `CHUNK_ELEMS` elements, their root, and with one chunk (or none) the
/// arena digest itself.
fn check_chunks(a: &ArenaReport, bad: &mut dyn FnMut(String)) {
    if a.chunk_elems != CHUNK_ELEMS {
        bad(if a.chunk_elems == 0 {
            format!("no chunk_elems (the format's chunks are {CHUNK_ELEMS} elements)")
        } else {
            format!(
                "chunk_elems {}, but the format's chunks are {CHUNK_ELEMS} elements",
                a.chunk_elems
            )
        });
    }
    let want = a.len.div_ceil(CHUNK_ELEMS);
    if a.chunk_sha256.len() != want {
        bad(format!(
            "{} chunk_sha256 digests for {} elements in chunks of {CHUNK_ELEMS} ({want} required)",
            a.chunk_sha256.len(),
            a.len,
        ));
    }
    if a.chunk_root != crate::digest::chunk_root(&a.chunk_sha256) {
        bad("chunk_root does not match its chunk digests".into());
    }
    match a.chunk_sha256.as_slice() {
        [one] if want == 1 && *one != a.sha256 => {
            bad("its one chunk digest is not its sha256 (one chunk is the whole arena)".into())
        }
        [] if a.len == 0 && a.sha256 != crate::digest::Sha256::of(&[]) => {
            bad("an empty arena's sha256 is not SHA-256 of no bytes".into())
        }
        _ => {}
    }
}

/// `nan_policy`, `backend` and its environment.
fn check_run(r: &Report, out: &mut Vec<String>) {
    let want = <BackendChoice as clap::ValueEnum>::from_str(&r.backend, false)
        .ok()
        .and_then(BackendChoice::environment_kind);
    match (want, r.backend_environment()) {
        (None, _) => out.push(format!(
            "backend `{}` is not a backend foldprint has",
            printable(&r.backend)
        )),
        (Some(kind), env) if env.kind != kind => out.push(format!(
            "backend `{}`, but environment.backend.kind is `{}` (a `{}` run records `{kind}`)",
            r.backend,
            printable(&env.kind),
            r.backend
        )),
        (Some(_), _) => {}
    }
}

/// `experiments` must list where every case (run or skipped) came from,
/// with its case count.
fn check_experiments(r: &Report, out: &mut Vec<String>) {
    let mut count: BTreeMap<&str, usize> = BTreeMap::new();
    let from = r
        .cases
        .iter()
        .map(|c| (c.experiment.as_str(), c.id.as_str(), "case"))
        .chain(
            r.skipped
                .iter()
                .map(|c| (c.experiment.as_str(), c.id.as_str(), "skipped case")),
        );
    for (e, _, _) in from.clone() {
        *count.entry(e).or_default() += 1;
    }
    if r.experiments.is_empty() {
        let names: Vec<String> = count
            .keys()
            .map(|e| format!("`{}`", printable(e)))
            .collect();
        out.push(format!(
            "experiments lists no experiment; its cases come from {}",
            if names.is_empty() {
                "none".into()
            } else {
                names.join(", ")
            }
        ));
        return;
    }
    let mut listed = BTreeMap::new();
    for e in &r.experiments {
        let name = printable(&e.name);
        if listed.insert(e.name.as_str(), ()).is_some() {
            out.push(format!("experiments: `{name}` is listed twice"));
        }
        let held = count.get(e.name.as_str()).copied().unwrap_or(0);
        if e.cases != held {
            out.push(format!(
                "experiments: `{name}` says {} cases, the report holds {held} (run and skipped)",
                e.cases
            ));
        }
    }
    for (e, id, what) in from {
        if !listed.contains_key(e) {
            out.push(format!(
                "{what} `{}`: experiment `{}` is not in experiments",
                printable(id),
                printable(e)
            ));
        }
    }
}

/// Every group field must be what the cases make it.
fn check_groups(r: &Report, out: &mut Vec<String>) {
    let rebuilt = build_groups(&r.cases);
    let keys = |g: &[Group]| g.iter().map(|g| g.key.clone()).collect::<Vec<_>>();
    if keys(&rebuilt) != keys(&r.groups) {
        out.push(format!(
            "its invariance groups are [{}]; its cases make [{}]",
            keys(&r.groups).join(", "),
            keys(&rebuilt).join(", ")
        ));
        return;
    }
    for (mine, theirs) in rebuilt.iter().zip(&r.groups) {
        let (Ok(Value::Object(m)), Ok(Value::Object(t))) =
            (serde_json::to_value(mine), serde_json::to_value(theirs))
        else {
            continue;
        };
        for (field, want) in &m {
            let got = t.get(field).unwrap_or(&Value::Null);
            if got != want {
                out.push(format!(
                    "group {}: `{field}` is {got}, its cases make it {want}",
                    printable(&mine.key)
                ));
            }
        }
    }
}

/// Every internal inconsistency of `r`, in words (empty: consistent).
pub fn problems(r: &Report) -> Vec<String> {
    let mut out = Vec::new();
    let mut keys: HashMap<&str, &str> = HashMap::new();
    for c in &r.cases {
        if let Some(first) = keys.insert(&c.key, &c.id) {
            out.push(format!(
                "case key {} appears twice (cases `{first}` and `{}`)",
                c.key, c.id
            ));
        }
        check_case(c, r.nan_policy, &mut out);
    }
    check_run(r, &mut out);
    check_experiments(r, &mut out);
    check_groups(r, &mut out);
    let mut again = r.clone();
    again.summarize();
    let (s, t) = (&r.summary, &again.summary);
    if s.ok != t.ok || s.failures != t.failures {
        out.push(format!(
            "summary says ok = {} but its cases and groups say ok = {}",
            s.ok, t.ok
        ));
    }
    if s.differs_from_expect != t.differs_from_expect {
        out.push(format!(
            "summary.differs_from_expect lists {} case(s) [{}]; its cases' expect results make it {} [{}]",
            s.differs_from_expect.len(),
            s.differs_from_expect.join("; "),
            t.differs_from_expect.len(),
            t.differs_from_expect.join("; ")
        ));
    }
    if s.cases != t.cases || s.skipped != t.skipped || s.groups != t.groups {
        out.push(format!(
            "summary counts {} cases, {} skipped, {} groups; the report holds {}, {}, {}",
            s.cases, s.skipped, s.groups, t.cases, t.skipped, t.groups
        ));
    }
    out
}
