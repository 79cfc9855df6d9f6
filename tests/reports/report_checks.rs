//! Every field of a report that is evidence is checked when the report is
//! read: an edited field is corrupt input (exit 2) for `compare` and
//! `attest`, with a message naming the file and the field. Each test takes
//! a real smoke report, edits one thing, and checks both commands.

use foldprint::report::Report;
use predicates::prelude::*;
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use crate::common::fp;

/// One smoke run (report and dumps) shared by every test of this file.
struct Smoke {
    _dir: tempfile::TempDir,
    report: PathBuf,
    dump: PathBuf,
}

fn smoke() -> &'static Smoke {
    static S: OnceLock<Smoke> = OnceLock::new();
    S.get_or_init(|| {
        let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
        let report = dir.path().join("r.json");
        let dump = dir.path().join("d");
        fp().args(["run", "--backend", "cpu", "experiments/smoke.toml", "--out"])
            .arg(&report)
            .arg("--dump")
            .arg(&dump)
            .assert()
            .success();
        Smoke {
            _dir: dir,
            report,
            dump,
        }
    })
}

fn base() -> Value {
    serde_json::from_slice(&std::fs::read(&smoke().report).unwrap()).unwrap()
}

/// Make groups and summary follow from the (edited) cases, so that only
/// the edited field is wrong.
fn settle(v: Value) -> Value {
    let mut r: Report = serde_json::from_value(v).unwrap();
    r.groups = foldprint::report::build_groups(&r.cases);
    r.summarize();
    serde_json::to_value(&r).unwrap()
}

/// `compare` (either side) and `attest` refuse `text` as corrupt input,
/// naming the file and every `needles`.
fn refused_text(text: &str, needles: &[&str]) {
    let dir = tempfile::tempdir().unwrap();
    let edited = dir.path().join("edited.json");
    std::fs::write(&edited, text).unwrap();
    let r = &smoke().report;
    let check = |cmd: &mut assert_cmd::Command, what: &str| {
        let a = cmd.assert().code(2);
        let err = String::from_utf8_lossy(&a.get_output().stderr).into_owned();
        assert!(err.contains("edited.json"), "{what}: {err}");
        for n in needles {
            assert!(err.contains(n), "{what}: `{n}` not in: {err}");
        }
    };
    check(fp().arg("compare").arg(r).arg(&edited), "compare R E");
    check(fp().arg("compare").arg(&edited).arg(r), "compare E R");
    let st = dir.path().join("st.json");
    check(
        fp().arg("attest").arg(&edited).arg("--out").arg(&st),
        "attest",
    );
    assert!(!st.exists());
}

fn refused(v: &Value, needles: &[&str]) {
    refused_text(&serde_json::to_string_pretty(v).unwrap(), needles);
}

// Negative control: the unedited report, re-serialized and settled, is
// accepted by both commands (so every refusal below is the edit's doing).
#[test]
fn the_unedited_report_is_accepted() {
    let dir = tempfile::tempdir().unwrap();
    let b = dir.path().join("b.json");
    std::fs::write(&b, serde_json::to_vec_pretty(&settle(base())).unwrap()).unwrap();
    fp().arg("compare")
        .arg(&smoke().report)
        .arg(&b)
        .assert()
        .success();
    fp().arg("attest")
        .arg(&b)
        .arg("--dump")
        .arg(&smoke().dump)
        .arg("--out")
        .arg(dir.path().join("st.json"))
        .assert()
        .success();
}

#[test]
fn order_sequence_must_be_the_orders_permutation() {
    let mut v = base();
    v["cases"][0]["params"]["order_sequence"] = json!([2, 2, 2]);
    refused(&v, &["w3-pinned", "order_sequence [2, 2, 2]", "twice"]);
    // A permutation, but not the one `ascending` delivers.
    let mut v = base();
    v["cases"][0]["params"]["order_sequence"] = json!([2, 1, 0]);
    refused(&v, &["w3-pinned", "order_sequence [2, 1, 0]", "ascending"]);
}

