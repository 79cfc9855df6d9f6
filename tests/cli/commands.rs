//! The command line as users meet it: exit codes, messages that name the
//! file, line and field, atomic outputs, and the checks that must fail.

use predicates::prelude::*;

use crate::common::{fp, write, TINY};

/// Run an experiment that must be rejected; return stderr.
fn rejected(text: &str) -> String {
    let dir = tempfile::tempdir().unwrap();
    let p = write(dir.path(), "bad.toml", text);
    let out = dir.path().join("report.json");
    let a = fp()
        .args(["run", "--backend", "cpu", "--out"])
        .arg(&out)
        .arg(&p)
        .assert()
        .code(2);
    assert!(!out.exists(), "a rejected run must not write a report");
    let err = String::from_utf8(a.get_output().stderr.clone()).unwrap();
    assert!(
        err.contains("bad.toml"),
        "message must name the file: {err}"
    );
    assert!(!err.contains("panicked"), "{err}");
    err
}

#[test]
fn smoke_runs_and_reports_groups_and_sensitivity() {
    fp().args(["run", "--backend", "cpu", "experiments/smoke.toml"])
        .assert()
        .success()
        .stdout(predicate::str::contains("every check passed"))
        .stdout(predicate::str::contains("invariance groups"))
        .stdout(predicate::str::contains("expect disagree got disagree"));
}

#[test]
fn unknown_key_is_named_with_line_and_column() {
    let e = rejected("name = \"x\"\n[defaults]\nworld = 3\nwrold = 4\n");
    assert!(e.contains("bad.toml:4:1"), "{e}");
    assert!(e.contains("wrold"), "{e}");
}

#[test]
fn world_zero_is_rejected_at_its_line() {
    let e = rejected("name = \"x\"\n[[case]]\nid = \"a\"\nworld = 0\narenas = [4]\n");
    assert!(e.contains("bad.toml:4:9"), "{e}");
    assert!(e.contains("`world`"), "{e}");
}

#[test]
fn bad_permutations_are_rejected() {
    let e = rejected(
        "name = \"x\"\n[[case]]\nid = \"a\"\nworld = 3\narenas = [4]\norder = [0, 0, 1]\n",
    );
    assert!(e.contains("twice") && e.contains(":6:"), "{e}");
    let e =
        rejected("name = \"x\"\n[[case]]\nid = \"a\"\nworld = 3\narenas = [4]\norder = [0, 1]\n");
    assert!(e.contains("2 entries"), "{e}");
    let e = rejected(
        "name = \"x\"\n[[case]]\nid = \"a\"\nworld = 3\narenas = [4]\norder = \"sideways\"\n",
    );
    assert!(e.contains("unknown delivery order"), "{e}");
}

#[test]
fn malformed_toml_is_located() {
    let e = rejected("name = \"x\"\n[[case]\nid = 3\n");
    assert!(e.contains("bad.toml:2:"), "{e}");
}

#[test]
fn duplicate_ids_impossible_sizes_and_sweep_caps_are_rejected() {
    let e = rejected("name = \"x\"\n[defaults]\nworld = 2\narenas = [1]\n[[case]]\nid = \"a\"\n[[case]]\nid = \"a\"\nseed = 2\n");
    assert!(e.contains("duplicate case id `a`"), "{e}");
    let e = rejected("name = \"x\"\n[[case]]\nid = \"a\"\nworld = 64\narenas = [9000000000000]\n");
    assert!(e.contains("cannot fit in memory"), "{e}");
    let e = rejected("name = \"x\"\n[defaults]\nworld = 2\narenas = [1]\n[[sweep]]\nid = \"s\"\nseed = [1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17]\nworld = [1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17]\ndistribution = [\"uniform\",\"specials\",\"uniform\",\"uniform\",\"uniform\",\"uniform\",\"uniform\",\"uniform\",\"uniform\",\"uniform\",\"uniform\",\"uniform\",\"uniform\",\"uniform\",\"uniform\",\"uniform\"]\n");
    assert!(e.contains("cap of 4096"), "{e}");
    let e = rejected("name = \"x\"\n[[case]]\nid = \"a\"\nworld = 2\narenas = [1]\ndistribution = \"gaussian\"\n");
    assert!(e.contains("unknown distribution `gaussian`"), "{e}");
}

#[test]
fn missing_file_is_a_clear_error() {
    fp().args(["run", "no/such/experiment.toml"])
        .assert()
        .code(2)
        .stderr(predicate::str::contains(
            "no/such/experiment.toml: cannot read",
        ));
}

