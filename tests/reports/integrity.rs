//! Reports are verified, not trusted: `compare`, `verify` and `attest`
//! check every digest a report or golden carries and its internal
//! consistency, and say when two sides hashed NaNs differently.

use foldprint::report::Report;
use predicates::prelude::*;
use serde_json::Value;
use std::path::{Path, PathBuf};

use crate::common::{fp, write};

/// Two arenas, one of several chunks; orders so that groups exist.
const EXP: &str = r#"
name = "integ"
[defaults]
world = 3
arenas = [140000, 5]
seed = 3
[[sweep]]
id = "o"
order = ["ascending", "descending"]
contract = ["fixed-order", "arrival-order"]
"#;

struct Fixture {
    dir: tempfile::TempDir,
    exp: PathBuf,
    report: PathBuf,
    dump: PathBuf,
}

fn fixture() -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let exp = write(dir.path(), "integ.toml", EXP);
    let crate::common::RunOutputs { report, dump } =
        crate::common::run_outputs(dir.path(), &exp, "a");
    Fixture {
        dir,
        exp,
        report,
        dump,
    }
}

fn json(p: &Path) -> Value {
    serde_json::from_slice(&std::fs::read(p).unwrap()).unwrap()
}

fn put(dir: &Path, name: &str, v: &Value) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, serde_json::to_vec_pretty(v).unwrap()).unwrap();
    p
}

/// A digest that differs from `d` in its last hex digit.
fn flip(d: &str) -> String {
    let last = u8::from_str_radix(&d[63..], 16).unwrap() ^ 1;
    format!("{}{last:x}", &d[..63])
}

fn chunk_root(chunks: &Value) -> String {
    let chunks: Vec<foldprint::digest::Sha256> = serde_json::from_value(chunks.clone()).unwrap();
    foldprint::digest::chunk_root(&chunks).to_string()
}

/// Make groups and summary follow from the (edited) cases.
fn settle(v: Value) -> Value {
    let mut r: Report = serde_json::from_value(v).unwrap();
    r.groups = foldprint::report::build_groups(&r.cases);
    r.summarize();
    serde_json::to_value(&r).unwrap()
}

// 8. Each kind of internal inconsistency is corrupt input (exit 2), never
// "agree", for compare and for attest.
#[test]
fn inconsistent_reports_are_refused() {
    let f = fixture();
    let base = json(&f.report);
    type Edit = fn(&mut Value);
    let edits: [(&str, Edit); 10] = [
        ("rank digest", |v| {
            let d = v["cases"][0]["arenas"][0]["rank_sha256"][1]
                .as_str()
                .unwrap()
                .to_string();
            v["cases"][0]["arenas"][0]["rank_sha256"][1] = flip(&d).into();
        }),
        ("chunk digest", |v| {
            let d = v["cases"][0]["arenas"][0]["chunk_sha256"][1]
                .as_str()
                .unwrap()
                .to_string();
            v["cases"][0]["arenas"][0]["chunk_sha256"][1] = flip(&d).into();
        }),
        ("chunk root", |v| {
            let d = v["cases"][0]["arenas"][0]["chunk_root"]
                .as_str()
                .unwrap()
                .to_string();
            v["cases"][0]["arenas"][0]["chunk_root"] = flip(&d).into();
        }),
        ("ranks_identical", |v| {
            v["cases"][0]["arenas"][0]["ranks_identical"] = false.into();
        }),
        ("case ranks_identical", |v| {
            v["cases"][0]["ranks_identical"] = false.into();
        }),
        ("summary ok", |v| v["summary"]["ok"] = false.into()),
        ("len", |v| v["cases"][0]["arenas"][1]["len"] = 6.into()),
        ("params", |v| v["cases"][0]["params"]["seed"] = 4.into()),
        ("duplicate case", |v| {
            let c = v["cases"][0].clone();
            v["cases"].as_array_mut().unwrap().push(c);
        }),
        ("group verdict", |v| v["groups"][0]["ok"] = false.into()),
    ];
    for (what, edit) in edits {
        let mut v = base.clone();
        edit(&mut v);
        let b = put(f.dir.path(), "b.json", &v);
        for (l, r) in [(&f.report, &b), (&b, &f.report)] {
            let a = fp().arg("compare").arg(l).arg(r).assert().code(2);
            let err = String::from_utf8_lossy(&a.get_output().stderr).into_owned();
            assert!(
                err.contains("b.json") && err.contains("inconsistent report"),
                "{what}: {err}"
            );
        }
        fp().arg("attest")
            .arg(&b)
            .arg("--out")
            .arg(f.dir.path().join("st.json"))
            .assert()
            .code(2);
    }
    // A malformed digest is refused where it is read, by its path.
    let mut v = base.clone();
    v["cases"][0]["arenas"][1]["sha256"] = "zz".into();
    let b = put(f.dir.path(), "b.json", &v);
    for (l, r) in [(&f.report, &b), (&b, &f.report)] {
        let a = fp().arg("compare").arg(l).arg(r).assert().code(2);
        let err = String::from_utf8_lossy(&a.get_output().stderr).into_owned();
        assert!(
            err.contains("b.json")
                && err.contains("cases[0].arenas[1].sha256: `zz` is not a SHA-256 digest"),
            "{err}"
        );
    }
    // Negative control: the unedited report, re-serialized, is accepted.
    let b = put(f.dir.path(), "b.json", &base);
    fp().arg("compare")
        .arg(&f.report)
        .arg(&b)
        .assert()
        .success();
}

