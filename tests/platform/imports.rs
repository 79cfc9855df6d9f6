//! ARCHITECTURE.md: the library's modules form no import cycle. Each file's
//! `crate::` and `super::` paths (outside comments and its test module)
//! name the modules it uses; a use of one's own ancestor or descendant is
//! not an edge (a parent declares its children).

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

/// `word::word::...` at the start of `s`.
fn path_at(s: &str) -> Vec<&str> {
    let end = s
        .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':'))
        .unwrap_or(s.len());
    s[..end].split("::").filter(|p| !p.is_empty()).collect()
}

fn is_related(a: &str, b: &str) -> bool {
    a == b || a.starts_with(&format!("{b}::")) || b.starts_with(&format!("{a}::"))
}

fn library_graph() -> Graph {
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
        let text = std::fs::read_to_string(f).unwrap();
        let code: String = text
            .split("#[cfg(test)]")
            .next()
            .unwrap()
            .lines()
            .filter(|l| !l.trim_start().starts_with("//"))
            .collect::<Vec<_>>()
            .join("\n");
        modules.insert(module_of(rel), code);
    }
    let names: BTreeSet<String> = modules.keys().cloned().collect();
    let resolve = |parts: &[&str]| -> Option<String> {
        (1..=parts.len())
            .rev()
            .map(|k| parts[..k].join("::"))
            .find(|m| names.contains(m))
    };
    let mut g = Graph::new();
    for (m, code) in &modules {
        let parent: Vec<&str> = m.split("::").filter(|p| !p.is_empty()).collect();
        let parent = &parent[..parent.len().saturating_sub(1)];
        let mut edges = BTreeSet::new();
        for (i, _) in code.match_indices("crate::") {
            if let Some(t) = resolve(&path_at(&code[i + 7..])) {
                edges.insert(t);
            }
        }
        for (i, _) in code.match_indices("super::") {
            let mut parts: Vec<&str> = parent.to_vec();
            parts.extend(path_at(&code[i + 7..]));
            if let Some(t) = resolve(&parts) {
                edges.insert(t);
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