#[test]
fn compare_catches_a_single_flipped_bit_and_names_the_case() {
    let dir = tempfile::tempdir().unwrap();
    let exp = write(dir.path(), "tiny.toml", TINY);
    let (a, b) = crate::common::run_twice_agreeing(dir.path(), &exp);
    let (a, b) = (a.report, b.report);

    // Flip one bit of one arena digest in b.
    let mut v: serde_json::Value = serde_json::from_slice(&std::fs::read(&b).unwrap()).unwrap();
    let d = v["cases"][2]["arenas"][1]["sha256"]
        .as_str()
        .unwrap()
        .to_string();
    let flipped = format!(
        "{}{:x}",
        &d[..63],
        u8::from_str_radix(&d[63..], 16).unwrap() ^ 1
    );
    // Consistently, as another machine's report would say it: the arena
    // digest is rank 0's, every rank agrees, and its one chunk is the arena.
    v["cases"][2]["arenas"][1]["sha256"] = flipped.clone().into();
    v["cases"][2]["arenas"][1]["chunk_sha256"] = serde_json::json!([flipped]);
    v["cases"][2]["arenas"][1]["chunk_root"] =
        foldprint::digest::chunk_root(&[flipped.parse().unwrap()])
            .to_string()
            .into();
    for r in v["cases"][2]["arenas"][1]["rank_sha256"]
        .as_array_mut()
        .unwrap()
    {
        *r = flipped.clone().into();
    }
    let id = v["cases"][2]["id"].as_str().unwrap().to_string();
    // Its groups and summary then follow from its cases.
    let mut r: foldprint::report::Report = serde_json::from_value(v).unwrap();
    r.groups = foldprint::report::build_groups(&r.cases);
    r.summarize();
    std::fs::write(&b, r.to_json()).unwrap();
    fp().arg("compare")
        .arg(&a)
        .arg(&b)
        .assert()
        .code(1)
        .stdout(predicate::str::contains(format!("case `{id}`")))
        .stdout(predicate::str::contains("arena 1"));
}

#[test]
fn compare_rejects_unreadable_and_wrong_version_reports() {
    let dir = tempfile::tempdir().unwrap();
    let exp = write(dir.path(), "tiny.toml", TINY);
    let good = dir.path().join("good.json");
    fp().args(["run", "--backend", "cpu", "--out"])
        .arg(&good)
        .arg(&exp)
        .assert()
        .success();
    let garbage = write(dir.path(), "garbage.json", "{ not json");
    fp().arg("compare")
        .arg(&good)
        .arg(&garbage)
        .assert()
        .code(2)
        .stderr(predicate::str::contains(
            "garbage.json: not a foldprint report",
        ));
    let mut v: serde_json::Value = serde_json::from_slice(&std::fs::read(&good).unwrap()).unwrap();
    v["version"] = 99.into();
    let old = dir.path().join("v99.json");
    std::fs::write(&old, serde_json::to_vec(&v).unwrap()).unwrap();
    fp().arg("compare")
        .arg(&good)
        .arg(&old)
        .assert()
        .code(2)
        .stderr(predicate::str::contains("version 99 is not supported"));
    let truncated = write(
        dir.path(),
        "cut.json",
        &std::fs::read_to_string(&good).unwrap()[..200],
    );
    fp().arg("compare")
        .arg(&good)
        .arg(&truncated)
        .assert()
        .code(2)
        .stderr(predicate::str::contains("cut.json"));
    fp().arg("compare")
        .arg(&good)
        .arg(dir.path().join("absent.json"))
        .assert()
        .code(2)
        .stderr(predicate::str::contains("absent.json: cannot read"));
}

#[test]
fn verify_passes_on_goldens_and_fails_on_one_altered_digest() {
    let dir = tempfile::tempdir().unwrap();
    let exp = write(dir.path(), "tiny.toml", TINY);
    let gold = dir.path().join("golden");
    fp().args(["golden"])
        .arg(&exp)
        .arg("--golden")
        .arg(&gold)
        .assert()
        .success();
    fp().args(["verify", "--backend", "cpu", "--golden"])
        .arg(&gold)
        .arg(&exp)
        .assert()
        .success()
        .stdout(predicate::str::contains("verify ok"));

    let gpath = gold.join("tiny.json");
    let mut g: serde_json::Value = serde_json::from_slice(&std::fs::read(&gpath).unwrap()).unwrap();
    let id = g["cases"][4]["id"].as_str().unwrap().to_string();
    g["cases"][4]["arenas"][0] = "0".repeat(64).into();
    std::fs::write(&gpath, serde_json::to_vec(&g).unwrap()).unwrap();
    fp().args(["verify", "--backend", "cpu", "--golden"])
        .arg(&gold)
        .arg(&exp)
        .assert()
        .code(1)
        .stdout(predicate::str::contains(format!("case `{id}`")))
        .stdout(predicate::str::contains("verify FAILED"));
}

/// Each of the golden's chunk digest, chunk root and sensitivity counts,
/// altered alone, fails `verify` and is named; a golden without those
/// fields (written before they existed) still verifies its digests.
#[test]
fn verify_checks_chunk_digests_roots_and_sensitivity() {
    let dir = tempfile::tempdir().unwrap();
    let exp = write(dir.path(), "tiny.toml", TINY);
    let gold = dir.path().join("golden");
    fp().args(["golden"])
        .arg(&exp)
        .arg("--golden")
        .arg(&gold)
        .assert()
        .success();
    let gpath = gold.join("tiny.json");
    let pristine: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&gpath).unwrap()).unwrap();
    assert_eq!(pristine["chunk_elems"], 65536);
    let verify = |g: &serde_json::Value| {
        std::fs::write(&gpath, serde_json::to_vec(g).unwrap()).unwrap();
        fp().args(["verify", "--backend", "cpu", "--golden"])
            .arg(&gold)
            .arg(&exp)
            .assert()
    };
    verify(&pristine).success();

    let id = pristine["cases"][2]["id"].as_str().unwrap().to_string();
    let mut g = pristine.clone();
    g["cases"][2]["chunk_sha256"][1][0] = "0".repeat(64).into();
    verify(&g)
        .code(1)
        .stdout(predicate::str::contains(format!("case `{id}`")))
        .stdout(predicate::str::contains(
            "1 of 1 chunk digests differ from the golden's 1 (first: chunk 0)",
        ));
    let mut g = pristine.clone();
    g["cases"][2]["chunk_root"][0] = "0".repeat(64).into();
    verify(&g)
        .code(1)
        .stdout(predicate::str::contains("arena 0: chunk root"));
    let mut g = pristine.clone();
    let changed = g["cases"][2]["sensitivity"]["changed"].as_u64().unwrap();
    g["cases"][2]["sensitivity"]["changed"] = (changed + 1).into();
    verify(&g)
        .code(1)
        .stdout(predicate::str::contains("order sensitivity"));

    let mut g = pristine.clone();
    g.as_object_mut().unwrap().remove("chunk_elems");
    for c in g["cases"].as_array_mut().unwrap() {
        let c = c.as_object_mut().unwrap();
        for field in ["chunk_sha256", "chunk_root", "sensitivity"] {
            c.remove(field);
        }
    }
    verify(&g).success();
}