#[test]
fn sensitivity_must_follow_its_counts() {
    type Edit = fn(&mut Value);
    let edits: [(&str, Edit); 5] = [
        ("checked", |s| s["checked"] = json!(4000)),
        ("changed", |s| s["changed"] = json!(5000)),
        ("fraction", |s| s["fraction"] = json!(0.5)),
        ("verdict", |s| s["verdict"] = json!("blind")),
        ("sample", |s| s["sample"] = json!("stride 2")),
    ];
    for (field, edit) in edits {
        let mut v = base();
        edit(&mut v["cases"][0]["sensitivity"]);
        refused(&settle(v), &["w3-pinned", &format!("sensitivity.{field}")]);
    }
    // W <= 2: reversing two addends cannot change their sum. Case 0 made a
    // consistent W = 2 case that keeps its W = 3 counts.
    let mut v = base();
    let c = &mut v["cases"][0];
    c["params"]["world"] = json!(2);
    c["params"]["order_sequence"] = json!([0, 1]);
    c["arenas"][0]["rank_sha256"].as_array_mut().unwrap().pop();
    for k in ["key", "group"] {
        c[k] = json!(c[k].as_str().unwrap().replace("/W3/", "/W2/"));
    }
    refused(&settle(v), &["W=2", "sensitivity.changed"]);
}

// A control's sensitivity decides its group's verdict (blind data makes it
// inconclusive), so it is recomputed from the generator: consistent but
// false counts are caught.
#[test]
fn a_controls_sensitivity_is_recomputed() {
    let mut v = base();
    for c in v["cases"].as_array_mut().unwrap() {
        if c["params"]["contract"] == "arrival-order" {
            c["sensitivity"]["changed"] = json!(0);
            c["sensitivity"]["fraction"] = json!(0.0);
            c["sensitivity"]["verdict"] = json!("blind");
        }
    }
    refused(
        &settle(v),
        &[
            "orders[ascending,arrival-order]",
            "sensitivity",
            "the generator gives",
        ],
    );
}

// A sensitivity that differs between two reports of the same case is a
// difference (exit 1), named.
#[test]
fn compare_compares_sensitivity() {
    let mut v = base();
    let s = &mut v["cases"][0]["sensitivity"];
    s["changed"] = json!(900);
    s["fraction"] = json!(900.0 / 4099.0);
    let dir = tempfile::tempdir().unwrap();
    let b = dir.path().join("b.json");
    std::fs::write(&b, serde_json::to_vec_pretty(&settle(v)).unwrap()).unwrap();
    fp().arg("compare")
        .arg(&smoke().report)
        .arg(&b)
        .assert()
        .code(1)
        .stdout(
            predicate::str::contains("w3-pinned").and(predicate::str::contains("sensitivity: ")),
        )
        .stdout(predicate::str::contains("868 of 4099"));
    // And against the committed golden, which pins the counts too.
    fp().arg("compare")
        .arg("experiments/golden/smoke.json")
        .arg(&b)
        .assert()
        .code(1)
        .stdout(predicate::str::contains("sensitivity: "));
}

#[test]
fn group_fields_must_follow_from_the_cases() {
    type Edit = fn(&mut Value);
    let edits: [(&str, Edit); 4] = [
        ("distinct_results", |g| g["distinct_results"] = json!(1)),
        ("orders", |g| {
            g["orders"].as_array_mut().unwrap().pop();
        }),
        ("note", |g| g["note"] = json!("all good")),
        ("expect", |g| g["expect"] = json!("agree")),
    ];
    for (field, edit) in edits {
        let mut v = base();
        edit(&mut v["groups"][0]);
        refused(&v, &["group arrival-order/sum/W8", &format!("`{field}`")]);
    }
}

#[test]
fn experiments_must_list_the_cases() {
    let mut v = base();
    v["experiments"] = json!([]);
    refused(&v, &["experiments", "smoke"]);
    let mut v = base();
    v["experiments"][0]["cases"] = json!(22);
    refused(&v, &["experiments", "smoke", "22 cases", "23"]);
    let mut v = base();
    v["experiments"][0]["sha256"] = json!("zz");
    // Read as a typed digest: refused by its path, before any check.
    refused(
        &v,
        &["experiments[0].sha256", "`zz` is not a SHA-256 digest"],
    );
    let mut v = base();
    v["cases"][0]["experiment"] = json!("other");
    refused(&v, &["w3-pinned", "experiment `other`"]);
}

#[test]
fn chunk_elems_is_the_formats() {
    let mut v = base();
    // Consistent with its one chunk, but not the format's chunk size.
    v["cases"][0]["arenas"][0]["chunk_elems"] = json!(131072);
    refused(&v, &["w3-pinned", "chunk_elems 131072", "65536"]);
}

