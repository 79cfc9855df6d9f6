//! Messages a person reads: fields named, OS errors once, totals that add
//! up, nothing dangling, nothing a terminal or XML parser would obey.

use crate::common::{fp, write};

fn stderr_of(a: &assert_cmd::assert::Assert) -> String {
    String::from_utf8_lossy(&a.get_output().stderr).into_owned()
}

fn stdout_of(a: &assert_cmd::assert::Assert) -> String {
    String::from_utf8_lossy(&a.get_output().stdout).into_owned()
}

#[test]
fn type_errors_name_the_field() {
    let dir = tempfile::tempdir().unwrap();
    let p = write(
        dir.path(),
        "t.toml",
        "name = \"t\"\n[[case]]\nid = \"c\"\nworld = \"4\"\narenas = [3]\n",
    );
    let err = stderr_of(
        &fp()
            .args(["run", "--backend", "cpu"])
            .arg(&p)
            .assert()
            .code(2),
    );
    assert!(
        err.contains("t.toml:4:9: field `world`: invalid type"),
        "{err}"
    );
}

#[test]
fn os_errors_are_printed_once() {
    let err = stderr_of(
        &fp()
            .args(["run", "--backend", "cpu", "no-such-file.toml"])
            .assert()
            .code(2),
    );
    assert_eq!(err.matches("No such file or directory").count(), 1, "{err}");
}

#[test]
fn the_sweep_cap_counts_the_whole_file() {
    let dir = tempfile::tempdir().unwrap();
    let seeds: Vec<String> = (1..=4096).map(|s| s.to_string()).collect();
    let p = write(
        dir.path(),
        "cap.toml",
        &format!(
            "name = \"t\"\n[defaults]\nworld = 3\narenas = [3]\n[[case]]\nid = \"c\"\n\
             [[sweep]]\nid = \"s\"\nseed = [{}]\n",
            seeds.join(",")
        ),
    );
    let err = stderr_of(
        &fp()
            .args(["run", "--backend", "cpu"])
            .arg(&p)
            .assert()
            .code(2),
    );
    assert!(
        err.contains("expands to 4096 cases, which makes 4097 in this file"),
        "{err}"
    );
}

#[test]
fn a_digest_mismatch_without_chunk_differences_says_nothing_dangling() {
    let dir = tempfile::tempdir().unwrap();
    let p = write(
        dir.path(),
        "one.toml",
        "name = \"one\"\n[[case]]\nid = \"c\"\nworld = 3\narenas = [70000]\n",
    );
    let a = dir.path().join("a.json");
    fp().args(["run", "--backend", "cpu", "--out"])
        .arg(&a)
        .arg(&p)
        .assert()
        .success();
    // Another arena digest (consistently, on every rank), the same chunks
    // (two of them: a single chunk would have to be the arena digest).
    let mut r: foldprint::report::Report =
        serde_json::from_slice(&std::fs::read(&a).unwrap()).unwrap();
    let other = foldprint::digest::Sha256::from_bytes([0xab; 32]);
    r.cases[0].arenas[0].sha256 = other;
    r.cases[0].arenas[0].rank_sha256 = vec![other; 3];
    let b = dir.path().join("b.json");
    std::fs::write(&b, r.to_json()).unwrap();
    let out = stdout_of(&fp().arg("compare").arg(&a).arg(&b).assert().code(1));
    assert!(out.contains("arena 0"), "{out}");
    assert!(!out.contains("differing elements in \n"), "{out}");
    assert!(
        out.lines()
            .all(|l| !l.trim_end().ends_with("differing elements in")),
        "{out}"
    );
}

#[test]
fn control_characters_in_ids_are_escaped() {
    let dir = tempfile::tempdir().unwrap();
    let p = write(
        dir.path(),
        "ctl.toml",
        "name = \"ctl\"\n[[case]]\nid = \"bell\\u0007red\\u001b[31m\"\nworld = 3\narenas = [10]\n",
    );
    let j = dir.path().join("j.xml");
    let a = fp()
        .args(["run", "--backend", "cpu", "--junit"])
        .arg(&j)
        .arg(&p)
        .assert()
        .success();
    let out = stdout_of(&a);
    assert!(!out.contains('\u{7}') && !out.contains('\u{1b}'), "{out:?}");
    assert!(out.contains("bell\\u{7}red\\u{1b}[31m"), "{out}");
    let xml = std::fs::read_to_string(&j).unwrap();
    assert!(
        xml.chars().all(|c| !c.is_control() || c == '\n'),
        "JUnit XML carries control characters: {xml:?}"
    );
    assert!(xml.contains("bell\\u{7}red\\u{1b}[31m"), "{xml}");
}

