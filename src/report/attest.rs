//! Attestations: an in-toto Statement v1 about a run, serialized as RFC 8785
//! (JCS) canonical JSON so any signer hashes the same bytes.
//! Subjects: the report file and every dumped arena, with their SHA-256.
//! Predicate: what was run (experiments, case parameters, digests, and where
//! a case has an `expect` file, what its comparison found) and where.

use super::Report;
use serde_json::{json, Map, Value};
use std::path::Path;

pub const STATEMENT_TYPE: &str = "https://in-toto.io/Statement/v1";
pub const PREDICATE_TYPE: &str = "urn:foldprint:predicate:run:v1";

/// One attested artifact.
pub struct Subject {
    pub name: String,
    pub sha256: crate::digest::Sha256,
}

/// Why a dump directory cannot be attested with a report.
#[derive(Debug, Clone, PartialEq)]
pub enum DumpMismatch {
    /// The directory or its SHA256SUMS cannot be read or parsed.
    Unreadable(String),
    /// A file, SHA256SUMS and the report do not all say the same thing.
    Contradicts(String),
    /// Not enough memory to read a dump file (no verdict).
    OutOfMemory(String),
}

impl std::fmt::Display for DumpMismatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DumpMismatch::Unreadable(m)
            | DumpMismatch::Contradicts(m)
            | DumpMismatch::OutOfMemory(m) => f.write_str(m),
        }
    }
}

impl std::error::Error for DumpMismatch {}

/// The dumped arenas as subjects, after checking that each file hashes to
/// its SHA256SUMS line and to the digest the report gives its arena, that
/// every arena of the report has its file, and that nothing else is there.
pub fn dump_subjects(report: &Report, dir: &Path) -> Result<Vec<Subject>, DumpMismatch> {
    let sums_path = dir.join("SHA256SUMS");
    let sums = crate::input::read_capped(&sums_path, crate::input::MAX_REPORT_BYTES)
        .and_then(|b| {
            String::from_utf8(b)
                .map_err(|_| std::io::Error::new(std::io::ErrorKind::InvalidData, "not UTF-8"))
        })
        .map_err(|e| {
            DumpMismatch::Unreadable(format!("{}: cannot read: {e}", sums_path.display()))
        })?;
    let cases: Vec<(&str, &str, usize)> = report
        .cases
        .iter()
        .map(|c| (c.experiment.as_str(), c.id.as_str(), c.arenas.len()))
        .collect();
    let names = crate::dumpdir::dump_names(&cases).map_err(DumpMismatch::Unreadable)?;
    let mut expected: std::collections::BTreeMap<&str, crate::digest::Sha256> =
        std::collections::BTreeMap::new();
    // Each file is read only up to the size the report gives its arena.
    let mut sizes: std::collections::BTreeMap<&str, usize> = std::collections::BTreeMap::new();
    for c in &report.cases {
        for (k, a) in c.arenas.iter().enumerate() {
            let name = names[&(c.experiment.as_str(), c.id.as_str(), k)].as_str();
            expected.insert(name, a.sha256);
            sizes.insert(name, a.len);
        }
    }
    let mut subjects = Vec::new();
    let mut listed = std::collections::BTreeSet::new();
    for (n, line) in sums.lines().enumerate() {
        let bad = || {
            DumpMismatch::Unreadable(format!(
                "{} line {}: not `<sha256>  <file>`",
                sums_path.display(),
                n + 1
            ))
        };
        let (hash, file) = line.split_once("  ").ok_or_else(bad)?;
        let hash: crate::digest::Sha256 = hash.parse().map_err(|_| bad())?;
        if file.is_empty() || file.contains('/') {
            return Err(bad());
        }
        if !listed.insert(file) {
            return Err(DumpMismatch::Contradicts(format!(
                "{}: lists {file} twice",
                sums_path.display()
            )));
        }
        let path = dir.join(file);
        let declared = sizes.get(file).map(|&n| (n as u64).saturating_mul(4));
        let data = crate::dumpdir::read_dump_file(&path, declared).map_err(|e| {
            let m = format!("{}: cannot read: {e}", path.display());
            match e.kind() {
                std::io::ErrorKind::OutOfMemory => DumpMismatch::OutOfMemory(m),
                // Missing, or larger than the report says: the directory
                // contradicts the report. A fifo or device where a dump
                // belongs, or no permission, is bad input.
                std::io::ErrorKind::NotFound | std::io::ErrorKind::InvalidData => {
                    DumpMismatch::Contradicts(m)
                }
                _ => DumpMismatch::Unreadable(m),
            }
        })?;
        let actual = crate::digest::Sha256::of(&data);
        if actual != hash {
            return Err(DumpMismatch::Contradicts(format!(
                "{}: SHA-256 is {actual}, SHA256SUMS says {hash}",
                path.display()
            )));
        }
        match expected.get(file) {
            None => {
                return Err(DumpMismatch::Contradicts(format!(
                    "{}: no arena of the report is dumped under this name",
                    path.display()
                )))
            }
            Some(want) if *want != actual => {
                return Err(DumpMismatch::Contradicts(format!(
                    "{}: SHA-256 is {actual}, the report says {want}",
                    path.display()
                )))
            }
            Some(_) => {}
        }
        subjects.push(Subject {
            name: file.to_string(),
            sha256: actual,
        });
    }
    if let Some(missing) = expected.keys().find(|k| !listed.contains(*k)) {
        return Err(DumpMismatch::Contradicts(format!(
            "{}: the report's arena {missing} is not in SHA256SUMS",
            dir.display()
        )));
    }
    let entries = std::fs::read_dir(dir)
        .map_err(|e| DumpMismatch::Unreadable(format!("{}: cannot read: {e}", dir.display())))?;
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if !crate::dumpdir::is_bookkeeping(&name) && !listed.contains(name.as_str()) {
            return Err(DumpMismatch::Contradicts(format!(
                "{}: {name} is not listed in SHA256SUMS",
                dir.display()
            )));
        }
    }
    Ok(subjects)
}

