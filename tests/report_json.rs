//! The typed report and golden read and write the same JSON, byte for
//! byte: every committed golden and a report written by an earlier build
//! (tests/data/report-cpu.json) parse and serialize back to their own
//! bytes. Unknown words where the report has a fixed set (contracts,
//! distributions, verdicts) are refused with a message that names them.

use foldprint::fold::Contract;
use foldprint::report::{Expect, Golden, GroupVerdict, Report};
use foldprint::sensitivity::Verdict;
use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Every *.json below `dir`, sorted.
fn json_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            out.extend(json_files(&path));
        } else if path.extension().is_some_and(|e| e == "json") {
            out.push(path);
        }
    }
    out.sort();
    out
}

/// Where `again` first differs from `text`, if anywhere: the line number
/// and both lines. Also compares the two as JSON values.
fn difference(text: &str, again: &str) -> Option<String> {
    let a: serde_json::Value = serde_json::from_str(text).unwrap();
    let b: serde_json::Value = serde_json::from_str(again).unwrap();
    if text == again && a == b {
        return None;
    }
    let (i, (l, r)) = text
        .lines()
        .zip(again.lines())
        .enumerate()
        .find(|(_, (l, r))| l != r)
        .unwrap_or((text.lines().count().min(again.lines().count()), ("", "")));
    Some(format!(
        "line {}: `{l}` became `{r}` ({} vs {} bytes; values equal: {})",
        i + 1,
        text.len(),
        again.len(),
        a == b
    ))
}

fn report_again(text: &str) -> String {
    serde_json::from_str::<Report>(text).unwrap().to_json()
}

fn golden_again(text: &str) -> String {
    serde_json::from_str::<Golden>(text).unwrap().to_json()
}

#[test]
fn every_golden_reads_and_writes_its_own_bytes() {
    let files = json_files(&root().join("experiments/golden"));
    assert!(files.len() >= 7, "goldens found: {files:?}");
    for path in &files {
        let text = std::fs::read_to_string(path).unwrap();
        Golden::read(path).unwrap();
        if let Some(d) = difference(&text, &golden_again(&text)) {
            panic!("{}: {d}", path.display());
        }
    }
}

#[test]
fn a_saved_report_reads_and_writes_its_own_bytes() {
    let path = root().join("tests/data/report-cpu.json");
    let text = std::fs::read_to_string(&path).unwrap();
    let r = Report::read(&path).unwrap();
    if let Some(d) = difference(&text, &report_again(&text)) {
        panic!("{}: {d}", path.display());
    }
    // The typed fields the fixture carries, so the round trip covers them.
    let verdicts: Vec<GroupVerdict> = r.groups.iter().map(|g| g.verdict).collect();
    for v in [
        GroupVerdict::Agree,
        GroupVerdict::Disagree,
        GroupVerdict::Inconclusive,
    ] {
        assert!(verdicts.contains(&v), "no {v} group in the fixture");
    }
    for e in [Expect::Agree, Expect::Disagree] {
        assert!(r.groups.iter().any(|g| g.expect == e), "no {e} group");
    }
    for v in [Verdict::Sensitive, Verdict::Blind] {
        assert!(r.cases.iter().any(|c| c.sensitivity.verdict == v));
    }
    for c in [
        Contract::FixedOrder,
        Contract::ArrivalOrder,
        Contract::PairwiseTree,
    ] {
        assert!(r.cases.iter().any(|k| k.params.contract == c));
    }
    assert!(!r.skipped.is_empty(), "the fixture has skipped cases");
}

/// The comparison above sees what a type would lose: a field the types do
/// not know is dropped on the way back, and the bytes differ.
#[test]
fn the_round_trip_sees_a_dropped_field() {
    let text = std::fs::read_to_string(root().join("tests/data/report-cpu.json")).unwrap();
    let tampered = text.replacen(
        "\"rounds_identical\": true,",
        "\"rounds_identical\": true,\n      \"unknown_field\": 1,",
        1,
    );
    assert_ne!(tampered, text);
    let d = difference(&tampered, &report_again(&tampered)).expect("a difference");
    assert!(d.contains("values equal: false"), "{d}");
    let golden = std::fs::read_to_string(root().join("experiments/golden/smoke.json")).unwrap();
    let tampered = golden.replacen(
        "\"id\": \"w3-pinned\",",
        "\"id\": \"w3-pinned\", \"x\": 0,",
        1,
    );
    assert!(difference(&tampered, &golden_again(&tampered)).is_some());
}

