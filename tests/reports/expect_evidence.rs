//! A case's comparison with its `expect` file is evidence like its
//! digests: a block that contradicts itself is refused where it is read
//! (exit 2), and a block edited consistently (a DIFF turned into "equal",
//! removed, or naming another file) is a difference for `compare` (exit 1)
//! and another predicate for `attest`.

use crate::common::rank_files;
use crate::common::{fp, run_cpu, write};
use serde_json::Value;
use std::path::{Path, PathBuf};

/// An honest report of a case that differs from its expect file: the
/// pairwise tree against the rank-order sum the file holds.
fn honest(dir: &Path) -> (PathBuf, Value) {
    rank_files::grads(dir, 4, 1000);
    let exp = write(
        dir,
        "g.toml",
        "name = \"g\"\n[[case]]\nid = \"t\"\naddends = \"rank{rank}.safetensors\"\n\
         expect = \"expected.safetensors\"\ncontract = \"pairwise-tree\"\n",
    );
    let out = dir.join("honest.json");
    let o = run_cpu(&exp, &out);
    assert_eq!(o.status.code(), Some(1), "DIFF: exit 1");
    let v: Value = serde_json::from_slice(&std::fs::read(&out).unwrap()).unwrap();
    assert_eq!(v["cases"][0]["expect"]["equal"], false);
    (out, v)
}

fn save(dir: &Path, name: &str, v: &Value) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, serde_json::to_string_pretty(v).unwrap()).unwrap();
    p
}

/// `compare`'s exit code and output.
fn compare(a: &Path, b: &Path) -> (Option<i32>, String) {
    let o = fp().arg("compare").arg(a).arg(b).output().unwrap();
    (
        o.status.code(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        ),
    )
}