#[test]
fn equivalent_orders_are_named_as_one_sequence() {
    let dir = tempfile::tempdir().unwrap();
    let p = write(
        dir.path(),
        "eq.toml",
        "name = \"eq\"\n[defaults]\nworld = 4\narenas = [1000]\n[[sweep]]\nid = \"o\"\n\
         order = [\"ascending\", \"rotate:0\", [0, 1, 2, 3], \"descending\"]\n",
    );
    let out = stdout_of(
        &fp()
            .args(["run", "--backend", "cpu"])
            .arg(&p)
            .assert()
            .success(),
    );
    assert!(
        out.contains("ascending = rotate:0 = [0,1,2,3] are the same delivery sequence"),
        "{out}"
    );
    // Negative control: distinct sequences are not called the same.
    assert!(!out.contains("descending = "), "{out}");
}

#[test]
fn golden_warns_when_it_changes_digests() {
    let dir = tempfile::tempdir().unwrap();
    let p = write(
        dir.path(),
        "one.toml",
        "name = \"one\"\n[[case]]\nid = \"c\"\nworld = 3\narenas = [70000]\n",
    );
    let g = dir.path().join("golden");
    let run = || {
        let mut c = fp();
        c.arg("golden").arg(&p).arg("--golden").arg(&g);
        c
    };
    // First write and an unchanged rewrite: no warning.
    for _ in 0..2 {
        let err = stderr_of(&run().assert().success());
        assert!(!err.contains("warning"), "{err}");
    }
    // A golden holding other digests is rewritten, with a warning.
    let path = g.join("one.json");
    let text = std::fs::read_to_string(&path).unwrap();
    let mut v: serde_json::Value = serde_json::from_str(&text).unwrap();
    v["cases"][0]["arenas"][0] = "ab".repeat(32).into();
    std::fs::write(&path, serde_json::to_vec(&v).unwrap()).unwrap();
    let err = stderr_of(&run().assert().success());
    assert!(
        err.contains("warning") && err.contains("one.json changed"),
        "{err}"
    );
    assert_eq!(std::fs::read_to_string(&path).unwrap(), text);
}

/// Type errors name the field even when serde's message quotes the value,
/// and an empty sweep list is an error naming its key, not one case.
#[test]
fn sweep_lists_and_typed_values_name_their_field() {
    let dir = tempfile::tempdir().unwrap();
    let cases = [
        (
            "name = \"t\"\n[defaults]\narenas = 3\n[[case]]\nid = \"c\"\nworld = 2\n",
            "t.toml:3:10: field `arenas`: invalid type: integer `3`, expected a sequence",
        ),
        (
            "name = \"t\"\n[[case]]\nid = \"c\"\nworld = 1.5\narenas = [3]\n",
            "t.toml:4:9: field `world`: invalid type: floating point `1.5`, expected i64",
        ),
        (
            "name = \"t\"\n[defaults]\narenas = [4]\n[[sweep]]\nid = \"s\"\nworld = []\n",
            "t.toml:6:9: sweep `s`: field `world`: empty list",
        ),
    ];
    for (text, want) in cases {
        let p = write(dir.path(), "t.toml", text);
        let err = stderr_of(
            &fp()
                .args(["run", "--backend", "cpu"])
                .arg(&p)
                .assert()
                .code(2),
        );
        assert!(err.contains(want), "{want}\n{err}");
    }
}

/// Invalid UTF-8 is located by line and column.
#[test]
fn invalid_utf8_says_where() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("u.toml");
    std::fs::write(&p, b"name = \"u\"\n# caf\xe9\n").unwrap();
    let err = stderr_of(
        &fp()
            .args(["run", "--backend", "cpu"])
            .arg(&p)
            .assert()
            .code(2),
    );
    assert!(
        err.contains("u.toml:2:6: not valid UTF-8 (byte 0xe9 at offset 16)"),
        "{err}"
    );
    let r = dir.path().join("r.json");
    std::fs::write(&r, b"{\n \"format\": \"\xff\"}").unwrap();
    let err = stderr_of(&fp().arg("compare").arg(&r).arg(&r).assert().code(2));
    assert!(
        err.contains("not valid UTF-8 (byte 0xff at offset 14), line 2 column 13"),
        "{err}"
    );
}

