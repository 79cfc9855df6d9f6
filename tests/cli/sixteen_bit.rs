//! 16-bit cases as users judge them on the CPU oracle: `expect` compared
//! in the case's dtype (ULPs in its steps, the NaN policy on both sides),
//! and dump directories of bf16 arenas compared element by element.

use crate::common::rank_files::{self, narrow16, rank_order_sum16, Dt, T};
use crate::common::{fp, run_cpu, write};
use serde_json::Value;
use std::path::Path;

fn report(path: &Path) -> Value {
    serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap()
}

fn text(o: &std::process::Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// W = 4 bf16 rank files `bf{rank}.safetensors` of one tensor `g`,
/// order-sensitive after one rounding (rank 0 holds L, rank 2 -L, the
/// others mixed values); rank 1 holds a NaN with a payload at `NAN_AT`.
/// Returns the addends.
fn bf16_files(dir: &Path, n: usize) -> Vec<Vec<u16>> {
    let mut ranks: Vec<Vec<u16>> = (0..4)
        .map(|r| rank_files::mixed16(Dt::Bf16, 31, r, 0, n))
        .collect();
    for i in (0..n).step_by(2) {
        let l = 4096.0 * (1.0 + (i % 64) as f32 / 64.0);
        ranks[0][i] = narrow16(Dt::Bf16, l);
        ranks[2][i] = narrow16(Dt::Bf16, -l);
    }
    ranks[1][NAN_AT] = 0x7FC1;
    for (r, bits) in ranks.iter().enumerate() {
        rank_files::write_safetensors(
            &dir.join(format!("bf{r}.safetensors")),
            &[T::bf16("g", &[n], bits)],
        );
    }
    ranks
}

const NAN_AT: usize = 7;

fn expect_case(dir: &Path, expect: &str) -> std::path::PathBuf {
    write(
        dir,
        "e.toml",
        &format!(
            "name = \"e\"\n[[case]]\nid = \"c\"\naddends = \"bf{{rank}}.safetensors\"\nexpect = \"{expect}\"\n"
        ),
    )
}

/// A bf16 `expect` is compared as bf16: equal when it holds the rank-order
/// result rounded once; one and three bf16 steps off count 1 and 3 ULP
/// (not 65,536 x); NaNs of other payloads are equal under the canonical
/// policy and a difference under `preserve`; a float32 file in a bf16
/// case is refused (exit 2).
#[test]
fn a_bf16_expect_is_compared_in_bf16() {
    let dir = tempfile::tempdir().unwrap();
    let n = 501;
    let ranks = bf16_files(dir.path(), n);
    let want = rank_order_sum16(Dt::Bf16, &ranks);
    // The NaN of the result, and the file's NaN of another payload and sign.
    assert!(want[NAN_AT] & 0x7FFF > 0x7F80);
    let mut theirs = want.clone();
    theirs[NAN_AT] = 0xFFC3;
    let put = |name: &str, bits: &[u16]| {
        rank_files::write_safetensors(&dir.path().join(name), &[T::bf16("g", &[n], bits)]);
    };
    put("same.safetensors", &theirs);
    let out = dir.path().join("r.json");
    let o = run_cpu(expect_case(dir.path(), "same.safetensors"), &out);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert!(
        text(&o).contains("expect: case `c` equals same.safetensors bit for bit"),
        "{}",
        text(&o)
    );
    assert_eq!(report(&out)["cases"][0]["expect"]["equal"], true);

    // Under `preserve` the NaNs' payloads differ: one element, no ULPs.
    let o = fp()
        .args([
            "run",
            "--backend",
            "cpu",
            "--nan-policy",
            "preserve",
            "--out",
        ])
        .arg(&out)
        .arg(expect_case(dir.path(), "same.safetensors"))
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    let e = &report(&out)["cases"][0]["expect"]["arenas"][0];
    assert_eq!(e["differing"], 1, "{e}");
    assert_eq!(e["max_ulp"], Value::Null, "{e}");
    assert_eq!(e["first"][0]["index"], NAN_AT);
    assert_eq!(e["first"][0]["right"], 0xFFC3);
    assert_eq!(e["first"][0]["ulp"], Value::Null);

    // Negative control: one element one bf16 step off, another three.
    let (i, j) = (10, 41);
    assert!(want[i] & 0x7F80 != 0x7F80 && want[j] & 0x7F80 != 0x7F80);
    let mut off = theirs.clone();
    off[i] += 1;
    off[j] -= 3;
    put("off.safetensors", &off);
    let o = run_cpu(expect_case(dir.path(), "off.safetensors"), &out);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(
        text(&o).contains("differs from off.safetensors: 2 element(s), up to 3 ULP of bf16"),
        "{}",
        text(&o)
    );
    let e = &report(&out)["cases"][0]["expect"]["arenas"][0];
    assert_eq!(e["differing"], 2, "{e}");
    assert_eq!(e["max_ulp"], 3, "{e}");
    let first = |k: usize| {
        let d = &e["first"][k];
        (
            d["index"].as_u64().unwrap() as usize,
            d["left"].as_u64().unwrap() as u16,
            d["right"].as_u64().unwrap() as u16,
            d["ulp"].as_u64(),
        )
    };
    // Steps within one binade of a positive or negative value: the
    // distance is the step count whatever the sign.
    assert_eq!(first(0), (i, want[i], off[i], Some(1)));
    assert_eq!(first(1), (j, want[j], off[j], Some(3)));
    assert!(report(&out)["summary"]["differs_from_expect"][0]
        .as_str()
        .unwrap()
        .contains("up to 3 ULP of bf16"));

    // A float32 expect (the same values widened) in a bf16 case: refused.
    let wide: Vec<f32> = theirs
        .iter()
        .map(|&h| rank_files::widen16(Dt::Bf16, h))
        .collect();
    rank_files::write_safetensors(
        &dir.path().join("wide.safetensors"),
        &[T::f32("g", &[n], &wide)],
    );
    let _ = std::fs::remove_file(&out);
    let o = run_cpu(expect_case(dir.path(), "wide.safetensors"), &out);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(
        text(&o).contains("e.toml:5:10: case `c`: field `expect`: wide.safetensors: tensor `g` is f32, but the case reduces in bf16"),
        "{}",
        text(&o)
    );
    assert!(!out.exists());
}

/// The bf16 report of a case that differs from its expect is checked where
/// it is read: as written it compares with itself; a distance counted in
/// float32 steps, bits wider than bf16, or a dtype edited are refused.
#[test]
fn a_bf16_report_is_checked_in_bf16_where_it_is_read() {
    let dir = tempfile::tempdir().unwrap();
    let n = 300;
    let ranks = bf16_files(dir.path(), n);
    let mut off = rank_order_sum16(Dt::Bf16, &ranks);
    off[12] += 1;
    rank_files::write_safetensors(
        &dir.path().join("off.safetensors"),
        &[T::bf16("g", &[n], &off)],
    );
    let out = dir.path().join("r.json");
    let o = run_cpu(expect_case(dir.path(), "off.safetensors"), &out);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    let honest = report(&out);
    fp().arg("compare").arg(&out).arg(&out).assert().success();
    type Edit = Box<dyn Fn(&mut Value)>;
    let edits: [(&str, Edit, &str); 5] = [
        (
            "a distance in float32 steps",
            Box::new(|v: &mut Value| {
                v["cases"][0]["expect"]["arenas"][0]["first"][0]["ulp"] = 65536.into();
                v["cases"][0]["expect"]["arenas"][0]["max_ulp"] = 65536.into();
            }),
            "ULP distance 65536 but 0x",
        ),
        (
            "bits wider than bf16",
            Box::new(|v: &mut Value| {
                let left = v["cases"][0]["expect"]["arenas"][0]["first"][0]["left"]
                    .as_u64()
                    .unwrap();
                v["cases"][0]["expect"]["arenas"][0]["first"][0]["left"] = (left << 16).into();
            }),
            "are not both bf16 bits",
        ),
        (
            "dtype f32 written out",
            Box::new(|v: &mut Value| v["cases"][0]["params"]["dtype"] = "f32".into()),
            "params.dtype is \"f32\", which a run writes by leaving `dtype` out",
        ),
        (
            "dtype f16 over bf16 files",
            Box::new(|v: &mut Value| v["cases"][0]["params"]["dtype"] = "f16".into()),
            "params.dtype is f16, but params.addends.arenas names `g` of bf16",
        ),
        (
            "a chunk count",
            Box::new(|v: &mut Value| {
                v["cases"][0]["arenas"][0]["chunk_elems"] = 32768.into();
            }),
            "chunk_elems 32768, but the format's chunks are 65536 elements",
        ),
    ];
    for (what, edit, wanted) in edits {
        let mut v = honest.clone();
        edit(&mut v);
        let bad = dir.path().join("bad.json");
        std::fs::write(&bad, serde_json::to_string_pretty(&v).unwrap()).unwrap();
        let o = fp().arg("compare").arg(&out).arg(&bad).output().unwrap();
        assert_eq!(o.status.code(), Some(2), "{what}: {}", text(&o));
        assert!(
            text(&o).contains(wanted),
            "{what}: wanted `{wanted}` in {}",
            text(&o)
        );
    }
}

/// A generated bf16 sweep whose arrival-order cases' sensitivity is
/// recomputed from the generator where the report is read: in the dtype,
/// so the honest report passes and a count off by one is refused.
#[test]
fn a_generated_bf16_report_has_its_sensitivity_recomputed_in_bf16() {
    let dir = tempfile::tempdir().unwrap();
    let exp = write(
        dir.path(),
        "g.toml",
        "name = \"g\"\n[defaults]\nworld = 9\narenas = [3001]\nseed = 3\ndtype = \"bf16\"\n\
         distribution = \"subnormal-heavy\"\n\
         [[sweep]]\nid = \"a\"\ncontract = [\"arrival-order\"]\norder = [\"ascending\", \"descending\"]\n",
    );
    let out = dir.path().join("r.json");
    let o = run_cpu(&exp, &out);
    let honest = report(&out);
    assert_eq!(
        honest["cases"][0]["params"]["dtype"],
        "bf16",
        "{}",
        text(&o)
    );
    fp().arg("compare").arg(&out).arg(&out).assert().success();
    let s = &honest["cases"][0]["sensitivity"];
    let (changed, checked) = (
        s["changed"].as_u64().unwrap(),
        s["checked"].as_u64().unwrap(),
    );
    assert_eq!(checked, 3001);
    // One more changed element, with its fraction and verdict made to agree.
    let forged = changed + 1;
    let mut v = honest.clone();
    let s = &mut v["cases"][0]["sensitivity"];
    s["changed"] = forged.into();
    s["fraction"] = (forged as f64 / checked as f64).into();
    s["verdict"] = if (forged as f64 / checked as f64) < 0.01 {
        "weak"
    } else {
        "sensitive"
    }
    .into();
    let bad = dir.path().join("bad.json");
    std::fs::write(&bad, serde_json::to_string_pretty(&v).unwrap()).unwrap();
    let o = fp().arg("compare").arg(&out).arg(&bad).output().unwrap();
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(
        text(&o).contains(&format!(
            "sensitivity says {forged} of 3001 elements change with the order; the generator gives {changed} of 3001"
        )),
        "{}",
        text(&o)
    );
}

/// The bf16 values of a dump file.
fn dumped16(path: &Path) -> Vec<u16> {
    std::fs::read(path)
        .unwrap()
        .chunks_exact(2)
        .map(|b| u16::from_le_bytes([b[0], b[1]]))
        .collect()
}

/// Position on bf16's number line (-0 and +0 both 0), written here.
fn ordinal16(h: u16) -> i64 {
    let m = i64::from(h & 0x7FFF);
    if h & 0x8000 != 0 {
        -m
    } else {
        m
    }
}

/// Two runs of a bf16 case that fold in other orders: their dumps hold
/// bf16 bytes, the manifest says so, and `compare` of the two directories
/// names each differing element, both bf16 values and the distance in bf16
/// steps, as computed here from the files. A manifest without `dtypes`
/// reads as float32; one with an unknown dtype is refused.
#[test]
fn compare_localizes_differences_in_bf16_dumps() {
    let dir = tempfile::tempdir().unwrap();
    // Even: the same bytes read as float32 (an old manifest) are whole.
    let n = 4000;
    bf16_files(dir.path(), n);
    let exp = |contract: &str| {
        write(
            dir.path(),
            "d.toml",
            &format!(
                "name = \"d\"\n[[case]]\nid = \"c\"\naddends = \"bf{{rank}}.safetensors\"\n\
                 contract = \"{contract}\"\norder = \"descending\"\n"
            ),
        )
    };
    let run = |name: &str, contract: &str| {
        let d = dir.path().join(name);
        let o = fp()
            .args(["run", "--backend", "cpu", "--dump"])
            .arg(&d)
            .arg(exp(contract))
            .output()
            .unwrap();
        assert_eq!(o.status.code(), Some(0), "{}", text(&o));
        d
    };
    let (a, a2, b) = (
        run("a", "fixed-order"),
        run("a2", "fixed-order"),
        run("b", "arrival-order"),
    );
    let file = "d.c.a0.bin";
    assert_eq!(std::fs::metadata(a.join(file)).unwrap().len(), 2 * n as u64);
    let manifest: Value =
        serde_json::from_slice(&std::fs::read(a.join("FOLDPRINT-DUMP.json")).unwrap()).unwrap();
    assert_eq!(manifest["dtypes"][file], "bf16", "{manifest}");
    // Control: the same fold twice is identical.
    let o = fp().arg("compare").arg(&a).arg(&a2).output().unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert!(text(&o).contains("ok: dumps are identical"), "{}", text(&o));

    let (va, vb) = (dumped16(&a.join(file)), dumped16(&b.join(file)));
    let diffs: Vec<(usize, u16, u16, i64)> = va
        .iter()
        .zip(&vb)
        .enumerate()
        .filter(|(_, (x, y))| x != y)
        .map(|(i, (&x, &y))| (i, x, y, (ordinal16(x) - ordinal16(y)).abs()))
        .collect();
    assert!(!diffs.is_empty(), "the two folds must differ on this data");
    let o = fp()
        .args(["compare", "--json"])
        .arg(&a)
        .arg(&b)
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    let d = &v["comparisons"][0]["differing"][0];
    assert_eq!(d["name"], file);
    assert_eq!(d["dtype"], "bf16", "{d}");
    assert_eq!(d["differing"], diffs.len(), "{d}");
    let nan = |h: u16| h & 0x7FFF > 0x7F80;
    let max = diffs
        .iter()
        .filter(|x| !nan(x.1) && !nan(x.2))
        .map(|x| x.3)
        .max();
    assert_eq!(d["max_ulp"].as_i64(), max, "{d}");
    for (k, want) in diffs.iter().take(10).enumerate() {
        let e = &d["first"][k];
        assert_eq!(e["index"], want.0, "{e}");
        assert_eq!(e["left"], want.1, "{e}");
        assert_eq!(e["right"], want.2, "{e}");
        assert_eq!(e["ulp"].as_i64(), Some(want.3), "{e}");
    }
    // The table shows the bf16 bits and their values.
    let o = fp().arg("compare").arg(&a).arg(&b).output().unwrap();
    let t = text(&o);
    assert!(
        t.contains(&format!(
            "DIFFER {file} (bf16): {} of {n} elements differ",
            diffs.len()
        )),
        "{t}"
    );
    let (i, x, y, u) = diffs[0];
    let value = |h: u16| format!("{:e}", rank_files::widen16(Dt::Bf16, h));
    let line = t
        .lines()
        .find(|l| l.split_whitespace().next() == Some(&i.to_string()))
        .unwrap_or_else(|| panic!("no line for element {i}: {t}"));
    assert_eq!(
        line.split_whitespace().collect::<Vec<_>>(),
        [
            i.to_string(),
            format!("0x{x:04x}"),
            value(x),
            format!("0x{y:04x}"),
            value(y),
            u.to_string()
        ],
        "{t}"
    );

    // A manifest written before the dtypes: its files read as float32, so
    // the two sides hold other element types and are not compared.
    let old = serde_json::json!({"format": "foldprint-dump", "version": 1, "tool": "foldprint 0.1.0", "sums": "SHA256SUMS"});
    std::fs::write(b.join("FOLDPRINT-DUMP.json"), old.to_string()).unwrap();
    let o = fp().arg("compare").arg(&a).arg(&b).output().unwrap();
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(
        text(&o).contains(&format!(
            "DIFFER {file}: bf16 on the left, f32 on the right ({n} / {} elements)",
            n / 2
        )),
        "{}",
        text(&o)
    );
    // An element type foldprint does not write: refused, naming the file.
    let mut bad = manifest.clone();
    bad["dtypes"][file] = "f64".into();
    std::fs::write(b.join("FOLDPRINT-DUMP.json"), bad.to_string()).unwrap();
    let o = fp().arg("compare").arg(&a).arg(&b).output().unwrap();
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(
        text(&o).contains("FOLDPRINT-DUMP.json: dtypes.d.c.a0.bin is \"f64\""),
        "{}",
        text(&o)
    );
}

/// A run of f32 and bf16 cases: the manifest lists only the bf16 files;
/// a run of f32 cases alone writes the manifest it wrote before.
#[test]
fn the_manifest_names_only_16_bit_files() {
    let dir = tempfile::tempdir().unwrap();
    let exp = write(
        dir.path(),
        "m.toml",
        "name = \"m\"\n[defaults]\nworld = 3\narenas = [5]\n[[case]]\nid = \"f\"\n[[case]]\nid = \"h\"\ndtype = \"f16\"\n",
    );
    let d = dir.path().join("d");
    fp().args(["run", "--backend", "cpu", "--dump"])
        .arg(&d)
        .arg(&exp)
        .assert()
        .success();
    let m: Value =
        serde_json::from_slice(&std::fs::read(d.join("FOLDPRINT-DUMP.json")).unwrap()).unwrap();
    assert_eq!(m["dtypes"], serde_json::json!({"m.h.a0.bin": "f16"}), "{m}");
    assert_eq!(std::fs::metadata(d.join("m.h.a0.bin")).unwrap().len(), 10);
    assert_eq!(std::fs::metadata(d.join("m.f.a0.bin")).unwrap().len(), 20);
    let exp = write(
        dir.path(),
        "m.toml",
        "name = \"m\"\n[defaults]\nworld = 3\narenas = [5]\n[[case]]\nid = \"f\"\n",
    );
    fp().args(["run", "--backend", "cpu", "--dump"])
        .arg(&d)
        .arg(&exp)
        .assert()
        .success();
    let text = std::fs::read_to_string(d.join("FOLDPRINT-DUMP.json")).unwrap();
    assert_eq!(
        text,
        format!(
            "{{\n  \"format\": \"foldprint-dump\",\n  \"version\": 1,\n  \"tool\": \"foldprint {}\",\n  \"sums\": \"SHA256SUMS\"\n}}\n",
            env!("CARGO_PKG_VERSION")
        )
    );
}