#[test]
fn chunk_digests_are_required() {
    let mut v = base();
    let a = v["cases"][0]["arenas"][0].as_object_mut().unwrap();
    a.remove("chunk_sha256");
    refused(&v, &["w3-pinned", "arena 0", "chunk_sha256", "chunk_root"]);
    let mut v = base();
    let a = v["cases"][0]["arenas"][0].as_object_mut().unwrap();
    a.remove("chunk_root");
    refused(&v, &["cases[0].arenas[0]", "missing field `chunk_root`"]);
    let mut v = base();
    let a = v["cases"][0]["arenas"][0].as_object_mut().unwrap();
    a.remove("chunk_elems");
    refused(&v, &["w3-pinned", "chunk_elems"]);
}

#[test]
fn a_single_chunk_is_the_arena() {
    let mut v = base();
    let a = &mut v["cases"][0]["arenas"][0];
    let d = a["chunk_sha256"][0].as_str().unwrap();
    let other = format!("{}{}", &d[..63], if d.ends_with('0') { '1' } else { '0' });
    a["chunk_sha256"][0] = json!(other);
    a["chunk_root"] = json!(foldprint::digest::chunk_root(&[other.parse().unwrap()]).to_string());
    refused(&v, &["w3-pinned", "arena 0", "its one chunk digest"]);
}

#[test]
fn nan_policy_must_be_known() {
    let mut v = base();
    v["nan_policy"] = json!("bogus");
    refused(&v, &["NaN policy", "bogus"]);
}

#[test]
fn backend_must_match_its_environment() {
    let mut v = base();
    v["backend"] = json!("cuda");
    refused(&v, &["backend `cuda`", "`cpu`"]);
    let mut v = base();
    v["backend"] = json!("abacus");
    refused(&v, &["backend `abacus`"]);
    let mut v = base();
    v["environment"].as_object_mut().unwrap().remove("backend");
    refused(&v, &["environment: missing field `backend`"]);
}

#[test]
fn duplicate_json_keys_are_refused() {
    let text = std::fs::read_to_string(&smoke().report).unwrap();
    // At the top: the second value would silently win.
    let dup = text.replacen(
        "\"nan_policy\": \"canonical\",",
        "\"nan_policy\": \"preserve\",\n  \"nan_policy\": \"canonical\",",
        1,
    );
    assert_ne!(dup, text);
    refused_text(&dup, &["key `nan_policy` appears twice", "line 10"]);
    // Deep inside a case.
    let dup = text.replacen("\"seed\": 1,", "\"seed\": 2,\n\"seed\": 1,", 1);
    assert_ne!(dup, text);
    refused_text(&dup, &["key `seed` appears twice in cases[0].params"]);
    // In a golden, for compare and for verify.
    let golden = std::fs::read_to_string("experiments/golden/smoke.json").unwrap();
    let dup = golden.replacen(
        "\"experiment\": \"smoke\",",
        "\"experiment\": \"smoke\",\n  \"experiment\": \"smoke\",",
        1,
    );
    assert_ne!(dup, golden);
    let dir = tempfile::tempdir().unwrap();
    let g = dir.path().join("smoke.json");
    std::fs::write(&g, dup).unwrap();
    fp().arg("compare")
        .arg(&g)
        .arg(&smoke().report)
        .assert()
        .code(2)
        .stderr(predicate::str::contains("key `experiment` appears twice"));
    fp().args([
        "verify",
        "--backend",
        "cpu",
        "experiments/smoke.toml",
        "--golden",
    ])
    .arg(dir.path())
    .assert()
    .code(2)
    .stderr(predicate::str::contains("key `experiment` appears twice"));
}

#[test]
fn lengths_over_the_cap_are_refused() {
    // 2^62 elements at W = 3: far over 1 TiB of addends; the key, group,
    // len and (with chunks as large as the arena) the chunk list follow.
    let mut v = base();
    let n: u64 = 1 << 62;
    let c = &mut v["cases"][0];
    c["params"]["arenas"] = json!([n]);
    c["arenas"][0]["len"] = json!(n);
    c["arenas"][0]["chunk_elems"] = json!(n);
    let key = c["key"]
        .as_str()
        .unwrap()
        .replace("n4099", &format!("n{n}"));
    c["key"] = json!(key);
    c["group"] = json!(c["group"]
        .as_str()
        .unwrap()
        .replace("n4099", &format!("n{n}")));
    refused(&settle(v), &["w3-pinned", "1 TiB"]);
}