/// The parameter table makes the `[defaults]`, `[[case]]` and `[[sweep]]`
/// shapes: each refuses an unknown key with the whole list of the keys it
/// takes, in the table's order, and a limit the case builder holds points
/// at the value that broke it, wherever it was written.
#[test]
fn each_shape_of_the_parameter_table_names_its_keys_and_where_a_value_is() {
    let dir = tempfile::tempdir().unwrap();
    let keys = "`world`, `arenas`, `order`, `seed`, `distribution`, `contract`, `mean`, \
                `dtype`, `collective`, `rounds`, `addends`, `tensors`, `expect`";
    let cases = [
        (
            "name = \"t\"\n[defaults]\nid = \"a\"\n".to_string(),
            format!("t.toml:3:1: unknown field `id`, expected one of {keys}"),
        ),
        (
            "name = \"t\"\n[[case]]\nid = \"c\"\nwold = 2\n".to_string(),
            format!("t.toml:4:1: unknown field `wold`, expected one of `id`, {keys}"),
        ),
        (
            "name = \"t\"\n[[sweep]]\nid = \"s\"\nsed = [1]\n".to_string(),
            format!("t.toml:4:1: unknown field `sed`, expected one of `id`, {keys}"),
        ),
        (
            "name = \"t\"\n[defaults]\norder = [1, 0]\n[[case]]\nid = \"c\"\nworld = 3\narenas = [3]\n"
                .to_string(),
            "t.toml:3:9: case `c`: field `order`: permutation [1, 0] has 2 entries but world = 3"
                .to_string(),
        ),
        (
            "name = \"t\"\n[defaults]\nworld = 0\n[[case]]\nid = \"c\"\narenas = [3]\n".to_string(),
            "t.toml:3:9: case `c`: field `world`: must be 1 ..= 65536, got 0".to_string(),
        ),
        (
            "name = \"t\"\n[[case]]\nid = \"c\"\nworld = 2\narenas = [3]\nrounds = 0\n".to_string(),
            "t.toml:6:10: case `c`: field `rounds`: must be 1 ..= 1000, got 0".to_string(),
        ),
        (
            "name = \"t\"\n[[case]]\nid = \"c\"\nworld = 2\narenas = [3]\ndtype = \"fp16\"\n"
                .to_string(),
            "t.toml:6:9: case `c`: field `dtype`: unknown dtype `fp16` (expected f32, bf16 or f16)"
                .to_string(),
        ),
        (
            "name = \"t\"\n[defaults]\ndtype = \"BF16\"\n[[case]]\nid = \"c\"\nworld = 2\narenas = [3]\n"
                .to_string(),
            "t.toml:3:9: case `c`: field `dtype`: unknown dtype `BF16` (expected f32, bf16 or f16)"
                .to_string(),
        ),
        (
            "name = \"t\"\n[[sweep]]\nid = \"s\"\nworld = [2]\narenas = [[3]]\ndtype = [\"bf16\", \"fp8\"]\n"
                .to_string(),
            "t.toml:6:9: case `s[fp8]`: field `dtype`: unknown dtype `fp8` (expected f32, bf16 or f16)"
                .to_string(),
        ),
        (
            "name = \"t\"\n[[sweep]]\nid = \"s\"\nworld = [2]\narenas = [[3]]\ncollective = [\"all-gather\"]\n"
                .to_string(),
            "t.toml:6:14: case `s`: field `collective`: unknown collective `all-gather` \
             (expected all-reduce or reduce-scatter)"
                .to_string(),
        ),
        (
            "name = \"t\"\n[[sweep]]\nid = \"s\"\nworld = [2]\narenas = [[3]]\nmean = []\n"
                .to_string(),
            "t.toml:6:8: sweep `s`: field `mean`: empty list; list at least one value, \
             or leave `mean` out to use the default"
                .to_string(),
        ),
    ];
    for (text, want) in cases {
        let p = write(dir.path(), "t.toml", &text);
        let err = stderr_of(
            &fp()
                .args(["run", "--backend", "cpu"])
                .arg(&p)
                .assert()
                .code(2),
        );
        let want = format!("error: {}/{want}", dir.path().display());
        assert_eq!(err.trim_end(), want, "{text}");
    }
}