/// `golden --nan-policy preserve` records the policy; `verify` must use the
/// same one (exit 2 otherwise) and then passes.
#[test]
fn preserve_goldens_record_their_policy() {
    let dir = tempfile::tempdir().unwrap();
    let exp = write(dir.path(), "tiny.toml", TINY);
    let gold = dir.path().join("golden");
    fp().args(["golden", "--nan-policy", "preserve"])
        .arg(&exp)
        .arg("--golden")
        .arg(&gold)
        .assert()
        .success();
    let g: serde_json::Value =
        serde_json::from_slice(&std::fs::read(gold.join("tiny.json")).unwrap()).unwrap();
    assert_eq!(g["nan_policy"], "preserve");
    fp().args(["verify", "--backend", "cpu", "--golden"])
        .arg(&gold)
        .arg(&exp)
        .assert()
        .code(2)
        .stderr(predicate::str::contains(
            "golden was made with NaN policy `preserve`, this run uses `canonical`",
        ));
    fp().args([
        "verify",
        "--backend",
        "cpu",
        "--nan-policy",
        "preserve",
        "--golden",
    ])
    .arg(&gold)
    .arg(&exp)
    .assert()
    .success();
}

#[test]
fn committed_goldens_verify() {
    fp().args([
        "verify",
        "--backend",
        "cpu",
        "--golden",
        "experiments/golden",
        "experiments/smoke.toml",
        "experiments/edge-cases.toml",
        "experiments/order-sweep.toml",
        "experiments/world-sweep.toml",
        "experiments/spec-rules.toml",
        "experiments/mixed-precision.toml",
    ])
    .assert()
    .success();
    fp().args([
        "verify",
        "--backend",
        "cpu",
        "--nan-policy",
        "preserve",
        "--golden",
        "experiments/golden",
        "experiments/preserve",
    ])
    .assert()
    .success();
}

#[test]
fn dump_verifies_with_sha256sum() {
    let dir = tempfile::tempdir().unwrap();
    let exp = write(dir.path(), "tiny.toml", TINY);
    let dump = dir.path().join("dump");
    let report = dir.path().join("r.json");
    fp().args(["run", "--backend", "cpu", "--dump"])
        .arg(&dump)
        .arg("--out")
        .arg(&report)
        .arg(&exp)
        .assert()
        .success();
    let sums = std::fs::read_to_string(dump.join("SHA256SUMS")).unwrap();
    assert_eq!(sums.lines().count(), 12, "6 cases x 2 arenas");
    // Every dumped digest appears in the report.
    let r = std::fs::read_to_string(&report).unwrap();
    for line in sums.lines() {
        assert!(r.contains(line.split_whitespace().next().unwrap()));
    }
    let ok = std::process::Command::new("sha256sum")
        .arg("-c")
        .arg("SHA256SUMS")
        .current_dir(&dump)
        .output()
        .expect("sha256sum (coreutils) is needed for this test");
    assert!(
        ok.status.success(),
        "{}",
        String::from_utf8_lossy(&ok.stdout)
    );
    // Negative control: a corrupted dump fails the check.
    let first = sums
        .lines()
        .next()
        .unwrap()
        .split_whitespace()
        .nth(1)
        .unwrap();
    let mut bytes = std::fs::read(dump.join(first)).unwrap();
    bytes[0] ^= 1;
    std::fs::write(dump.join(first), bytes).unwrap();
    let bad = std::process::Command::new("sha256sum")
        .arg("-c")
        .arg("SHA256SUMS")
        .current_dir(&dump)
        .output()
        .unwrap();
    assert!(!bad.status.success());
}

#[test]
fn unwritable_output_fails_cleanly() {
    let dir = tempfile::tempdir().unwrap();
    let exp = write(dir.path(), "tiny.toml", TINY);
    fp().args(["run", "--backend", "cpu", "--out"])
        .arg(dir.path().join("no/such/dir/r.json"))
        .arg(&exp)
        .assert()
        .code(2)
        .stderr(predicate::str::contains("cannot write"));
    let leftovers: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(leftovers.len(), 1, "{leftovers:?}");
}

#[test]
fn json_output_is_a_valid_report() {
    let dir = tempfile::tempdir().unwrap();
    let exp = write(dir.path(), "tiny.toml", TINY);
    let out = fp()
        .args(["run", "--backend", "cpu", "--json"])
        .arg(&exp)
        .assert()
        .success();
    let v: serde_json::Value = serde_json::from_slice(&out.get_output().stdout).unwrap();
    assert_eq!(v["format"], "foldprint-report");
    assert_eq!(v["cases"].as_array().unwrap().len(), 6);
    assert_eq!(v["nan_policy"], "canonical");
    assert_eq!(v["summary"]["ok"], true);
}

