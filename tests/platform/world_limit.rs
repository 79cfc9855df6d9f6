//! W is held to 1 ..= MAX_WORLD in one place, `WorldSize`'s constructor:
//! no other code of the library compares a number with `MAX_WORLD` (it
//! may name it in a message or re-export it). Comments, string literals
//! and test modules are not code here.

use std::path::{Path, PathBuf};

/// Files that still compare, each with why (none now; kept so that an
/// exception must be written down with its reason).
const EXEMPT: &[(&str, &str)] = &[];

fn files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// A line of code without its comment and the contents of its string
/// literals.
fn code_of(line: &str) -> String {
    let mut out = String::new();
    let mut in_str = false;
    let mut chars = line.chars().peekable();
    while let Some(c) = chars.next() {
        if in_str {
            match c {
                '\\' => {
                    chars.next();
                }
                '"' => {
                    in_str = false;
                    out.push(c);
                }
                _ => {}
            }
        } else if c == '"' {
            in_str = true;
            out.push(c);
        } else if c == '/' && chars.peek() == Some(&'/') {
            break;
        } else {
            out.push(c);
        }
    }
    out
}

/// The lines of `text` (outside its test module) whose code uses
/// `MAX_WORLD` other than in a `use`.
fn uses_of_the_limit(text: &str) -> Vec<String> {
    let code = text.split("#[cfg(test)]").next().unwrap_or_default();
    code.lines()
        .map(code_of)
        .filter(|l| l.contains("MAX_WORLD") && !l.trim_start().starts_with("use "))
        .filter(|l| !l.trim_start().starts_with("pub use "))
        .collect()
}

#[test]
fn only_world_size_holds_w_to_max_world() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut all = Vec::new();
    files(&src, &mut all);
    let mut found = Vec::new();
    for f in &all {
        let rel = f.strip_prefix(&src).unwrap().to_string_lossy().into_owned();
        if rel == "world_size.rs" || EXEMPT.iter().any(|(e, _)| *e == rel) {
            continue;
        }
        for l in uses_of_the_limit(&std::fs::read_to_string(f).unwrap()) {
            found.push(format!("{rel}: {}", l.trim()));
        }
    }
    assert!(
        found.is_empty(),
        "W is checked against MAX_WORLD outside WorldSize::new:\n{}",
        found.join("\n")
    );
    // Each exemption is still needed.
    for (rel, why) in EXEMPT {
        let text = std::fs::read_to_string(src.join(rel)).unwrap();
        assert!(!uses_of_the_limit(&text).is_empty(), "{rel} ({why})");
    }
}

/// Negative control: the checks the experiment loader, the case builder
/// and the report reader each made before there was a `WorldSize` are
/// found; a message naming the limit, a comment and a `use` are not.
#[test]
fn the_scan_finds_a_comparison_with_the_limit() {
    let old = r#"
use super::{MAX_CASE_BYTES, MAX_WORLD};
            if v < 1 || v as u64 > MAX_WORLD as u64 {
            Some(w) if w.get() <= MAX_WORLD => w,
    if !(1..=MAX_WORLD).contains(&p.world) {
            "params.world {} is not in 1..={MAX_WORLD}",
// W in 1..=MAX_WORLD
"#;
    let found = uses_of_the_limit(old);
    assert_eq!(found.len(), 3, "{found:?}");
    assert!(found[0].contains("as u64 > MAX_WORLD"), "{found:?}");
}