/// Read `text` as a report file; the error's message.
fn read_error(text: &str) -> String {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("r.json");
    std::fs::write(&path, text).unwrap();
    let err = Report::read(&path)
        .expect_err("must be refused")
        .to_string();
    assert!(err.contains("r.json: not a foldprint report: "), "{err}");
    err
}

#[test]
fn unknown_words_are_refused_by_name_and_place() {
    let text = std::fs::read_to_string(root().join("tests/data/report-cpu.json")).unwrap();
    let cases = [
        (
            "\"verdict\": \"blind\"",
            "\"verdict\": \"blnd\"",
            "unknown variant `blnd`, expected one of `sensitive`, `weak`, `blind` at line ",
        ),
        (
            "\"verdict\": \"inconclusive\"",
            "\"verdict\": \"maybe\"",
            "unknown variant `maybe`, expected one of `agree`, `disagree`, `inconclusive` at line ",
        ),
        (
            "\"expect\": \"agree\"",
            "\"expect\": \"na\"",
            "unknown variant `na`, expected one of `agree`, `disagree`, `n/a` at line ",
        ),
        (
            "\"contract\": \"fixed-order\"",
            "\"contract\": \"fixed_order\"",
            "unknown variant `fixed_order`, expected one of `fixed-order`, `arrival-order`, `pairwise-tree`, `nccl-allreduce` at line ",
        ),
        (
            "\"distribution\": \"uniform\"",
            "\"distribution\": \"gaussian\"",
            "unknown variant `gaussian`, expected one of `mixed-magnitude`, ",
        ),
    ];
    for (from, to, want) in cases {
        assert!(text.contains(from), "{from}");
        let err = read_error(&text.replacen(from, to, 1));
        assert!(err.contains(want), "{to}: {err}");
    }
}

/// The JSON words are the names the rest of foldprint uses (experiment
/// files, case keys, the table).
#[test]
fn json_words_are_the_names() {
    let word = |v: serde_json::Value| v.as_str().unwrap().to_string();
    for c in foldprint::fold::ALL_CONTRACTS {
        assert_eq!(word(serde_json::to_value(c).unwrap()), c.name());
    }
    for d in foldprint::data::ALL_DISTRIBUTIONS {
        assert_eq!(word(serde_json::to_value(d).unwrap()), d.name());
    }
    for e in [Expect::Agree, Expect::Disagree, Expect::NotApplicable] {
        assert_eq!(word(serde_json::to_value(e).unwrap()), e.name());
        let back: Expect = serde_json::from_value(serde_json::to_value(e).unwrap()).unwrap();
        assert_eq!(back, e);
    }
    for v in [
        GroupVerdict::Agree,
        GroupVerdict::Disagree,
        GroupVerdict::Inconclusive,
    ] {
        assert_eq!(word(serde_json::to_value(v).unwrap()), v.name());
    }
    assert_eq!(Expect::NotApplicable.name(), "n/a");
}

/// Every variant serde knows of, from its refusal of an unknown word
/// ("expected one of `a`, `b`"): the derive lists them all.
fn every_variant<T: serde::de::DeserializeOwned + std::fmt::Debug>() -> Vec<String> {
    let err = serde_json::from_str::<T>("\"?\"").unwrap_err().to_string();
    let expected = &err[err.find("expected").expect(&err)..];
    expected
        .split('`')
        .skip(1)
        .step_by(2)
        .map(str::to_string)
        .collect()
}

/// `ALL_CONTRACTS` and `ALL_DISTRIBUTIONS` are written by hand: a new
/// variant left out of them fails here (experiment files could not name
/// it, and the tests that iterate the lists would skip it).
#[test]
fn the_lists_of_contracts_and_distributions_are_complete() {
    let contracts: Vec<String> = foldprint::fold::ALL_CONTRACTS
        .iter()
        .map(|c| c.name().to_string())
        .collect();
    assert_eq!(contracts, every_variant::<Contract>());
    let distributions: Vec<String> = foldprint::data::ALL_DISTRIBUTIONS
        .iter()
        .map(|d| d.name().to_string())
        .collect();
    assert_eq!(
        distributions,
        every_variant::<foldprint::data::Distribution>()
    );
    // The reading of serde's message, on an enum whose variants are known.
    assert_eq!(every_variant::<Verdict>(), ["sensitive", "weak", "blind"]);
    assert_eq!(
        every_variant::<GroupVerdict>(),
        ["agree", "disagree", "inconclusive"]
    );
}
