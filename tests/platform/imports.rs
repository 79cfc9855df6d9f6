//! ARCHITECTURE.md: the library's modules form no import cycle. Each file's
//! `crate::` and `super::` paths (outside comments and its test module)
//! name the modules it uses; a use of one's own ancestor or descendant is
//! not an edge (a parent declares its children).
//!
//! The same scan holds where one run lives: nothing in the library but
//! `exit` imports `run` (the walk of a run never climbs back up), the
//! command line calls none of a run's steps itself, and the launcher's
//! variables are read only into `ranks::world`.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

type Graph = BTreeMap<String, BTreeSet<String>>;

/// Module path of a file under src/ (`gpu/kernels/mod.rs` is `gpu::kernels`).
fn module_of(rel: &Path) -> String {
    let mut parts: Vec<String> = rel
        .with_extension("")
        .iter()
        .map(|p| p.to_string_lossy().into_owned())
        .collect();
    if matches!(parts.last().map(String::as_str), Some("mod" | "lib")) {
        parts.pop();
    }
    parts.join("::")
}

fn files(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// The paths at the start of `s`: `a::b` is one, `a::{b, c::{d, e}}` is
/// three (`a::b`, `a::c::d`, `a::c::e`).
fn paths_at(s: &str) -> Vec<Vec<&str>> {
    let end = s
        .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':'))
        .unwrap_or(s.len());
    let head: Vec<&str> = s[..end].split("::").filter(|p| !p.is_empty()).collect();
    let rest = &s[end..];
    if !rest.starts_with('{') {
        return vec![head];
    }
    let mut depth = 0;
    let mut items = Vec::new();
    let mut start = 1;
    for (i, c) in rest.char_indices() {
        match c {
            '{' => depth += 1,
            '}' | ',' if depth == 1 => {
                items.push(rest[start..i].trim_start());
                start = i + 1;
                if c == '}' {
                    break;
                }
            }
            '}' => depth -= 1,
            _ => {}
        }
    }
    let mut out: Vec<Vec<&str>> = items
        .into_iter()
        .filter(|item| !item.is_empty())
        .flat_map(paths_at)
        .map(|tail| head.iter().copied().chain(tail).collect())
        .collect();
    if out.is_empty() {
        out.push(head);
    }
    out
}

fn is_related(a: &str, b: &str) -> bool {
    a == b || a.starts_with(&format!("{b}::")) || b.starts_with(&format!("{a}::"))
}

/// A source file's code: its lines outside `//` comments, before its test
/// module.
fn code_of(file: &Path) -> String {
    let text = std::fs::read_to_string(file).unwrap();
    text.split("#[cfg(test)]")
        .next()
        .unwrap()
        .lines()
        .filter(|l| !l.trim_start().starts_with("//"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Each library module's code, by module path, outside comments and test
/// modules.
fn library_sources() -> BTreeMap<String, String> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut all = Vec::new();
    files(&src, &mut all);
    let mut modules: BTreeMap<String, String> = BTreeMap::new();
    for f in &all {
        let rel = f.strip_prefix(&src).unwrap();
        // The binary (main.rs, cli/) stands on the library; it is not in it.
        if rel.starts_with("cli") || rel == Path::new("main.rs") {
            continue;
        }
        modules.insert(module_of(rel), code_of(f));
    }
    modules
}

fn library_graph() -> Graph {
    graph_of(&library_sources())
}

/// Which modules each module's `crate::` and `super::` paths name.
fn graph_of(modules: &BTreeMap<String, String>) -> Graph {
    let names: BTreeSet<String> = modules.keys().cloned().collect();
    let resolve = |parts: &[&str]| -> Option<String> {
        (1..=parts.len())
            .rev()
            .map(|k| parts[..k].join("::"))
            .find(|m| names.contains(m))
    };
    let mut g = Graph::new();
    for (m, code) in modules {
        let parent: Vec<&str> = m.split("::").filter(|p| !p.is_empty()).collect();
        let parent = &parent[..parent.len().saturating_sub(1)];
        let mut edges = BTreeSet::new();
        for (i, _) in code.match_indices("crate::") {
            for path in paths_at(&code[i + 7..]) {
                if let Some(t) = resolve(&path) {
                    edges.insert(t);
                }
            }
        }
        for (i, _) in code.match_indices("super::") {
            for path in paths_at(&code[i + 7..]) {
                let parts: Vec<&str> = parent.iter().copied().chain(path).collect();
                if let Some(t) = resolve(&parts) {
                    edges.insert(t);
                }
            }
        }
        edges.retain(|t| !is_related(m, t));
        g.insert(m.clone(), edges);
    }
    g
}

/// The strongly connected groups of more than one module (Tarjan).
fn cycles(g: &Graph) -> Vec<Vec<String>> {
    struct S<'a> {
        g: &'a Graph,
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        on: BTreeSet<&'a str>,
        out: Vec<Vec<String>>,
    }
    fn visit<'a>(s: &mut S<'a>, v: &'a str) {
        let n = s.index.len();
        s.index.insert(v, n);
        s.low.insert(v, n);
        s.stack.push(v);
        s.on.insert(v);
        for w in s.g.get(v).into_iter().flatten() {
            let w = w.as_str();
            if !s.index.contains_key(w) {
                visit(s, w);
                let lw = s.low[w];
                s.low.entry(v).and_modify(|l| *l = (*l).min(lw));
            } else if s.on.contains(w) {
                let iw = s.index[w];
                s.low.entry(v).and_modify(|l| *l = (*l).min(iw));
            }
        }
        if s.low[v] == s.index[v] {
            let mut group = Vec::new();
            while let Some(w) = s.stack.pop() {
                s.on.remove(w);
                group.push(w.to_string());
                if w == v {
                    break;
                }
            }
            if group.len() > 1 {
                s.out.push(group);
            }
        }
    }
    let mut s = S {
        g,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on: BTreeSet::new(),
        out: Vec::new(),
    };
    for v in g.keys() {
        if !s.index.contains_key(v.as_str()) {
            visit(&mut s, v);
        }
    }
    s.out
}