pub fn statement(report: &Report, subjects: &[Subject]) -> Value {
    let cases: Vec<Value> = report
        .cases
        .iter()
        .map(|c| {
            let mut case = json!({
                "key": c.key,
                "experiment": c.experiment,
                "id": c.id,
                "params": c.params,
                "arenas_sha256": c.digests(),
                "ranks_identical": c.ranks_identical,
            });
            // Only where the case has one, so a statement about a run
            // without `expect` files is what it always was.
            if let (Some(e), Value::Object(o)) = (&c.expect, &mut case) {
                o.insert("expect".into(), expect_result(e));
            }
            case
        })
        .collect();
    let mut verdict = json!({"ok": report.summary.ok, "failures": report.summary.failures});
    if let (false, Value::Object(o)) = (report.summary.differs_from_expect.is_empty(), &mut verdict)
    {
        o.insert(
            "differs_from_expect".into(),
            json!(report.summary.differs_from_expect),
        );
    }
    json!({
        "_type": STATEMENT_TYPE,
        "subject": subjects.iter().map(|s| json!({"name": s.name, "digest": {"sha256": s.sha256}})).collect::<Vec<_>>(),
        "predicateType": PREDICATE_TYPE,
        "predicate": {
            "foldprint": report.foldprint,
            "backend": report.backend,
            "nan_policy": report.nan_policy,
            "experiments": report.experiments,
            "cases": cases,
            "verdict": verdict,
            "environment": strip_floats(&serde_json::to_value(&report.environment).unwrap_or_default()),
        }
    })
}

/// What a case's comparison with its `expect` file found: the file's
/// digest and size, the verdict, and per arena the differing elements and
/// their largest ULP distance.
fn expect_result(e: &super::expect::ExpectOutcome) -> Value {
    json!({
        "path": e.path,
        "sha256": e.sha256,
        "bytes": e.bytes,
        "equal": e.equal,
        "arenas": e.arenas.iter().map(|a| json!({
            "differing": a.differing,
            "max_ulp": a.max_ulp,
        })).collect::<Vec<_>>(),
    })
}

/// Environment blocks hold no meaningful fractions; drop floats so the
/// canonical form never depends on float formatting corner cases.
fn strip_floats(v: &Value) -> Value {
    match v {
        Value::Number(n) if n.is_f64() => Value::String(n.to_string()),
        Value::Array(a) => Value::Array(a.iter().map(strip_floats).collect()),
        Value::Object(o) => Value::Object(
            o.iter()
                .map(|(k, v)| (k.clone(), strip_floats(v)))
                .collect::<Map<_, _>>(),
        ),
        other => other.clone(),
    }
}

/// RFC 8785 canonical JSON: object members sorted by UTF-16 code units, no
/// insignificant whitespace, minimal string escapes, ECMAScript numbers.
/// Integers are written exactly, also past 2^53 (a u64 seed), where the
/// `serde_jcs` crate would round them through an f64; everywhere else the
/// two agree byte for byte (`jcs_cross_check`).
pub fn canonical(v: &Value) -> String {
    let mut out = String::new();
    write_value(v, &mut out);
    out
}

fn write_value(v: &Value, out: &mut String) {
    match v {
        Value::Null => out.push_str("null"),
        Value::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        Value::Number(n) => {
            if let Some(i) = n.as_i64() {
                out.push_str(&i.to_string());
            } else if let Some(u) = n.as_u64() {
                out.push_str(&u.to_string());
            } else {
                out.push_str(&es_number(n.as_f64().unwrap_or(0.0)));
            }
        }
        Value::String(s) => write_string(s, out),
        Value::Array(a) => {
            out.push('[');
            for (i, x) in a.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_value(x, out);
            }
            out.push(']');
        }
        Value::Object(o) => {
            let mut keys: Vec<&String> = o.keys().collect();
            keys.sort_by(|a, b| a.encode_utf16().cmp(b.encode_utf16()));
            out.push('{');
            for (i, k) in keys.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_string(k, out);
                out.push(':');
                write_value(&o[*k], out);
            }
            out.push('}');
        }
    }
}