/// A sweep's cases are the product of its lists in the table's order (the
/// last varies fastest), each id naming the values of the lists of more
/// than one; a fixed parameter (`rounds`) is every case's.
#[test]
fn a_sweep_is_the_product_of_its_lists_in_the_tables_order() {
    let dir = tempfile::tempdir().unwrap();
    let p = write(
        dir.path(),
        "s.toml",
        "name = \"t\"\n[defaults]\ndistribution = \"uniform\"\n[[sweep]]\nid = \"s\"\n\
         world = [3, 4]\narenas = [[3], [2, 2]]\norder = [\"ascending\", \"descending\"]\n\
         seed = [1, 2]\ncontract = [\"fixed-order\", \"pairwise-tree\"]\nmean = [true]\nrounds = 2\n",
    );
    let out = fp()
        .args(["run", "--backend", "cpu", "--json"])
        .arg(&p)
        .assert()
        .success();
    let report: serde_json::Value = serde_json::from_slice(&out.get_output().stdout).unwrap();
    let cases = report["cases"].as_array().unwrap();
    let mut want = Vec::new();
    for w in ["W=3", "W=4"] {
        for n in ["n=3", "n=2+2"] {
            for o in ["ascending", "descending"] {
                for s in ["seed=1", "seed=2"] {
                    for c in ["fixed-order", "pairwise-tree"] {
                        want.push(format!("s[{w},{n},{o},{s},{c}]"));
                    }
                }
            }
        }
    }
    let ids: Vec<&str> = cases.iter().map(|c| c["id"].as_str().unwrap()).collect();
    assert_eq!(ids, want);
    for c in cases {
        assert_eq!(c["params"]["rounds"], 2, "{c}");
        assert_eq!(c["params"]["mean"], true, "{c}");
        assert_eq!(c["params"]["distribution"], "uniform", "{c}");
    }
}

/// `dtype` sweeps like any parameter (last in the table, its value alone in
/// the id); an f32 case's key and params read as before dtypes existed, a
/// 16-bit one's name the dtype after the lengths, and its digests and dump
/// are of the dtype's 2-byte elements.
#[test]
fn a_swept_dtype_names_its_cases_and_keys_and_dumps_two_bytes_an_element() {
    let dir = tempfile::tempdir().unwrap();
    let p = write(
        dir.path(),
        "d.toml",
        "name = \"d\"\n[[sweep]]\nid = \"s\"\nworld = [3]\narenas = [[1001, 7]]\n\
         mean = [false, true]\ndtype = [\"f32\", \"bf16\", \"f16\"]\n",
    );
    let dump = dir.path().join("dump");
    let out = fp()
        .args(["run", "--backend", "cpu", "--json", "--dump"])
        .arg(&dump)
        .arg(&p)
        .assert()
        .success();
    let report: serde_json::Value = serde_json::from_slice(&out.get_output().stdout).unwrap();
    let cases = report["cases"].as_array().unwrap();
    let ids: Vec<&str> = cases.iter().map(|c| c["id"].as_str().unwrap()).collect();
    assert_eq!(
        ids,
        [
            "s[mean=false,f32]",
            "s[mean=false,bf16]",
            "s[mean=false,f16]",
            "s[mean=true,f32]",
            "s[mean=true,bf16]",
            "s[mean=true,f16]"
        ]
    );
    let mut digests = std::collections::BTreeSet::new();
    for c in cases {
        let key = c["key"].as_str().unwrap();
        let dtype = c["id"]
            .as_str()
            .unwrap()
            .trim_end_matches(']')
            .rsplit(',')
            .next()
            .unwrap();
        if dtype == "f32" {
            assert!(c["params"].get("dtype").is_none(), "{c}");
            assert!(key.contains("/n1001+7/mixed-magnitude/"), "{key}");
        } else {
            assert_eq!(c["params"]["dtype"], dtype, "{c}");
            assert!(
                key.contains(&format!("/n1001+7/{dtype}/mixed-magnitude/")),
                "{key}"
            );
        }
        assert_eq!(c["arenas"][0]["chunk_elems"], 65536, "{c}");
        digests.insert(c["arenas"][0]["sha256"].as_str().unwrap().to_string());
    }
    // Six different sums: the dtype changes the bits.
    assert_eq!(digests.len(), 6);
    let mut sizes = std::collections::BTreeMap::new();
    for e in std::fs::read_dir(&dump).unwrap() {
        let e = e.unwrap();
        let name = e.file_name().into_string().unwrap();
        if name.ends_with(".a0.bin") {
            sizes.insert(name, e.metadata().unwrap().len());
        }
    }
    assert_eq!(sizes.len(), 6, "{sizes:?}");
    for (name, len) in &sizes {
        let want = if name.contains("f32") {
            4 * 1001
        } else {
            2 * 1001
        };
        assert_eq!(*len, want, "{name}");
    }
}