#[test]
fn doctor_reports_the_cpu_backend() {
    fp().arg("doctor")
        .assert()
        .success()
        .stdout(predicate::str::contains("cpu"));
}

/// The C library this test process runs on: a shared library that is not NCCL.
fn libc_path() -> String {
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
    maps.lines()
        .filter_map(|l| l.split_whitespace().nth(5))
        .find(|p| {
            let name = p.rsplit('/').next().unwrap_or("");
            name.starts_with("libc.so") || name.starts_with("libc-")
        })
        .expect("libc is mapped")
        .to_string()
}

#[test]
fn doctor_names_the_nccl_it_would_load_or_why_it_cannot() {
    let doctor = |lib: Option<&str>| {
        let mut c = fp();
        c.args(["doctor"]);
        match lib {
            Some(l) => c.env("FOLDPRINT_NCCL_LIBRARY", l),
            None => c.env_remove("FOLDPRINT_NCCL_LIBRARY"),
        };
        let out = c.output().unwrap();
        // doctor reports; a missing or wrong NCCL is never its failure.
        assert_eq!(out.status.code(), Some(0), "{out:?}");
        String::from_utf8(out.stdout).unwrap()
    };
    let nccl = |text: &str| -> Vec<String> {
        let mut lines = text
            .lines()
            .skip_while(|l| !l.starts_with("nccl "))
            .peekable();
        let mut block = vec![lines.next().expect("a `nccl` line").to_string()];
        while let Some(l) = lines.next_if(|l| l.starts_with("       ")) {
            block.push(l.to_string());
        }
        block
    };
    // A path that does not exist: named, with the loader's reason.
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("libnccl.so.2").display().to_string();
    let block = nccl(&doctor(Some(&missing)));
    let text = block.join("\n");
    assert!(
        block.iter().any(|l| l.contains(&format!(
            "could not load FOLDPRINT_NCCL_LIBRARY={missing}: "
        )) && l.contains("No such file")),
        "{text}"
    );
    // A named library is the only one tried: no other NCCL stands in,
    // whatever the loader's search would find.
    assert!(
        block[0].starts_with("nccl   NOT FOUND: no NCCL library loads here"),
        "{text}"
    );
    assert!(
        text.contains("a run refuses to start rather than load another NCCL"),
        "{text}"
    );
    // A shared library that loads but is not NCCL: named, and what it lacks.
    let libc = libc_path();
    let block = nccl(&doctor(Some(&libc)));
    assert!(
        block[0].starts_with(&format!("nccl   NOT usable: FOLDPRINT_NCCL_LIBRARY={libc}"))
            && block[0].contains("is not a usable NCCL")
            && block[0].contains("lacks ncclGetVersion"),
        "{block:?}"
    );
    let v: serde_json::Value = serde_json::from_slice(
        &fp()
            .args(["doctor", "--json"])
            .env("FOLDPRINT_NCCL_LIBRARY", &libc)
            .output()
            .unwrap()
            .stdout,
    )
    .unwrap();
    assert_eq!(v["nccl"]["requested"], libc.as_str(), "{v}");
    assert_eq!(v["nccl"]["opened"], libc.as_str(), "{v}");
    assert!(v["nccl"]["version"].is_null(), "{v}");
    assert!(
        v["nccl"]["error"]
            .as_str()
            .unwrap()
            .contains("lacks ncclGetVersion"),
        "{v}"
    );
    // Negative control: unset, the variable is named only in the hint, and
    // the line says either which NCCL and version or that there is none.
    let block = nccl(&doctor(None));
    assert!(
        block
            .iter()
            .all(|l| !l.contains("FOLDPRINT_NCCL_LIBRARY=") || l.contains("=/path/to/")),
        "{block:?}"
    );
    assert!(
        block[0].starts_with("nccl   NCCL 2.") || block[0].starts_with("nccl   NOT FOUND"),
        "{block:?}"
    );
}

#[test]
fn junit_lists_every_case_and_group() {
    let dir = tempfile::tempdir().unwrap();
    let exp = write(dir.path(), "tiny.toml", TINY);
    let xml = dir.path().join("r.xml");
    fp().args(["run", "--backend", "cpu", "--junit"])
        .arg(&xml)
        .arg(&exp)
        .assert()
        .success();
    let text = std::fs::read_to_string(&xml).unwrap();
    // 6 cases + 2 groups (fixed-order, arrival-order), none failing.
    assert!(text.contains("tests=\"8\" failures=\"0\""), "{text}");
    assert_eq!(text.matches("<testcase ").count(), 8);
}

#[test]
fn provenance_file_is_embedded_in_the_report() {
    let dir = tempfile::tempdir().unwrap();
    let exp = write(dir.path(), "tiny.toml", TINY);
    let prov = write(
        dir.path(),
        "prov.json",
        r#"{"combo": "cuda12_8-nccl2_28_9"}"#,
    );
    let out = fp()
        .env("FOLDPRINT_PROVENANCE", &prov)
        .args(["run", "--backend", "cpu", "--json"])
        .arg(&exp)
        .assert()
        .success();
    let v: serde_json::Value = serde_json::from_slice(&out.get_output().stdout).unwrap();
    assert_eq!(
        v["environment"]["provenance"]["content"]["combo"],
        "cuda12_8-nccl2_28_9"
    );
}

