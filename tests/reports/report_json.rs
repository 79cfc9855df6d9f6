//! The typed report and golden read and write the same JSON: every
//! committed golden parses and serializes back to its own bytes, and a
//! report written by an earlier build (tests/data/report-cpu.json) to its
//! own bytes but for the spelling of some timing floats, which read as the
//! same f64. Unknown words where the report has a fixed set (contracts,
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

/// A line that holds one float: the text before it, the float, the text
/// after it (`"fraction": 0.25,` or, in an array, `0.25`).
fn float_line(line: &str) -> Option<(&str, f64, &str)> {
    let start = line
        .rfind(": ")
        .map_or(line.len() - line.trim_start().len(), |i| i + 2);
    let (head, rest) = line.split_at(start);
    let number = rest.strip_suffix(',').unwrap_or(rest);
    let tail = &rest[number.len()..];
    if !number.contains(['.', 'e', 'E']) {
        return None;
    }
    let x: f64 = serde_json::from_str(number).ok()?;
    Some((head, x, tail))
}

/// Where `again` differs from `text`: `Err` with the first line that
/// differs, else `Ok` with the keys of the lines that differ only in the
/// spelling of a float that reads as the same f64 (serde_json's default
/// float parsing is not exact in the last digit, so a float read and
/// written again can be spelled shorter: the binary only writes reports,
/// it never writes one it read).
fn difference<'t>(text: &'t str, again: &str) -> Result<Vec<&'t str>, String> {
    let (a, b): (Vec<&str>, Vec<&str>) = (text.lines().collect(), again.lines().collect());
    let mut respelled = Vec::new();
    for (i, (l, r)) in a.iter().zip(&b).enumerate() {
        if l == r {
            continue;
        }
        match (float_line(l), float_line(r)) {
            (Some((h1, x, t1)), Some((h2, y, t2)))
                if (h1, t1) == (h2, t2) && x.to_bits() == y.to_bits() =>
            {
                respelled.push(h1.trim())
            }
            _ => return Err(format!("line {}: `{l}` became `{r}`", i + 1)),
        }
    }
    if a.len() != b.len() || text.ends_with('\n') != again.ends_with('\n') {
        return Err(format!("{} lines became {}", a.len(), b.len()));
    }
    Ok(respelled)
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
        // Goldens hold no floats: byte for byte.
        assert_eq!(golden_again(&text), text, "{}", path.display());
    }
}

#[test]
fn a_saved_report_reads_and_writes_the_same_json() {
    let path = root().join("tests/data/report-cpu.json");
    let text = std::fs::read_to_string(&path).unwrap();
    let r = Report::read(&path).unwrap();
    let again = report_again(&text);
    let respelled = difference(&text, &again).unwrap_or_else(|d| panic!("{}: {d}", path.display()));
    // Only timings and fractions are respelled, never a word, digest or count.
    let floats = [
        "\"fraction\":",
        "\"generate_ms\":",
        "\"reduce_ms\":",
        "\"digest_ms\":",
        "\"total_ms\":",
        "\"fold_gb_per_s\":",
        "\"sensitivity_ms\":",
        "\"backend_init_ms\":",
    ];
    assert!(
        respelled.iter().all(|k| floats.contains(k)),
        "{respelled:?}"
    );
    let value = |t: &str| serde_json::from_str::<serde_json::Value>(t).unwrap();
    assert_eq!(value(&text), value(&again));
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
    assert!(tampered != text);
    let d = difference(&tampered, &report_again(&tampered)).unwrap_err();
    assert!(d.contains("\"unknown_field\": 1,"), "{d}");
    let golden = std::fs::read_to_string(root().join("experiments/golden/smoke.json")).unwrap();
    let tampered = golden.replacen(
        "\"id\": \"w3-pinned\",",
        "\"id\": \"w3-pinned\", \"x\": 0,",
        1,
    );
    assert!(golden_again(&tampered) != tampered);
    // A float that changed value is a difference; one spelled longer is not.
    let changed = text.replacen("\"fraction\": 0.", "\"fraction\": 0.5", 1);
    assert!(difference(&text, &changed).is_err());
    let respelled = text.replacen(
        "\"sensitivity_ms\": 0.085429\n",
        "\"sensitivity_ms\": 0.0854290\n",
        1,
    );
    assert!(respelled != text);
    assert_eq!(
        difference(&text, &respelled),
        Ok(vec!["\"sensitivity_ms\":"])
    );
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