// 8. Consistent reports that differ anywhere but the arena digest differ.
#[test]
fn every_digest_is_compared() {
    let f = fixture();
    let base = json(&f.report);
    // One rank ended with another arena (a failed run, consistently told).
    let mut v = base.clone();
    let d = v["cases"][0]["arenas"][0]["rank_sha256"][2]
        .as_str()
        .unwrap()
        .to_string();
    v["cases"][0]["arenas"][0]["rank_sha256"][2] = flip(&d).into();
    v["cases"][0]["arenas"][0]["ranks_identical"] = false.into();
    v["cases"][0]["ranks_identical"] = false.into();
    let b = put(f.dir.path(), "b.json", &settle(v));
    fp().arg("compare")
        .arg(&f.report)
        .arg(&b)
        .assert()
        .code(1)
        .stdout(predicate::str::contains("arena 0 rank 2 digest"));
    // One chunk digest (with its root) differs while the arena digest agrees.
    let mut v = base.clone();
    let arena = &mut v["cases"][1]["arenas"][0];
    let d = arena["chunk_sha256"][2].as_str().unwrap().to_string();
    arena["chunk_sha256"][2] = flip(&d).into();
    arena["chunk_root"] = chunk_root(&arena["chunk_sha256"]).into();
    let b = put(f.dir.path(), "b.json", &settle(v));
    fp().arg("compare")
        .arg(&f.report)
        .arg(&b)
        .assert()
        .code(1)
        .stdout(predicate::str::contains(
            "arena 0 chunk 2 (elements 131072..140000) digest",
        ));
}

// 8. Two reports hashed with different NaN policies are not comparable.
#[test]
fn different_nan_policies_are_named() {
    let f = fixture();
    let b = f.dir.path().join("b.json");
    fp().args([
        "run",
        "--backend",
        "cpu",
        "--nan-policy",
        "preserve",
        "--out",
    ])
    .arg(&b)
    .arg(&f.exp)
    .assert()
    .success();
    fp().arg("compare")
        .arg(&f.report)
        .arg(&b)
        .assert()
        .code(1)
        .stdout(predicate::str::contains("used NaN policy `canonical`"))
        .stdout(predicate::str::contains("`preserve`"));
}