#[test]
fn launch_propagates_the_first_failure_and_names_the_rank() {
    fp().args([
        "launch",
        "-n",
        "3",
        "--exec",
        "--",
        "sh",
        "-c",
        "[ $FOLDPRINT_RANK != 1 ] || exit 5; sleep 20",
    ])
    .timeout(std::time::Duration::from_secs(15))
    .assert()
    .code(5)
    .stderr(predicate::str::contains("rank 1 of 3 failed first"));
    fp().args(["launch", "-n", "2", "--", "doctor"])
        .assert()
        .success();
}

#[test]
fn compare_of_dumps_localizes_a_single_differing_element() {
    let dir = tempfile::tempdir().unwrap();
    let exp = write(dir.path(), "tiny.toml", TINY);
    let (da, db) = (dir.path().join("a"), dir.path().join("b"));
    for d in [&da, &db] {
        fp().args(["run", "--backend", "cpu", "--dump"])
            .arg(d)
            .arg(&exp)
            .assert()
            .success();
    }
    fp().arg("compare")
        .arg(&da)
        .arg(&db)
        .assert()
        .success()
        .stdout(predicate::str::contains("dumps are identical"));
    // Change element 100 of one arena by one ULP, and its SHA256SUMS line.
    let sums = std::fs::read_to_string(db.join("SHA256SUMS")).unwrap();
    let name = sums
        .lines()
        .next()
        .unwrap()
        .split_whitespace()
        .nth(1)
        .unwrap()
        .to_string();
    let mut bytes = std::fs::read(db.join(&name)).unwrap();
    let old = u32::from_le_bytes(bytes[400..404].try_into().unwrap());
    bytes[400..404].copy_from_slice(&(old + 1).to_le_bytes());
    std::fs::write(db.join(&name), &bytes).unwrap();
    let new_hash = foldprint::digest::Sha256::of(&bytes);
    let first = sums.lines().next().unwrap().to_string();
    let sums = sums.replacen(&first, &format!("{new_hash}  {name}"), 1);
    std::fs::write(db.join("SHA256SUMS"), sums).unwrap();
    fp().arg("compare")
        .arg(&da)
        .arg(&db)
        .assert()
        .code(1)
        .stdout(predicate::str::contains(format!(
            "DIFFER {name}: 1 of 257 elements differ"
        )))
        .stdout(predicate::str::contains(format!("0x{old:08x}")))
        .stdout(predicate::str::is_match(r"\s100\s.*\s1\n").unwrap());
}

#[test]
fn attestation_is_a_canonical_in_toto_statement_over_report_and_dumps() {
    let dir = tempfile::tempdir().unwrap();
    let exp = write(dir.path(), "tiny.toml", TINY);
    let (report, dump, st) = (
        dir.path().join("r.json"),
        dir.path().join("d"),
        dir.path().join("st.json"),
    );
    fp().args(["run", "--backend", "cpu", "--out"])
        .arg(&report)
        .arg("--dump")
        .arg(&dump)
        .arg(&exp)
        .assert()
        .success();
    fp().arg("attest")
        .arg(&report)
        .arg("--dump")
        .arg(&dump)
        .arg("--out")
        .arg(&st)
        .assert()
        .success();
    let text = std::fs::read_to_string(&st).unwrap();
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(v["_type"], "https://in-toto.io/Statement/v1");
    assert_eq!(v["predicateType"], "urn:foldprint:predicate:run:v1");
    let subjects = v["subject"].as_array().unwrap();
    assert_eq!(subjects.len(), 1 + 12);
    assert_eq!(subjects[0]["name"], "r.json");
    assert_eq!(
        subjects[0]["digest"]["sha256"],
        foldprint::digest::Sha256::of(&std::fs::read(&report).unwrap()).to_string()
    );
    assert_eq!(v["predicate"]["cases"].as_array().unwrap().len(), 6);
    // Canonical: re-canonicalizing the parsed statement gives the same bytes.
    assert_eq!(foldprint::report::attest::canonical(&v), text);
    assert!(!text.contains(": ") && !text.contains('\n'));
    // A tampered dump is refused.
    let sums = std::fs::read_to_string(dump.join("SHA256SUMS")).unwrap();
    let f = sums
        .lines()
        .next()
        .unwrap()
        .split_whitespace()
        .nth(1)
        .unwrap();
    std::fs::write(dump.join(f), b"tampered").unwrap();
    fp().arg("attest")
        .arg(&report)
        .arg("--dump")
        .arg(&dump)
        .arg("--out")
        .arg(dir.path().join("x.json"))
        .assert()
        .code(1)
        .stderr(predicate::str::contains("SHA256SUMS says"));
    assert!(!dir.path().join("x.json").exists());
}