#[test]
fn the_library_has_no_import_cycle() {
    let g = library_graph();
    // The scan sees the edges it must (so an empty result means something).
    assert!(g["runner"].contains("backend"), "{:?}", g["runner"]);
    assert!(g["outputs"].contains("runner"), "{:?}", g["outputs"]);
    assert!(g.len() > 40, "{} modules", g.len());
    assert_eq!(cycles(&g), Vec::<Vec<String>>::new());
    // Negative control: the same graph with the edge that an earlier
    // runner::run had (runner -> outputs) is a cycle.
    let mut with = g.clone();
    with.get_mut("runner").unwrap().insert("outputs".into());
    let found = cycles(&with);
    assert!(
        found
            .iter()
            .any(|c| c.contains(&"runner".to_string()) && c.contains(&"outputs".to_string())),
        "{found:?}"
    );
}

#[test]
fn nothing_in_the_library_climbs_back_up_to_run() {
    let g = library_graph();
    // `run` walks a whole run down through the library; only `exit`, which
    // maps every error to its code, names it.
    let above = |g: &Graph| -> Vec<String> {
        g.iter()
            .filter(|(m, to)| to.contains("run") && m.as_str() != "exit")
            .map(|(m, _)| m.clone())
            .collect()
    };
    assert_eq!(above(&g), Vec::<String>::new());
    for below in ["experiment", "ranks::world", "backend", "runner", "outputs"] {
        assert!(g["run"].contains(below), "run -> {below}: {:?}", g["run"]);
    }
    // Negative control: a backend that called back into the run is found.
    let mut with = g.clone();
    with.get_mut("backend").unwrap().insert("run".into());
    assert_eq!(above(&with), ["backend"]);
}

/// What one run does, from the launcher's variables to its outputs in
/// place: `foldprint::run`'s and `ranks::world`'s to call, never the
/// command line's.
const RUN_LIFECYCLE: [&str; 14] = [
    "from_process_env(",
    "placement::place(",
    "rendezvous::exchange(",
    "experiment_plan(",
    "rank_file_sets(",
    "hash_rank_files(",
    "read_rank_files(",
    "rank_files_read(",
    "backend::select(",
    "complete_rank_files(",
    "lock_all(",
    "run_staged(",
    "outputs::stage(",
    "outputs::commit(",
];

/// `(file, call)` for each of `calls` in the code of the files under `dir`.
fn calls_in(dir: &Path, calls: &[&str]) -> Vec<(String, String)> {
    let mut all = Vec::new();
    if dir.is_dir() {
        files(dir, &mut all);
    } else {
        all.push(dir.to_path_buf());
    }
    all.sort();
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut found = Vec::new();
    for f in &all {
        let code = code_of(f);
        for c in calls {
            if code.contains(c) {
                let rel = f.strip_prefix(&src).unwrap_or(f);
                found.push((rel.display().to_string(), c.to_string()));
            }
        }
    }
    found
}

