//! The on-disk kernel cache on a GPU, through the binary (needs a CUDA GPU;
//! built with `--features gpu-tests`, fails without a device).
//!
//! `cargo test --release --features gpu-tests --test gpu_kernel_cache`

use assert_cmd::Command;
use serde_json::Value;
use std::path::Path;

/// `foldprint run experiments/smoke.toml --backend cuda --json` with the
/// cache under `cache`: the report.
fn run(cache: &Path, extra: &[&str]) -> Value {
    let out = Command::cargo_bin("foldprint")
        .expect("binary")
        .env("XDG_CACHE_HOME", cache)
        .args([
            "run",
            "experiments/smoke.toml",
            "--backend",
            "cuda",
            "--json",
        ])
        .args(extra)
        .output()
        .expect("run");
    assert!(
        out.status.success(),
        "the cache tests need a usable CUDA GPU: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("a JSON report")
}

fn digests(r: &Value) -> Vec<String> {
    r["cases"]
        .as_array()
        .expect("cases")
        .iter()
        .flat_map(|c| c["arenas"].as_array().expect("arenas").iter())
        .map(|a| a["sha256"].as_str().expect("sha256").to_string())
        .collect()
}

fn origin<'a>(r: &'a Value, program: &str) -> &'a Value {
    &r["environment"]["backend"]["kernel_cache"][program]
}

#[test]
fn warm_runs_load_cached_kernels_with_the_same_bits() {
    let work = tempfile::tempdir().expect("temp dir");
    let dir = work.path().join("cache");
    let cold = run(&dir, &[]);
    let warm = run(&dir, &[]);
    for p in ["fold_program", "generator_program"] {
        let (c, w) = (origin(&cold, p), origin(&warm, p));
        assert_eq!(c["from_cache"], false, "{p} cold: {c}");
        assert_eq!(w["from_cache"], true, "{p} warm: {w}");
        assert_eq!(c["key"], w["key"], "{p}");
        assert_eq!(w["compile_ms"].as_f64(), Some(0.0), "{p}");
        let entry = w["entry"].as_str().expect("entry");
        assert!(entry.starts_with(&dir.display().to_string()), "{entry}");
        // Same image as the cold build.
        let img = |r: &Value| r["environment"]["backend"][p]["sha256"].clone();
        assert_eq!(img(&cold), img(&warm), "{p}");
    }
    assert_eq!(digests(&cold), digests(&warm));
    let s = &warm["environment"]["backend"]["startup_ms"];
    eprintln!(
        "cold: {} / warm: {}",
        cold["environment"]["backend"]["startup_ms"], s
    );
    assert_eq!(s["nvrtc_compile"].as_f64(), Some(0.0), "{s}");

    // A damaged entry is compiled again, said so, and the bits hold.
    let entry = origin(&warm, "fold_program")["entry"]
        .as_str()
        .expect("entry")
        .to_string();
    let mut bytes = std::fs::read(&entry).expect("entry");
    bytes.truncate(bytes.len() / 2);
    std::fs::write(&entry, &bytes).expect("truncate");
    let healed = run(&dir, &[]);
    let o = origin(&healed, "fold_program");
    assert_eq!(o["from_cache"], false, "{o}");
    assert!(
        o["note"].as_str().unwrap_or("").contains("untrusted"),
        "{o}"
    );
    assert_eq!(origin(&healed, "generator_program")["from_cache"], true);
    assert_eq!(digests(&healed), digests(&cold));

    // --no-kernel-cache compiles fresh and writes nothing.
    let empty = work.path().join("unused");
    std::fs::create_dir(&empty).expect("dir");
    let fresh = run(&empty, &["--no-kernel-cache"]);
    for p in ["fold_program", "generator_program"] {
        let o = origin(&fresh, p);
        assert_eq!(o["from_cache"], false, "{p}: {o}");
        assert!(o["key"].is_null(), "{p}: {o}");
    }
    assert_eq!(
        std::fs::read_dir(&empty).expect("dir").count(),
        0,
        "--no-kernel-cache wrote into the cache directory"
    );
    assert_eq!(digests(&fresh), digests(&cold));

    // The library hashes: remembered by the cached runs (the warm one takes
    // them from the memo), read afresh by --no-kernel-cache, and the same.
    let memos = std::fs::read_dir(dir.join("foldprint").join("file-sha256"))
        .expect("the file-hash memo")
        .count();
    assert!(memos >= 1, "no library hash remembered");
    let libs = |r: &Value| {
        let mut v: Vec<(String, String)> = r["environment"]["backend"]["libraries"]
            .as_array()
            .expect("libraries")
            .iter()
            .map(|l| {
                (
                    l["path"].as_str().expect("path").to_string(),
                    l["sha256"].as_str().expect("sha256").to_string(),
                )
            })
            .collect();
        v.sort();
        v
    };
    // A warm run maps fewer files (no NVRTC builtins without a compile):
    // every file both list must have one hash, NVRTC's among them.
    let fresh_libs = libs(&fresh);
    for r in [&cold, &warm] {
        let listed = libs(r);
        let both: Vec<_> = listed
            .iter()
            .filter(|(p, _)| fresh_libs.iter().any(|(q, _)| q == p))
            .collect();
        assert!(
            both.iter().any(|(p, _)| p.contains("libnvrtc.so")),
            "{listed:?}"
        );
        for (p, sha) in both {
            assert!(
                fresh_libs.contains(&(p.clone(), sha.clone())),
                "{p}: remembered {sha} differs from the fresh hash"
            );
        }
    }
}