// 8. Goldens are checked too: duplicate keys and malformed digests.
#[test]
fn verify_refuses_corrupt_goldens() {
    let f = fixture();
    let gdir = f.dir.path().join("golden");
    fp().args(["golden"])
        .arg(&f.exp)
        .arg("--golden")
        .arg(&gdir)
        .assert()
        .success();
    let gpath = gdir.join("integ.json");
    let good = json(&gpath);
    let verify = || {
        let mut c = fp();
        c.args(["verify", "--backend", "cpu", "--golden"])
            .arg(&gdir)
            .arg(&f.exp);
        c
    };
    verify().assert().success();
    let mut dup = good.clone();
    let c = dup["cases"][0].clone();
    dup["cases"].as_array_mut().unwrap().push(c);
    std::fs::write(&gpath, serde_json::to_vec(&dup).unwrap()).unwrap();
    verify()
        .assert()
        .code(2)
        .stderr(predicate::str::contains("appears twice"));
    let mut bad = good.clone();
    bad["cases"][0]["arenas"][0] = "zz".into();
    std::fs::write(&gpath, serde_json::to_vec(&bad).unwrap()).unwrap();
    verify()
        .assert()
        .code(2)
        .stderr(predicate::str::contains("`zz` is not a SHA-256 digest"));
}

// 9. attest checks every dump against the report's digest.
#[test]
fn attest_checks_dumps_against_the_report() {
    let f = fixture();
    let st = f.dir.path().join("st.json");
    let attest = |report: &Path| {
        let mut c = fp();
        c.arg("attest")
            .arg(report)
            .arg("--dump")
            .arg(&f.dump)
            .arg("--out")
            .arg(&st);
        c
    };
    attest(&f.report).assert().success();
    // A dump replaced with other bytes, SHA256SUMS updated to match: the
    // directory is self-consistent, but not the run the report describes.
    let sums = std::fs::read_to_string(f.dump.join("SHA256SUMS")).unwrap();
    let (hash, name) = sums.lines().next().unwrap().split_once("  ").unwrap();
    let mut bytes = std::fs::read(f.dump.join(name)).unwrap();
    bytes[0] ^= 1;
    std::fs::write(f.dump.join(name), &bytes).unwrap();
    let new = foldprint::digest::Sha256::of(&bytes).to_string();
    std::fs::write(f.dump.join("SHA256SUMS"), sums.replacen(hash, &new, 1)).unwrap();
    std::fs::remove_file(&st).unwrap();
    attest(&f.report)
        .assert()
        .code(1)
        .stderr(predicate::str::contains("the report says"));
    assert!(!st.exists());
    // A malformed digest in SHA256SUMS.
    std::fs::write(f.dump.join("SHA256SUMS"), sums.replacen(hash, "zz", 1)).unwrap();
    attest(&f.report).assert().code(2);
    assert!(!st.exists());
}

// 10. A golden file can stand on either side of compare.
#[test]
fn compare_accepts_a_golden_on_either_side() {
    let dir = tempfile::tempdir().unwrap();
    let r = dir.path().join("r.json");
    fp().args(["run", "--backend", "cpu", "--out"])
        .arg(&r)
        .arg("experiments/smoke.toml")
        .assert()
        .success();
    let g = Path::new("experiments/golden/smoke.json");
    fp().arg("compare").arg(&r).arg(g).assert().success();
    fp().arg("compare")
        .arg(g)
        .arg(&r)
        .assert()
        .success()
        .stdout(predicate::str::contains("golden of `smoke`"));
    // Negative control: one altered golden digest.
    let mut v = json(g);
    let d = v["cases"][0]["arenas"][0].as_str().unwrap().to_string();
    v["cases"][0]["arenas"][0] = flip(&d).into();
    let bad = put(dir.path(), "smoke.json", &v);
    fp().arg("compare")
        .arg(&bad)
        .arg(&r)
        .assert()
        .code(1)
        .stdout(predicate::str::contains("arena 0"));
}
