//! A report is verified, not trusted: before `compare`, `verify` or
//! `attest` believe one, every digest in it must be well formed and every
//! derived field must follow from the fields it is derived from (rank
//! digests -> arena digest and `ranks_identical`, chunk digests ->
//! `chunk_root`, params -> case key, cases -> groups and summary). A
//! report that fails is corrupt input, never "agree".

use super::{build_groups, CaseReport, Report};
use std::collections::HashMap;

/// Whether `s` is a SHA-256 digest as foldprint writes it (64 lowercase hex).
pub fn is_digest(s: &str) -> bool {
    s.len() == 64
        && s.bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// The case key its parameters imply (see docs/SPEC.md, "Case key").
pub fn key_of(c: &CaseReport) -> (String, String) {
    let p = &c.params;
    let lens: Vec<String> = p.arenas.iter().map(|n| n.to_string()).collect();
    let group = format!(
        "{}/{}/W{}/n{}/{}/s{}",
        p.contract,
        if p.mean { "mean" } else { "sum" },
        p.world,
        lens.join("+"),
        p.distribution,
        p.seed
    );
    (format!("{group}/{}", p.order), group)
}

fn check_case(c: &CaseReport, problems: &mut Vec<String>) {
    let mut bad = |m: String| problems.push(format!("case `{}` ({}): {m}", c.id, c.key));
    let (key, group) = key_of(c);
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
        for (what, d) in std::iter::once(("sha256", &a.sha256))
            .chain(a.rank_sha256.iter().map(|d| ("rank_sha256", d)))
            .chain(a.chunk_sha256.iter().map(|d| ("chunk_sha256", d)))
        {
            if !is_digest(d) {
                bad_arena(format!("{what} `{d}` is not a SHA-256 digest"));
            }
        }
        if a.rank_sha256.len() != c.params.world {
            bad_arena(format!(
                "{} rank digests for W={}",
                a.rank_sha256.len(),
                c.params.world
            ));
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
        if !a.chunk_sha256.is_empty() || !a.chunk_root.is_empty() {
            let root = crate::digest::ChunkedDigest {
                sha256: String::new(),
                chunks: a.chunk_sha256.clone(),
            }
            .chunk_root();
            if a.chunk_root != root {
                bad_arena("chunk_root does not match its chunk digests".into());
            }
            let want = if a.chunk_elems == 0 {
                usize::MAX
            } else {
                a.len.div_ceil(a.chunk_elems)
            };
            if a.chunk_sha256.len() != want {
                bad_arena(format!(
                    "{} chunk digests for {} elements in chunks of {}",
                    a.chunk_sha256.len(),
                    a.len,
                    a.chunk_elems
                ));
            }
        }
    }
    let identical = c.arenas.iter().all(|a| a.ranks_identical);
    if c.ranks_identical != identical {
        bad(format!(
            "ranks_identical is {} but its arenas say {identical}",
            c.ranks_identical
        ));
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
        check_case(c, &mut out);
    }
    let groups = build_groups(&r.cases);
    let verdicts = |g: &[super::Group]| -> Vec<(String, bool, super::GroupVerdict, Vec<String>)> {
        g.iter()
            .map(|g| (g.key.clone(), g.ok, g.verdict, g.cases.clone()))
            .collect()
    };
    if verdicts(&groups) != verdicts(&r.groups) {
        out.push("its invariance groups do not follow from its cases".into());
    }
    let mut again = r.clone();
    again.summarize();
    let (s, t) = (&r.summary, &again.summary);
    if s.ok != t.ok || s.failures != t.failures {
        out.push(format!(
            "summary says ok = {} but its cases and groups say ok = {}",
            s.ok, t.ok
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