/// `startup_ms` of a report, as numbers.
fn startup(r: &Value) -> (f64, f64, f64, f64, f64) {
    let s = &r["environment"]["backend"]["startup_ms"];
    let f = |k: &str| {
        s[k].as_f64()
            .unwrap_or_else(|| panic!("startup_ms.{k} missing: {s}"))
    };
    (
        f("context"),
        f("images"),
        f("overlapped"),
        f("programs"),
        f("nvrtc_compile"),
    )
}

#[test]
fn a_cold_start_compiles_while_the_context_is_created() {
    let work = tempfile::tempdir().expect("temp dir");
    let dir = work.path().join("cache");
    // Compiled fresh: all three programs go through NVRTC.
    let cold = run(&dir, &["--no-kernel-cache"]);
    let (context, images, overlapped, programs, nvrtc) = startup(&cold);
    eprintln!(
        "cold: context {context:.1} ms, images {images:.1} ms, side by side {overlapped:.1} ms, \
         programs {programs:.1} ms, NVRTC {nvrtc:.1} ms"
    );
    assert!(context > 0.0 && images > 0.0 && nvrtc > 0.0, "{cold}");
    // The section lasts at least as long as each of its parts...
    assert!(
        overlapped >= context.max(images),
        "{overlapped} vs {context}, {images}"
    );
    assert!(
        overlapped <= context + programs,
        "{overlapped} vs {context} + {programs}"
    );
    // ...and, the parts running side by side, clearly less than both one
    // after the other: at least half of the shorter part was hidden.
    assert!(
        overlapped <= context + images - 0.5 * context.min(images),
        "not overlapped: {overlapped} ms for context {context} ms and images {images} ms"
    );

    // Warm: the images come from the disk cache, well inside the context.
    run(&dir, &[]);
    let warm = run(&dir, &[]);
    let (context, images, overlapped, programs, nvrtc) = startup(&warm);
    eprintln!(
        "warm: context {context:.1} ms, images {images:.1} ms, side by side {overlapped:.1} ms, \
         programs {programs:.1} ms, NVRTC {nvrtc:.1} ms"
    );
    assert_eq!(nvrtc, 0.0, "{warm}");
    assert!(overlapped >= context.max(images), "{warm}");
    assert!(overlapped <= context + programs, "{warm}");
}