/// On a machine without CUDA (CI), `--backend cuda` must fail with exit 3 and
/// say what is missing, and `auto` must fall back with a note. Where CUDA is
/// usable, the same commands must succeed instead.
#[test]
fn cuda_backend_without_a_gpu_fails_clearly_and_auto_falls_back() {
    let doctor = fp().args(["doctor", "--json"]).assert().success();
    let v: serde_json::Value = serde_json::from_slice(&doctor.get_output().stdout).unwrap();
    let usable = v["cuda"]["usable"].as_bool().unwrap();
    let cuda = fp()
        .args(["run", "--backend", "cuda", "experiments/smoke.toml"])
        .assert();
    let auto = fp()
        .args(["run", "experiments/smoke.toml"])
        .assert()
        .success();
    if usable {
        cuda.success();
    } else {
        cuda.code(3)
            .stderr(predicate::str::contains(
                "backend `cuda` is not usable here",
            ))
            .stderr(predicate::str::contains("libcuda.so"));
        auto.stderr(predicate::str::contains("auto: CUDA not usable"))
            .stderr(predicate::str::contains("using the CPU oracle"));
    }
}

#[test]
fn a_case_larger_than_memory_exits_3_before_allocating() {
    let dir = tempfile::tempdir().unwrap();
    // 64 x 4e9 x 4 bytes = 1.02 TB: valid as an experiment, too big for this machine.
    // The figure named is the count plus the preflight's 4 MiB margin.
    let exp = write(
        dir.path(),
        "oom.toml",
        "name = \"oom\"\n[[case]]\nid = \"big\"\nworld = 64\narenas = [4000000000]\n",
    );
    fp().args(["run", "--backend", "cpu"])
        .arg(&exp)
        .assert()
        .code(3)
        .stderr(predicate::str::contains(
            "case `big` needs 1024004194304 bytes of host memory",
        ));
}

#[test]
fn compare_of_reports_narrows_a_one_element_difference_to_its_chunk() {
    let dir = tempfile::tempdir().unwrap();
    let exp = write(
        dir.path(),
        "big.toml",
        "name = \"big\"\n[[case]]\nid = \"c\"\nworld = 3\narenas = [200000]\nseed = 4\n",
    );
    let (ra, rb, dump) = (
        dir.path().join("a.json"),
        dir.path().join("b.json"),
        dir.path().join("d"),
    );
    fp().args(["run", "--backend", "cpu", "--out"])
        .arg(&ra)
        .arg("--dump")
        .arg(&dump)
        .arg(&exp)
        .assert()
        .success();
    // What another machine would report if element 150000 came out different:
    // recompute the arena digest and chunk digests from the altered bytes.
    let mut bytes = std::fs::read(dump.join("big.c.a0.bin")).unwrap();
    bytes[150000 * 4] ^= 1;
    let chunk = 1usize << 16;
    let mut v: serde_json::Value = serde_json::from_slice(&std::fs::read(&ra).unwrap()).unwrap();
    let arena = &mut v["cases"][0]["arenas"][0];
    assert_eq!(arena["chunk_elems"], chunk);
    assert_eq!(arena["chunk_sha256"].as_array().unwrap().len(), 4);
    let digest = foldprint::digest::Sha256::of(&bytes).to_string();
    arena["sha256"] = digest.clone().into();
    for r in arena["rank_sha256"].as_array_mut().unwrap() {
        *r = digest.clone().into();
    }
    arena["chunk_sha256"][2] = foldprint::digest::Sha256::of(&bytes[2 * chunk * 4..3 * chunk * 4])
        .to_string()
        .into();
    let chunks: Vec<foldprint::digest::Sha256> =
        serde_json::from_value(arena["chunk_sha256"].clone()).unwrap();
    arena["chunk_root"] = foldprint::digest::chunk_root(&chunks).to_string().into();
    std::fs::write(&rb, serde_json::to_vec(&v).unwrap()).unwrap();
    fp().arg("compare")
        .arg(&ra)
        .arg(&rb)
        .assert()
        .code(1)
        .stdout(predicate::str::contains(
            "differing elements in 131072..196608",
        ));
}

/// Only NCCL runs `nccl-allreduce`: on the CPU every case is skipped.
const ALL_SKIPPED: &str = r#"
name = "skipped"
[defaults]
world = 2
arenas = [64]
contract = "nccl-allreduce"
[[sweep]]
id = "s"
seed = [1, 2]
"#;