#[test]
fn the_command_line_leaves_the_run_to_the_library() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    assert_eq!(calls_in(&src.join("cli"), &RUN_LIFECYCLE), []);
    // Negative control: the scan finds the calls where they are.
    let in_run = calls_in(&src.join("run.rs"), &RUN_LIFECYCLE);
    assert!(in_run.len() >= 7, "{in_run:?}");
}

#[test]
fn the_launchers_variables_are_read_once_into_the_world() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let readers: Vec<String> = calls_in(&src, &["from_process_env("])
        .into_iter()
        .map(|(f, _)| f)
        .filter(|f| f != "ranks/discover.rs")
        .collect();
    assert_eq!(readers, ["ranks/world.rs"]);
    // No backend finds its rank, places it or meets the others itself: it
    // is handed the world.
    let own = ["discover::", "placement::place(", "rendezvous::exchange("];
    assert_eq!(calls_in(&src.join("backend"), &own), []);
}

/// The edges from `from` (or a module inside it) to any of `to` (or a
/// module inside one of them).
fn uses(g: &Graph, from: &str, to: &[&str]) -> Vec<(String, String)> {
    let within = |m: &str, root: &str| m == root || m.starts_with(&format!("{root}::"));
    g.iter()
        .filter(|(m, _)| within(m, from))
        .flat_map(|(m, targets)| {
            targets
                .iter()
                .filter(|t| to.iter().any(|root| within(t, root)))
                .map(move |t| (m.clone(), t.clone()))
        })
        .collect()
}

/// The library's sources with `line` added to `module`'s code.
fn sources_with(module: &str, line: &str) -> BTreeMap<String, String> {
    let mut sources = library_sources();
    let code = sources
        .get_mut(module)
        .unwrap_or_else(|| panic!("no module {module}"));
    code.push('\n');
    code.push_str(line);
    sources
}

/// The layering rules of ARCHITECTURE.md, each: who, may not use what.
const RULES: [(&str, &[&str]); 3] = [
    // The NCCL backend stands on `gpu`, as the CUDA backend does, not on it.
    ("backend::nccl", &["backend::cuda"]),
    // The report format that `compare` reads stands on no backend.
    ("report", &["backend"]),
    // The GPU platform knows nothing of ranks, cases, reports or backends.
    (
        "gpu",
        &[
            "audit",
            "backend",
            "bench",
            "experiment",
            "ranks",
            "report",
            "runner",
        ],
    ),
];

#[test]
fn every_layer_uses_only_what_lies_below_it() {
    let g = library_graph();
    for (from, to) in RULES {
        assert!(g.contains_key(from), "no module {from}");
        assert_eq!(uses(&g, from, to), Vec::<(String, String)>::new(), "{from}");
    }
    // The scan sees what these modules do use (so an empty result means
    // something): the NCCL backend the GPU platform, the report the
    // results, the platform the folds.
    assert!(uses(&g, "backend::nccl", &["gpu"]).len() > 3);
    assert!(uses(&g, "report", &["result"]).len() >= 2);
    assert!(uses(&g, "gpu", &["fold"]).len() >= 2);
}

#[test]
fn the_layering_rules_catch_the_imports_they_forbid() {
    // Negative controls: the real sources with one import added back, as
    // each module had it before the layers were separated (one of them
    // inside a `{...}` group, which the scan expands).
    let controls = [
        (
            "backend::nccl",
            "use super::cuda::CudaConfig;",
            "backend::cuda",
        ),
        (
            "backend::nccl::dataflow",
            "use crate::backend::{cuda::CudaConfig, infrastructure};",
            "backend::cuda",
        ),
        (
            "report",
            "use crate::backend::{ReducedArena, RoundTimings};",
            "backend",
        ),
        (
            "report::check",
            "use crate::backend::BackendChoice;",
            "backend",
        ),
        (
            "gpu::kernels::tree",
            "pub fn of(case: &crate::experiment::Case) {}",
            "experiment",
        ),
        (
            "gpu::device",
            "use crate::ranks::rendezvous::Member;",
            "ranks::rendezvous",
        ),
    ];
    for (module, line, target) in controls {
        let g = graph_of(&sources_with(module, line));
        let broken: Vec<(String, String)> = RULES
            .iter()
            .flat_map(|(from, to)| uses(&g, from, to))
            .collect();
        assert!(
            broken.contains(&(module.to_string(), target.to_string())),
            "`{line}` in {module}: {broken:?}"
        );
    }
}