/// `attest`'s exit code, stderr and the statement's predicate as RFC 8785
/// bytes (serde_jcs, an implementation independent of foldprint's).
fn attest(dir: &Path, report: &Path) -> (Option<i32>, String, Option<String>) {
    let out = dir.join("st.json");
    let _ = std::fs::remove_file(&out);
    let o = fp()
        .arg("attest")
        .arg(report)
        .arg("--out")
        .arg(&out)
        .output()
        .unwrap();
    let predicate = std::fs::read(&out).ok().map(|b| {
        let v: Value = serde_json::from_slice(&b).unwrap();
        serde_jcs::to_string(&v["predicate"]).unwrap()
    });
    (
        o.status.code(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
        predicate,
    )
}

/// A DIFF made "equal", the block removed, or another file's digest: each
/// consistent on its own, each a difference from the honest report.
#[test]
fn compare_and_attest_see_a_forged_expect_result() {
    let dir = tempfile::tempdir().unwrap();
    let (honest_path, h) = honest(dir.path());
    let copy = save(dir.path(), "copy.json", &h);
    // Controls: the honest report agrees with a copy of itself, and both
    // give one predicate.
    assert_eq!(compare(&honest_path, &copy).0, Some(0));
    let (code, err, honest_predicate) = attest(dir.path(), &honest_path);
    assert_eq!(code, Some(0), "{err}");
    let honest_predicate = honest_predicate.unwrap();
    assert_eq!(attest(dir.path(), &copy).2.unwrap(), honest_predicate);

    type Edit = Box<dyn Fn(&mut Value)>;
    let forgeries: [(&str, Edit, &str); 4] = [
        (
            "made equal",
            Box::new(|v: &mut Value| {
                let e = &mut v["cases"][0]["expect"];
                e["equal"] = Value::Bool(true);
                for a in e["arenas"].as_array_mut().unwrap() {
                    a["differing"] = 0.into();
                    a["max_ulp"] = Value::Null;
                    a["first"] = Value::Array(vec![]);
                    a.as_object_mut().unwrap().remove("ulp_histogram");
                }
                v["summary"]["differs_from_expect"] = Value::Array(vec![]);
            }),
            "case `t` (",
        ),
        (
            "removed",
            Box::new(|v: &mut Value| {
                v["cases"][0].as_object_mut().unwrap().remove("expect");
                v["summary"]["differs_from_expect"] = Value::Array(vec![]);
            }),
            "expect: ",
        ),
        (
            "the ULP histograms left out",
            Box::new(|v: &mut Value| {
                for a in v["cases"][0]["expect"]["arenas"].as_array_mut().unwrap() {
                    a.as_object_mut().unwrap().remove("ulp_histogram");
                }
            }),
            "ulp_histogram: ",
        ),
        (
            "another file's digest",
            Box::new(|v: &mut Value| {
                v["cases"][0]["expect"]["sha256"] =
                    v["cases"][0]["params"]["addends"]["files"][0]["sha256"].clone();
            }),
            "expect file: ",
        ),
    ];
    for (what, edit, field) in forgeries {
        let mut v = h.clone();
        edit(&mut v);
        let forged = save(dir.path(), "forged.json", &v);
        // The forgery is consistent: it compares with itself.
        let (code, text) = compare(&forged, &forged);
        assert_eq!(code, Some(0), "{what}: {text}");
        for (a, b) in [(&honest_path, &forged), (&forged, &honest_path)] {
            let (code, text) = compare(a, b);
            assert_eq!(code, Some(1), "{what}: {text}");
            assert!(
                text.contains("MISMATCH") && text.contains("case `t` (") && text.contains(field),
                "{what}: wanted `{field}` in {text}"
            );
        }
        let (code, err, predicate) = attest(dir.path(), &forged);
        assert_eq!(code, Some(0), "{what}: {err}");
        // The predicate states counts and max_ulp per arena, not the
        // histogram (what `plot` draws from).
        if what == "the ULP histograms left out" {
            assert_eq!(predicate.unwrap(), honest_predicate, "{what}");
            continue;
        }
        assert_ne!(predicate.unwrap(), honest_predicate, "{what}");
    }
    // The predicate states the expect result: file, verdict, counts.
    let p: Value = serde_json::from_str(&honest_predicate).unwrap();
    let e = &p["cases"][0]["expect"];
    assert_eq!(e["equal"], false, "{p}");
    assert_eq!(e["sha256"], h["cases"][0]["expect"]["sha256"], "{p}");
    for (i, a) in h["cases"][0]["expect"]["arenas"]
        .as_array()
        .unwrap()
        .iter()
        .enumerate()
    {
        assert_eq!(e["arenas"][i]["differing"], a["differing"], "{p}");
    }
}

fn arena(v: &mut Value, k: usize) -> &mut Value {
    &mut v["cases"][0]["expect"]["arenas"][k]
}

/// An expect block whose fields contradict each other is refused by every
/// reader (exit 2), naming the field.
#[test]
fn an_inconsistent_expect_block_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let (_, h) = honest(dir.path());
    // The arena with most differences (more than the 8 listed).
    let arenas = h["cases"][0]["expect"]["arenas"].as_array().unwrap();
    let (k, a) = arenas
        .iter()
        .enumerate()
        .max_by_key(|(_, a)| a["differing"].as_u64().unwrap())
        .unwrap();
    assert!(a["differing"].as_u64().unwrap() > 8, "{a}");
    let len = a["len"].as_u64().unwrap();
    let ulp0 = a["first"][0]["ulp"].as_u64().unwrap();
    let last = a["first"].as_array().unwrap().len() - 1;

    type Edit = Box<dyn Fn(&mut Value)>;
    let edits: Vec<(&str, Edit, String)> = vec![
        (
            "a ULP distance",
            Box::new(move |v: &mut Value| {
                let a = arena(v, k);
                a["first"][0]["ulp"] = (if ulp0 == 999 { 998 } else { 999 }).into();
            }),
            format!("ULP distance {} but", if ulp0 == 999 { 998 } else { 999 }),
        ),
        (
            "an equal pair listed",
            Box::new(move |v: &mut Value| {
                let a = arena(v, k);
                a["first"][0]["right"] = a["first"][0]["left"].clone();
                a["first"][0]["ulp"] = 0.into();
            }),
            "yet listed as a difference".into(),
        ),
        (
            "an index past the length",
            Box::new(move |v: &mut Value| {
                let a = arena(v, k);
                a["first"][last]["index"] = (len + 5).into();
            }),
            format!("index {} is past the arena's {len} elements", len + 5),
        ),
        (
            "the differences emptied",
            Box::new(move |v: &mut Value| {
                let a = arena(v, k);
                a["first"] = Value::Array(vec![]);
            }),
            "with 0 listed".into(),
        ),
        (
            "a count below the listed",
            Box::new(move |v: &mut Value| {
                let a = arena(v, k);
                a["differing"] = 3.into();
            }),
            "3 differing".into(),
        ),
        (
            "max_ulp below a listed distance",
            Box::new(move |v: &mut Value| {
                let a = arena(v, k);
                a["max_ulp"] = Value::Null;
            }),
            "max_ulp null does not follow".into(),
        ),
        (
            "a histogram counting more than differ",
            Box::new(move |v: &mut Value| {
                let h = &mut arena(v, k)["ulp_histogram"];
                let last = h.as_array().unwrap().len() - 1;
                h[last] = (h[last].as_u64().unwrap() + 1).into();
            }),
            "more elements than the".into(),
        ),
        (
            "a histogram ending in an empty bucket",
            Box::new(move |v: &mut Value| {
                let h = arena(v, k)["ulp_histogram"].as_array_mut().unwrap();
                h.push(0.into());
            }),
            "ends in an empty bucket".into(),
        ),
        (
            "the summary's sentence",
            Box::new(|v: &mut Value| {
                v["summary"]["differs_from_expect"][0] =
                    Value::String("case `t`: differs from expect in nothing much".into());
            }),
            "summary.differs_from_expect".into(),
        ),
    ];
    for (what, edit, wanted) in edits {
        let mut v = h.clone();
        edit(&mut v);
        let bad = save(dir.path(), "bad.json", &v);
        let (code, text) = compare(&bad, &bad);
        assert_eq!(code, Some(2), "{what}: {text}");
        assert!(
            text.contains("inconsistent report") && text.contains(&wanted),
            "{what}: wanted `{wanted}` in {text}"
        );
        let (code, err, _) = attest(dir.path(), &bad);
        assert_eq!(code, Some(2), "{what}: {err}");
    }
}