fn out_of(a: &assert_cmd::assert::Assert) -> String {
    let o = a.get_output();
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// A golden must be its experiment's: another name, or another
/// experiment's golden under this name, fails `verify`.
#[test]
fn verify_refuses_a_golden_of_another_experiment() {
    let dir = tempfile::tempdir().unwrap();
    let gold = dir.path();
    let nothing = serde_json::json!({
        "format": "foldprint-golden", "version": 1, "experiment": "nothing",
        "nan_policy": "canonical", "produced_by": "x", "cases": []
    });
    std::fs::write(gold.join("smoke.json"), nothing.to_string()).unwrap();
    let verify = || {
        fp().args([
            "verify",
            "--backend",
            "cpu",
            "experiments/smoke.toml",
            "--golden",
        ])
        .arg(gold)
        .assert()
        .code(1)
    };
    let text = out_of(&verify());
    assert!(
        text.contains("golden of experiment `nothing`, but it is loaded for experiment `smoke`"),
        "{text}"
    );
    assert!(!text.contains("verify ok"), "{text}");

    std::fs::copy(
        "experiments/golden/edge-cases.json",
        gold.join("smoke.json"),
    )
    .unwrap();
    let text = out_of(&verify());
    assert!(text.contains("golden of experiment `edge-cases`"), "{text}");

    // Renamed inside too: every smoke case lacks a golden, every edge case is stale.
    let mut g: serde_json::Value =
        serde_json::from_slice(&std::fs::read(gold.join("smoke.json")).unwrap()).unwrap();
    g["experiment"] = "smoke".into();
    std::fs::write(gold.join("smoke.json"), g.to_string()).unwrap();
    let text = out_of(&verify());
    assert!(text.contains("verify FAILED"), "{text}");
    assert!(text.contains("has no golden digest in"), "{text}");
    assert!(
        text.contains("that the experiment no longer declares"),
        "{text}"
    );
}

/// A run, verify or golden whose every case the backend skips checked
/// nothing: exit 1, never "ok".
#[test]
fn nothing_checked_fails_run_verify_and_golden() {
    let dir = tempfile::tempdir().unwrap();
    let exp = write(dir.path(), "skipped.toml", ALL_SKIPPED);
    let report = dir.path().join("r.json");
    let junit = dir.path().join("j.xml");
    let text = out_of(
        &fp()
            .args(["run", "--backend", "cpu"])
            .arg(&exp)
            .arg("--out")
            .arg(&report)
            .arg("--junit")
            .arg(&junit)
            .assert()
            .code(1),
    );
    let xml = std::fs::read_to_string(&junit).unwrap();
    // The verdict's testcase fails; the two cases are listed as skipped.
    assert!(
        xml.contains("tests=\"3\" failures=\"1\" skipped=\"2\""),
        "{xml}"
    );
    assert_eq!(xml.matches("<skipped message=").count(), 2, "{xml}");
    assert!(
        xml.contains("<failure message=\"nothing was checked"),
        "{xml}"
    );
    assert!(
        text.contains("nothing was checked: the backend skipped all 2 case(s)"),
        "{text}"
    );
    assert!(!text.contains("every check passed"), "{text}");
    let r: serde_json::Value = serde_json::from_slice(&std::fs::read(&report).unwrap()).unwrap();
    assert_eq!(r["summary"]["ok"], false);

    let gold = dir.path().join("golden");
    let text = out_of(
        &fp()
            .arg("golden")
            .arg(&exp)
            .arg("--golden")
            .arg(&gold)
            .assert()
            .code(1),
    );
    assert!(text.contains("nothing was checked"), "{text}");
    assert!(!gold.join("skipped.json").exists(), "no golden of no case");

    // A golden of no case cannot make verify pass either.
    std::fs::create_dir(&gold).unwrap();
    let empty = serde_json::json!({
        "format": "foldprint-golden", "version": 1, "experiment": "skipped",
        "nan_policy": "canonical", "produced_by": "x", "cases": []
    });
    std::fs::write(gold.join("skipped.json"), empty.to_string()).unwrap();
    let text = out_of(
        &fp()
            .args(["verify", "--backend", "cpu"])
            .arg(&exp)
            .arg("--golden")
            .arg(&gold)
            .assert()
            .code(1),
    );
    assert!(text.contains("verify FAILED"), "{text}");
    assert!(text.contains("nothing was checked"), "{text}");

    // Such a report never "agrees": compare names it, attest marks it.
    let text = out_of(
        &fp()
            .arg("compare")
            .arg(&report)
            .arg(&report)
            .assert()
            .code(1),
    );
    assert!(text.contains("its own run FAILED its checks"), "{text}");
    let st = dir.path().join("st.json");
    let text = out_of(
        &fp()
            .arg("attest")
            .arg(&report)
            .arg("--out")
            .arg(&st)
            .assert()
            .code(1),
    );
    assert!(text.contains("FAILED RUN"), "{text}");
    let s: serde_json::Value = serde_json::from_slice(&std::fs::read(&st).unwrap()).unwrap();
    assert_eq!(s["predicate"]["verdict"]["ok"], false, "{s}");
}

/// `compare --allow-missing` of a report sharing no case with the others,
/// and of dump directories listing no file, checked nothing.
#[test]
fn compare_of_nothing_shared_fails() {
    let dir = tempfile::tempdir().unwrap();
    let tiny = write(dir.path(), "tiny.toml", TINY);
    let other = write(
        dir.path(),
        "other.toml",
        "name = \"other\"\n[[case]]\nid = \"x\"\nworld = 2\narenas = [9]\n",
    );
    let (a, b) = (dir.path().join("a.json"), dir.path().join("b.json"));
    for (exp, out) in [(&tiny, &a), (&other, &b)] {
        fp().args(["run", "--backend", "cpu"])
            .arg(exp)
            .arg("--out")
            .arg(out)
            .assert()
            .success();
    }
    fp().arg("compare")
        .arg(&a)
        .arg(&a)
        .args(["--allow-missing"])
        .assert()
        .success();
    let text = out_of(
        &fp()
            .arg("compare")
            .arg(&a)
            .arg(&a)
            .arg(&b)
            .arg("--allow-missing")
            .assert()
            .code(1),
    );
    assert!(text.contains("nothing was checked"), "{text}");
    assert!(text.contains("share no case"), "{text}");

    let (d1, d2) = (dir.path().join("d1"), dir.path().join("d2"));
    for d in [&d1, &d2] {
        std::fs::create_dir(d).unwrap();
        std::fs::write(d.join("SHA256SUMS"), "").unwrap();
    }
    let text = out_of(&fp().arg("compare").arg(&d1).arg(&d2).assert().code(1));
    assert!(text.contains("nothing was checked"), "{text}");
    assert!(!text.contains("ok: dumps are identical"), "{text}");
}

/// `golden` says what changed, and refuses to overwrite a file it cannot read.
#[test]
fn golden_says_what_changed_and_keeps_an_unreadable_file() {
    let dir = tempfile::tempdir().unwrap();
    let exp = write(dir.path(), "tiny.toml", TINY);
    let gold = dir.path().join("golden");
    let golden = || {
        fp().arg("golden")
            .arg(&exp)
            .arg("--golden")
            .arg(&gold)
            .assert()
    };
    golden().success();
    let gpath = gold.join("tiny.json");
    let mut g: serde_json::Value = serde_json::from_slice(&std::fs::read(&gpath).unwrap()).unwrap();
    let changed = g["cases"][0]["sensitivity"]["changed"].as_u64().unwrap();
    g["cases"][0]["sensitivity"]["changed"] = (changed + 1).into();
    std::fs::write(&gpath, g.to_string()).unwrap();
    let text = out_of(&golden().success());
    assert!(
        text.contains("changed: 1 case(s) with other order-sensitivity counts;"),
        "{text}"
    );
    assert!(!text.contains("digests"), "{text}");

    std::fs::write(&gpath, "<<<<<<< HEAD\n{}\n").unwrap();
    let text = out_of(&golden().code(2));
    assert!(text.contains("refusing to overwrite"), "{text}");
    assert_eq!(std::fs::read(&gpath).unwrap(), b"<<<<<<< HEAD\n{}\n");
}

/// With 3 or more arenas the TIME column stays under its header.
#[test]
fn time_column_stays_aligned_with_many_arenas() {
    let dir = tempfile::tempdir().unwrap();
    let exp = write(
        dir.path(),
        "many.toml",
        "name = \"many\"\n[defaults]\nworld = 2\n[[case]]\nid = \"one\"\narenas = [5]\n\
         [[case]]\nid = \"four\"\narenas = [5, 6, 7, 8]\n",
    );
    let out = fp()
        .args(["run", "--backend", "cpu"])
        .arg(&exp)
        .assert()
        .success();
    let text = String::from_utf8_lossy(&out.get_output().stdout).into_owned();
    let header = text.lines().find(|l| l.contains("TIME")).expect("header");
    let rows: Vec<&str> = text.lines().filter(|l| l.starts_with("  ok ")).collect();
    assert_eq!(rows.len(), 2, "{text}");
    for r in rows {
        assert_eq!(r.chars().count(), header.chars().count(), "{header}\n{r}");
    }
}

#[test]
fn help_lists_the_nan_policies() {
    let out = fp().args(["run", "--help"]).assert().success();
    let text = String::from_utf8_lossy(&out.get_output().stdout).into_owned();
    assert!(
        text.contains("`canonical`") && text.contains("`preserve`"),
        "{text}"
    );
}

/// W = 4 with one element: for seed 23 the arrival-order control's two
/// orders happen to round alike. The group is inconclusive, not a failure,
/// and `golden` writes the golden.
#[test]
fn a_data_coincidence_is_not_a_failed_control() {
    let dir = tempfile::tempdir().unwrap();
    let exp = write(
        dir.path(),
        "tiny1.toml",
        "name = \"tiny1\"\n[defaults]\nworld = 4\narenas = [1]\nseed = 23\n\
         [[sweep]]\nid = \"o\"\norder = [\"ascending\", \"rotate:1\"]\ncontract = [\"arrival-order\"]\n",
    );
    let text = out_of(
        &fp()
            .args(["run", "--backend", "cpu"])
            .arg(&exp)
            .assert()
            .success(),
    );
    assert!(text.contains("got inconclusive"), "{text}");
    assert!(text.contains("a coincidence of the data"), "{text}");
    let gold = dir.path().join("golden");
    fp().arg("golden")
        .arg(&exp)
        .arg("--golden")
        .arg(&gold)
        .assert()
        .success();
    assert!(gold.join("tiny1.json").is_file());
}

/// Issue 20: a failed CPU job (no NCCL log written) leaves no
/// `foldprint-launch-*` directory behind.
#[test]
fn a_failed_cpu_launch_leaves_no_log_directory() {
    let dir = tempfile::tempdir().unwrap();
    let tmp = dir.path().join("tmp");
    std::fs::create_dir(&tmp).unwrap();
    fp().args([
        "launch",
        "-n",
        "2",
        "--",
        "run",
        "no-such.toml",
        "--backend",
        "cpu",
    ])
    .env("TMPDIR", &tmp)
    .env_remove("NCCL_DEBUG")
    .env_remove("NCCL_DEBUG_FILE")
    .assert()
    .failure()
    .stderr(predicate::str::contains("NCCL logs").not());
    let left: Vec<_> = std::fs::read_dir(&tmp).unwrap().flatten().collect();
    assert!(left.is_empty(), "left in TMPDIR: {left:?}");
}

/// Issue 20: `--help` (and `--version`) to a full device fails, like any
/// other output (3: no space), instead of exiting 0.
#[test]
fn help_to_a_full_device_fails() {
    for arg in ["--help", "--version"] {
        let full = std::fs::OpenOptions::new()
            .write(true)
            .open("/dev/full")
            .unwrap();
        let o = std::process::Command::new(crate::common::bin_path())
            .arg(arg)
            .stdout(full)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(3), "{arg}: {err}");
        assert!(err.contains("standard output"), "{arg}: {err}");
    }
    // To a pipe it still succeeds.
    fp().arg("--help").assert().success();
}