fn write_string(s: &str, out: &mut String) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\u{08}' => out.push_str("\\b"),
            '\u{0C}' => out.push_str("\\f"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
}

/// ECMAScript Number::toString for finite doubles (JSON has no others).
fn es_number(x: f64) -> String {
    if x == 0.0 {
        return "0".into();
    }
    let sci = format!("{:e}", x.abs()); // shortest round-trip digits, e.g. "1.2345e-7"
    let (mant, exp) = sci.split_once('e').unwrap_or((&sci, "0"));
    let digits: String = mant.chars().filter(|c| *c != '.').collect();
    let k = digits.len() as i32;
    let n = exp.parse::<i32>().unwrap_or(0) + 1; // x = 0.d1d2.. x 10^n
    let body = if k <= n && n <= 21 {
        format!("{digits}{}", "0".repeat((n - k) as usize))
    } else if 0 < n && n <= 21 {
        format!("{}.{}", &digits[..n as usize], &digits[n as usize..])
    } else if -6 < n && n <= 0 {
        format!("0.{}{digits}", "0".repeat((-n) as usize))
    } else {
        let e = n - 1;
        let sign = if e < 0 { '-' } else { '+' };
        if k == 1 {
            format!("{digits}e{sign}{}", e.abs())
        } else {
            format!("{}.{}e{sign}{}", &digits[..1], &digits[1..], e.abs())
        }
    };
    if x < 0.0 {
        format!("-{body}")
    } else {
        body
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_follow_ecmascript() {
        for (x, want) in [
            (1e30, "1e+30"),
            (4.5, "4.5"),
            (0.002, "0.002"),
            (1e-7, "1e-7"),
            (1e21, "1e+21"),
            (1e20, "100000000000000000000"),
            (-1.5e-9, "-1.5e-9"),
            (123456.789, "123456.789"),
            (5e-324, "5e-324"),
        ] {
            assert_eq!(es_number(x), want, "{x}");
        }
    }

    #[test]
    fn canonical_sorts_keys_by_utf16_and_escapes_minimally() {
        let v: Value = serde_json::from_str(r#"{"b": [1, {"z": null, "a": true}], "a": "x\n\u0001é", "\ufb33": 3, "\u20ac": 1, "\ud83d\ude00": 2}"#).unwrap();
        // U+1F600 (surrogates D83D DE00) sorts before U+FB33 in UTF-16 order,
        // though not in code point order.
        assert_eq!(canonical(&v), "{\"a\":\"x\\n\\u0001é\",\"b\":[1,{\"a\":true,\"z\":null}],\"€\":1,\"😀\":2,\"\u{fb33}\":3}");
        let again: Value = serde_json::from_str(&canonical(&v)).unwrap();
        assert_eq!(canonical(&again), canonical(&v));
    }
}

/// `canonical` against an independent RFC 8785 implementation (the
/// `serde_jcs` crate). We keep our own writer because serde_jcs writes every
/// number through an f64, as I-JSON has it: a u64 seed above 2^53 would be
/// written as another number, and the statement would misstate its case.
#[cfg(test)]
mod jcs_cross_check {
    use super::*;

    #[test]
    fn canonical_equals_serde_jcs_wherever_jcs_can_hold_the_numbers() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
        let mut values: Vec<Value> = vec![serde_json::from_str(
            r#"{"b": [1, {"z": null, "a": true}], "a": "x\n\u0001é\u007f\u2028", "\ufb33": 3,
                "\u20ac": 1, "\ud83d\ude00": 2,
                "f": [1e20, -1.5e-9, 123456.789, 5e-324, 0.1, 1e21, 1e-7, -0.0, 9007199254740992]}"#,
        )
        .unwrap()];
        let mut files = vec![root.join("tests/data/report-cpu.json")];
        for g in std::fs::read_dir(root.join("experiments/golden")).unwrap() {
            files.push(g.unwrap().path());
        }
        for f in &files {
            values.push(serde_json::from_str(&std::fs::read_to_string(f).unwrap()).unwrap());
        }
        assert!(values.len() >= 8, "{} values", values.len());
        for v in &values {
            assert_eq!(canonical(v), serde_jcs::to_string(v).unwrap());
        }
        // Where they part: an integer past 2^53 stays exact in ours.
        let seed: Value = serde_json::from_str(r#"{"seed": 18446744073709551615}"#).unwrap();
        assert_eq!(canonical(&seed), r#"{"seed":18446744073709551615}"#);
        assert_ne!(canonical(&seed), serde_jcs::to_string(&seed).unwrap());
    }
}