/// A rank file's tensor whose shape does not hold its length is refused,
/// even with the identity, key, groups and summary made to fit it.
#[test]
fn a_shape_that_does_not_hold_its_length_is_refused() {
    use foldprint::addends::FileFacts;
    use foldprint::report::Report;
    let dir = tempfile::tempdir().unwrap();
    let (path, _) = honest(dir.path());
    let text = std::fs::read_to_string(&path).unwrap();
    // Every field derived from the parameters made again, after `edit`.
    let rebuilt = |edit: &dyn Fn(&mut Report)| {
        let mut r: Report = serde_json::from_str(&text).unwrap();
        edit(&mut r);
        for c in &mut r.cases {
            let f = c.params.addends.as_mut().unwrap();
            let facts: Vec<FileFacts> = f
                .files
                .iter()
                .map(|x| FileFacts {
                    sha256: x.sha256,
                    bytes: x.bytes,
                })
                .collect();
            f.identity = foldprint::addends::identity(f.format, &f.arenas, &facts);
            c.key = c.params.key();
            c.group = c.params.group_key();
        }
        r.groups = foldprint::report::build_groups(&r.cases);
        r.summarize();
        save(
            dir.path(),
            "rebuilt.json",
            &serde_json::from_str(&r.to_json()).unwrap(),
        )
    };
    // Control: rebuilt unchanged, the report is accepted.
    let same = rebuilt(&|_| {});
    let (code, text_out) = compare(&same, &path);
    assert_eq!(code, Some(0), "{text_out}");

    let bad = rebuilt(&|r: &mut Report| {
        let a = &mut r.cases[0].params.addends.as_mut().unwrap().arenas[1];
        assert_eq!(a.shape, vec![3, 1000]);
        a.shape = vec![3, 999];
    });
    let (code, out) = compare(&bad, &bad);
    assert_eq!(code, Some(2), "{out}");
    assert!(
        out.contains("shape [3, 999] does not hold 3000 elements"),
        "{out}"
    );
    let (code, err, _) = attest(dir.path(), &bad);
    assert_eq!(code, Some(2), "{err}");
}