// The chunk message of compare never wraps: a chunk past the end of a huge
// arena is named by saturating element bounds, not "2^63..0".
#[test]
fn chunk_ranges_never_wrap() {
    let text = std::fs::read_to_string(&smoke().report).unwrap();
    let r: Report = serde_json::from_str(&text).unwrap();
    let mut l = r.clone();
    let mut rr = r.clone();
    for c in [&mut l, &mut rr] {
        let a = &mut c.cases[0].arenas[0];
        a.len = usize::MAX;
        a.chunk_elems = 1 << (usize::BITS - 1);
        a.chunk_sha256 = vec![a.sha256; 2];
    }
    let mut d = *rr.cases[0].arenas[0].sha256.as_bytes();
    d[0] ^= 1;
    rr.cases[0].arenas[0].chunk_sha256[1] = foldprint::digest::Sha256::from_bytes(d);
    let cmp = foldprint::report::compare(&[("l".into(), l), ("r".into(), rr)], false);
    let text: Vec<String> = cmp.mismatches.iter().map(|m| m.to_string()).collect();
    let half = 1usize << (usize::BITS - 1);
    assert!(
        text.iter()
            .any(|t| t.contains(&format!("elements {half}..{}", usize::MAX))),
        "{text:?}"
    );
}

#[test]
fn compare_dump_dirs_as_json() {
    let d = &smoke().dump;
    let out = fp()
        .arg("compare")
        .arg(d)
        .arg(d)
        .arg("--json")
        .assert()
        .success()
        .get_output()
        .stdout
        .clone();
    let v: Value = serde_json::from_slice(&out).expect("JSON on stdout");
    assert_eq!(v["ok"], json!(true), "{v}");
    let n = std::fs::read_to_string(d.join("SHA256SUMS"))
        .unwrap()
        .lines()
        .count();
    assert_eq!(v["comparisons"][0]["identical"], json!(n), "{v}");
    // One differing file: named with its first differing element.
    let dir = tempfile::tempdir().unwrap();
    let e = dir.path().join("e");
    copy_dir(d, &e);
    let sums = std::fs::read_to_string(e.join("SHA256SUMS")).unwrap();
    let (hash, name) = sums.lines().next().unwrap().split_once("  ").unwrap();
    let mut bytes = std::fs::read(e.join(name)).unwrap();
    bytes[4] ^= 1;
    std::fs::write(e.join(name), &bytes).unwrap();
    let new = foldprint::digest::Sha256::of(&bytes).to_string();
    std::fs::write(e.join("SHA256SUMS"), sums.replacen(hash, &new, 1)).unwrap();
    let out = fp()
        .arg("compare")
        .arg(d)
        .arg(&e)
        .arg("--json")
        .assert()
        .code(1)
        .get_output()
        .stdout
        .clone();
    let v: Value = serde_json::from_slice(&out).expect("JSON on stdout");
    assert_eq!(v["ok"], json!(false), "{v}");
    let f = &v["comparisons"][0]["differing"][0];
    assert_eq!(f["name"], json!(name), "{v}");
    assert_eq!(f["differing"], json!(1), "{v}");
    assert_eq!(f["first"][0]["index"], json!(1), "{v}");
    assert_eq!(f["first"][0]["ulp"], json!(1), "{v}");
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), to.join(e.file_name())).unwrap();
    }
}

#[test]
fn compare_says_when_dumps_and_reports_are_mixed() {
    for args in [
        [smoke().dump.as_path(), smoke().report.as_path()],
        [smoke().report.as_path(), smoke().dump.as_path()],
    ] {
        fp().arg("compare")
            .args(args)
            .assert()
            .code(2)
            .stderr(predicate::str::contains("is a dump directory"))
            .stderr(predicate::str::contains("is a report"))
            .stderr(predicate::str::contains("Is a directory").not());
    }
}

#[test]
fn a_dump_files_mismatch_is_named_as_such() {
    let dir = tempfile::tempdir().unwrap();
    let e = dir.path().join("e");
    copy_dir(&smoke().dump, &e);
    let sums = std::fs::read_to_string(e.join("SHA256SUMS")).unwrap();
    let name = sums.lines().next().unwrap().split_once("  ").unwrap().1;
    let mut bytes = std::fs::read(e.join(name)).unwrap();
    bytes[0] ^= 1;
    std::fs::write(e.join(name), &bytes).unwrap();
    fp().arg("compare")
        .arg(&smoke().dump)
        .arg(&e)
        .assert()
        .code(2)
        .stderr(predicate::str::contains(name))
        .stderr(predicate::str::contains("SHA256SUMS says"))
        .stderr(predicate::str::contains("not a foldprint report").not());
}
