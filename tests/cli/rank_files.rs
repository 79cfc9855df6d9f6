//! Addends from rank files (`addends = "rank{rank}.safetensors"`) and a
//! framework's result to compare with (`expect`), as users run them on the
//! CPU oracle: the values reduced are the files' values, bit for bit; the
//! inputs identify the case; every bad file is refused by name.

use crate::common::rank_files::{self, T};
use crate::common::{fp, run_cpu, write};
use serde_json::Value;
use sha2::Digest;
use std::path::Path;

fn report(path: &Path) -> Value {
    serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap()
}

/// The f32 values of a dump file.
fn dumped(path: &Path) -> Vec<u32> {
    std::fs::read(path)
        .unwrap()
        .chunks_exact(4)
        .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect()
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

const GRADS: &str = r#"
name = "grads"
[[sweep]]
id = "g"
addends = "rank{rank}.safetensors"
expect = "expected.safetensors"
contract = ["fixed-order", "pairwise-tree"]
"#;

#[test]
fn rank_files_reduce_to_their_rank_order_sum_and_expect_tells_which_contract_matches() {
    let dir = tempfile::tempdir().unwrap();
    let addends = rank_files::grads(dir.path(), 4, 1000);
    let exp = write(dir.path(), "grads.toml", GRADS);
    let out = dir.path().join("r.json");
    let dump = dir.path().join("dump");
    let o = fp()
        .args(["run", "--backend", "cpu", "--dump"])
        .arg(&dump)
        .arg("--out")
        .arg(&out)
        .arg(&exp)
        .output()
        .unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr),
    );
    // The pairwise tree is not the rank-order sum: exit 1, its row DIFF.
    assert_eq!(o.status.code(), Some(1), "{stdout}{stderr}");
    assert!(
        stdout.contains("expect: case `g[fixed-order]` equals expected.safetensors bit for bit"),
        "{stdout}"
    );
    assert!(stdout.contains("  DIFF g[pairwise-tree]"), "{stdout}");
    let r = report(&out);
    assert_eq!(r["summary"]["ok"], true, "the run's own checks held");
    let cases = r["cases"].as_array().unwrap();
    let fixed = &cases[0];
    assert_eq!(fixed["params"]["contract"], "fixed-order");
    assert_eq!(fixed["expect"]["equal"], true);
    // Negative control: the same files, another fold, found different.
    let tree = &cases[1];
    assert_eq!(tree["expect"]["equal"], false);
    let differing: u64 = tree["expect"]["arenas"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["differing"].as_u64().unwrap())
        .sum();
    assert!(differing > 0, "{}", tree["expect"]);
    assert_eq!(
        r["summary"]["differs_from_expect"]
            .as_array()
            .unwrap()
            .len(),
        1
    );
    // The values reduced are the files' values: the dump is the rank-order
    // sum computed here, bit for bit, for both tensors (name order: b, w).
    for (a, tensor) in addends.iter().enumerate() {
        let name = format!("grads.g_fixed-order_.a{a}.bin");
        let got = dumped(&dump.join(&name));
        assert_eq!(got, bits(&rank_files::rank_order_sum(tensor)), "{name}");
    }
    // The report names each file as written and its SHA-256, and no seed.
    let p = &fixed["params"];
    assert!(
        p.get("seed").is_none() && p.get("distribution").is_none(),
        "{p}"
    );
    assert_eq!(p["world"], 4);
    assert_eq!(p["arenas"], serde_json::json!([7, 3000]));
    let files = p["addends"]["files"].as_array().unwrap();
    for (rank, f) in files.iter().enumerate() {
        let name = format!("rank{rank}.safetensors");
        assert_eq!(f["path"], name.as_str());
        let bytes = std::fs::read(dir.path().join(&name)).unwrap();
        assert_eq!(f["sha256"], hex::encode(sha2::Sha256::digest(&bytes)));
        assert_eq!(f["bytes"], bytes.len());
    }
    assert_eq!(p["addends"]["arenas"][1]["name"], "w");
    assert_eq!(
        p["addends"]["arenas"][1]["shape"],
        serde_json::json!([3, 1000])
    );
    assert_eq!(fixed["sensitivity"]["verdict"], "sensitive");
    assert!(fixed["key"]
        .as_str()
        .unwrap()
        .starts_with("fixed-order/sum/W4/n7+3000/files:"));
}

/// f16 bits widened to f32 by their definition (sign, exponent, fraction).
fn f16_value(h: u16) -> f32 {
    let sign = if h & 0x8000 != 0 { -1.0f32 } else { 1.0 };
    let exp = ((h >> 10) & 0x1f) as i32;
    let frac = (h & 0x3ff) as f32;
    match exp {
        0 => sign * frac * (2.0f32).powi(-24),
        31 => panic!("no inf or NaN in these tests"),
        e => sign * (1.0 + frac / 1024.0) * (2.0f32).powi(e - 15),
    }
}

/// `dtype = "f32"` keeps the widening: 16-bit tensors (here of two types
/// in one file) are reduced in float32 and the result stays float32.
#[test]
fn sixteen_bit_and_npy_files_are_widened_exactly() {
    let dir = tempfile::tempdir().unwrap();
    let n = 4099;
    // Finite 16-bit patterns of every exponent (all-ones exponents skipped).
    let pattern = |r: usize, k: u16| -> Vec<u16> {
        (0..n as u32)
            .map(|i| {
                let b = (i.wrapping_mul(2654435761).wrapping_add(r as u32 * 977) >> 7) as u16 ^ k;
                b & !0x4000 // exponent never all ones
            })
            .collect()
    };
    let (mut bf, mut hf, mut f4) = (Vec::new(), Vec::new(), Vec::new());
    for r in 0..3 {
        let b = pattern(r, 0x1234);
        let h = pattern(r, 0x0badu16);
        write_st(
            dir.path(),
            r,
            &[T::bf16("a", &[n], &b), T::f16("b", &[n], &h)],
        );
        bf.push(
            b.iter()
                .map(|&x| f32::from_bits(u32::from(x) << 16))
                .collect::<Vec<f32>>(),
        );
        hf.push(h.iter().map(|&x| f16_value(x)).collect::<Vec<f32>>());
        // npy: little-endian on ranks 0 and 2, big-endian on rank 1.
        let v = rank_files::mixed(3, r, 0, n);
        let raw: Vec<u8> = if r == 1 {
            v.iter().flat_map(|x| x.to_be_bytes()).collect()
        } else {
            v.iter().flat_map(|x| x.to_le_bytes()).collect()
        };
        let descr = if r == 1 { ">f4" } else { "<f4" };
        rank_files::write_npy(&dir.path().join(format!("np{r}.npy")), descr, &[n], &raw);
        f4.push(v);
    }
    let exp = write(
        dir.path(),
        "w.toml",
        "name = \"w\"\n[[case]]\nid = \"st\"\naddends = \"rank{rank}.safetensors\"\ndtype = \"f32\"\n\
         [[case]]\nid = \"np\"\naddends = \"np{rank}.npy\"\n",
    );
    let dump = dir.path().join("d");
    fp().args(["run", "--backend", "cpu", "--dump"])
        .arg(&dump)
        .arg(&exp)
        .assert()
        .success();
    let want = [
        ("w.st.a0.bin", rank_files::rank_order_sum(&bf)),
        ("w.st.a1.bin", rank_files::rank_order_sum(&hf)),
        ("w.np.a0.bin", rank_files::rank_order_sum(&f4)),
    ];
    for (name, sum) in want {
        assert_eq!(dumped(&dump.join(name)), bits(&sum), "{name}");
    }
}

/// Without `dtype`, 16-bit files are a case of their dtype: the float32
/// rank-order sum of their values, rounded once to the dtype (the `half`
/// crate's nearest-even), dumped and hashed as 2-byte elements, keyed
/// `/bf16` or `/f16`. `dtype = "f32"` widens them; an f32 tensor in a bf16
/// case and files of two dtypes without a declaration are refused.
#[test]
fn sixteen_bit_files_reduce_in_their_dtype_unless_the_case_says_f32() {
    let dir = tempfile::tempdir().unwrap();
    let n = 1001;
    let (mut bf, mut hf) = (Vec::new(), Vec::new());
    for r in 0..3 {
        let v = rank_files::mixed(7, r, 0, n);
        let b: Vec<u16> = v
            .iter()
            .map(|&x| half::bf16::from_f32(x).to_bits())
            .collect();
        let h: Vec<u16> = v
            .iter()
            .map(|&x| half::f16::from_f32(x).to_bits())
            .collect();
        write_st(
            dir.path(),
            r,
            &[
                T::bf16("a", &[n], &b),
                T::f16("b", &[n], &h),
                T::f32("c", &[n], &v),
            ],
        );
        bf.push(
            b.iter()
                .map(|&x| half::bf16::from_bits(x).to_f32())
                .collect::<Vec<f32>>(),
        );
        hf.push(
            h.iter()
                .map(|&x| half::f16::from_bits(x).to_f32())
                .collect::<Vec<f32>>(),
        );
    }
    let exp = write(
        dir.path(),
        "d.toml",
        "name = \"d\"\n[[case]]\nid = \"bf\"\naddends = \"rank{rank}.safetensors\"\ntensors = [\"a\"]\n\
         [[case]]\nid = \"hf\"\naddends = \"rank{rank}.safetensors\"\ntensors = [\"b\"]\n\
         [[case]]\nid = \"wide\"\naddends = \"rank{rank}.safetensors\"\ntensors = [\"a\"]\ndtype = \"f32\"\n",
    );
    let dump = dir.path().join("dump");
    let out = dir.path().join("r.json");
    fp().args(["run", "--backend", "cpu", "--dump"])
        .arg(&dump)
        .arg("--out")
        .arg(&out)
        .arg(&exp)
        .assert()
        .success();
    let two_bytes = |name: &str| -> Vec<u16> {
        std::fs::read(dump.join(name))
            .unwrap()
            .chunks_exact(2)
            .map(|b| u16::from_le_bytes([b[0], b[1]]))
            .collect()
    };
    let sum_bf = rank_files::rank_order_sum(&bf);
    let sum_hf = rank_files::rank_order_sum(&hf);
    let want_bf: Vec<u16> = sum_bf
        .iter()
        .map(|&x| half::bf16::from_f32(x).to_bits())
        .collect();
    let want_hf: Vec<u16> = sum_hf
        .iter()
        .map(|&x| half::f16::from_f32(x).to_bits())
        .collect();
    assert_eq!(two_bytes("d.bf.a0.bin"), want_bf);
    assert_eq!(two_bytes("d.hf.a0.bin"), want_hf);
    assert_eq!(dumped(&dump.join("d.wide.a0.bin")), bits(&sum_bf));
    // Control: the rounding is seen (a float32 sum is not a bf16 value).
    assert!(sum_bf
        .iter()
        .any(|x| half::bf16::from_f32(*x).to_f32() != *x));
    let r = report(&out);
    let keys: Vec<&str> = r["cases"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["key"].as_str().unwrap())
        .collect();
    assert!(
        keys[0].starts_with("fixed-order/sum/W3/n1001/bf16/files:"),
        "{}",
        keys[0]
    );
    assert!(
        keys[1].starts_with("fixed-order/sum/W3/n1001/f16/files:"),
        "{}",
        keys[1]
    );
    assert!(
        keys[2].starts_with("fixed-order/sum/W3/n1001/files:"),
        "{}",
        keys[2]
    );
    assert_eq!(r["cases"][0]["params"]["dtype"], "bf16");
    assert!(r["cases"][2]["params"].get("dtype").is_none());

    // Refused, never rounded: exit 2 naming the case, the field and the tensor.
    for (case, want) in [
        (
            "tensors = [\"c\"]\ndtype = \"bf16\"\n",
            "case `x`: field `dtype`: bf16, but tensor `c` of rank0.safetensors is f32: foldprint never rounds an addend (set dtype = \"f32\" to reduce in float32)",
        ),
        (
            "tensors = [\"a\", \"b\"]\n",
            "case `x`: field `dtype`: not set, and the tensors of rank0.safetensors mix dtypes (`a` is bf16, `b` is f16)",
        ),
    ] {
        let bad = write(
            dir.path(),
            "bad.toml",
            &format!("name = \"bad\"\n[[case]]\nid = \"x\"\naddends = \"rank{{rank}}.safetensors\"\n{case}"),
        );
        let o = fp().args(["run", "--backend", "cpu"]).arg(&bad).assert().code(2);
        let err = String::from_utf8_lossy(&o.get_output().stderr).to_string();
        assert!(err.contains("bad.toml:") && err.contains(want), "{err}");
    }
}

fn write_st(dir: &Path, rank: usize, tensors: &[T]) {
    rank_files::write_safetensors(&dir.join(format!("rank{rank}.safetensors")), tensors);
}

#[test]
fn the_inputs_identify_the_case_wherever_the_files_are() {
    let run = |dir: &Path| -> (std::path::PathBuf, Value) {
        let exp = write(dir, "grads.toml", GRADS);
        let out = dir.join("r.json");
        fp().args(["run", "--backend", "cpu", "--out"])
            .arg(&out)
            .arg(&exp)
            .assert()
            .code(1); // the pairwise tree differs from expect
        let r = report(&out);
        (out, r)
    };
    let (a, b, c) = (
        tempfile::tempdir().unwrap(),
        tempfile::tempdir().unwrap(),
        tempfile::tempdir().unwrap(),
    );
    // W = 4: at W = 3 the pairwise tree is the rank-order sum.
    rank_files::grads(a.path(), 4, 100);
    rank_files::grads(b.path(), 4, 100);
    let (ra, ja) = run(a.path());
    let (rb, jb) = run(b.path());
    // Other directory, same bytes: same keys, and the reports compare.
    assert_eq!(ja["cases"][0]["key"], jb["cases"][0]["key"]);
    fp().arg("compare").arg(&ra).arg(&rb).assert().success();
    // One element of rank 2 changed: another key, and nothing to compare.
    rank_files::grads(c.path(), 4, 100);
    let mut v = rank_files::mixed(11, 2, 1, 300);
    v[17] = -v[17];
    let vb = rank_files::mixed(11, 2, 0, 7);
    write_st(
        c.path(),
        2,
        &[T::f32("w", &[3, 100], &v), T::f32("b", &[7], &vb)],
    );
    let exp = write(
        c.path(),
        "grads.toml",
        &GRADS.replace("expect = \"expected.safetensors\"\n", ""),
    );
    let rc = c.path().join("r.json");
    fp().args(["run", "--backend", "cpu", "--out"])
        .arg(&rc)
        .arg(&exp)
        .assert()
        .success();
    assert_ne!(report(&rc)["cases"][0]["key"], ja["cases"][0]["key"]);
    let o = fp().arg("compare").arg(&ra).arg(&rc).output().unwrap();
    assert_eq!(o.status.code(), Some(1));
}

/// Every way a rank file can be wrong: exit 2, a message naming the file
/// (and the tensor where one is at fault), nothing written.
#[test]
fn bad_rank_files_are_refused_by_name_and_nothing_is_written() {
    type Setup = Box<dyn Fn(&Path)>;
    const N: usize = 50;
    let n = N;
    fn good(dir: &Path) {
        rank_files::grads(dir, 3, N);
    }
    fn rank_file(dir: &Path, r: usize) -> std::path::PathBuf {
        dir.join(format!("rank{r}.safetensors"))
    }
    // Control: the good files run.
    let dir = tempfile::tempdir().unwrap();
    good(dir.path());
    let exp = write(
        dir.path(),
        "e.toml",
        "name = \"e\"\n[[case]]\nid = \"c\"\naddends = \"rank{rank}.safetensors\"\n",
    );
    fp().args(["run", "--backend", "cpu"])
        .arg(&exp)
        .assert()
        .success();
    let cases: Vec<(&str, &str, Setup, &[&str])> = vec![
        (
            "missing rank file, W set",
            "world = 4\n",
            Box::new(good),
            &["rank3.safetensors: not found: W = 4 needs a file for each of ranks 0 ..= 3"],
        ),
        (
            "a gap in the rank files",
            "",
            Box::new(move |d: &Path| {
                good(d);
                std::fs::rename(rank_file(d, 2), rank_file(d, 4)).unwrap();
            }),
            &["rank2.safetensors: rank4.safetensors exists but rank 2's file is missing"],
        ),
        (
            "a dtype that differs between ranks",
            "",
            Box::new(move |d: &Path| {
                good(d);
                let w = rank_files::mixed(11, 1, 1, 3 * n);
                write_st(d, 1, &[T::f32("w", &[3, n], &w), T::bf16("b", &[7], &[0; 7])]);
            }),
            &["rank1.safetensors: tensor `b` is bf16[7] here but f32[7] in rank0.safetensors"],
        ),
        (
            "a shape that differs between ranks",
            "",
            Box::new(move |d: &Path| {
                good(d);
                let w = rank_files::mixed(11, 2, 1, 2 * n);
                write_st(d, 2, &[T::f32("w", &[2, n], &w), T::f32("b", &[7], &[0.0; 7])]);
            }),
            &["rank2.safetensors: tensor `w` is f32[2, 50] here but f32[3, 50] in rank0.safetensors"],
        ),
        (
            "a tensor one rank lacks",
            "",
            Box::new(move |d: &Path| {
                good(d);
                write_st(d, 1, &[T::f32("b", &[7], &[0.0; 7])]);
            }),
            &["rank1.safetensors: lacks tensor `w`, which rank0.safetensors has"],
        ),
        (
            "a truncated file",
            "",
            Box::new(move |d: &Path| {
                good(d);
                let b = std::fs::read(rank_file(d, 2)).unwrap();
                std::fs::write(rank_file(d, 2), &b[..b.len() - 5]).unwrap();
            }),
            &["rank2.safetensors: not a valid safetensors file: its length does not match"],
        ),
        (
            "an empty file",
            "",
            Box::new(move |d: &Path| {
                good(d);
                std::fs::write(rank_file(d, 0), b"").unwrap();
            }),
            &["rank0.safetensors: truncated: 0 bytes"],
        ),
        (
            "a corrupt header",
            "",
            Box::new(move |d: &Path| {
                good(d);
                let mut b = std::fs::read(rank_file(d, 1)).unwrap();
                b[8..16].copy_from_slice(b"garbage!");
                std::fs::write(rank_file(d, 1), b).unwrap();
            }),
            &["rank1.safetensors: not a valid safetensors file"],
        ),
        (
            "a directory where a rank file should be",
            "",
            Box::new(move |d: &Path| {
                good(d);
                std::fs::remove_file(rank_file(d, 1)).unwrap();
                std::fs::create_dir(rank_file(d, 1)).unwrap();
            }),
            &["rank1.safetensors: it is a directory; foldprint reads only regular files"],
        ),
        (
            "an element type foldprint does not read",
            "",
            Box::new(move |d: &Path| {
                good(d);
                let b = rank_files::safetensors_bytes(&[T::f32("b", &[7], &[0.0; 7])])
                    .into_iter()
                    .collect::<Vec<u8>>();
                let text = String::from_utf8_lossy(&b).replace("\"F32\"", "\"I32\"");
                std::fs::write(rank_file(d, 0), text.as_bytes()).unwrap();
            }),
            &["rank0.safetensors: tensor `b` is I32; foldprint reads F32, BF16 and F16"],
        ),
    ];
    for (what, extra, setup, wanted) in cases {
        let dir = tempfile::tempdir().unwrap();
        setup(dir.path());
        let exp = write(
            dir.path(),
            "e.toml",
            &format!("name = \"e\"\n[[case]]\nid = \"c\"\naddends = \"rank{{rank}}.safetensors\"\n{extra}"),
        );
        let out = dir.path().join("r.json");
        let o = run_cpu(&exp, &out);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{what}: {err}");
        assert!(
            err.contains("e.toml:4:11: case `c`: field `addends`: "),
            "{what}: {err}"
        );
        for w in wanted {
            assert!(err.contains(w), "{what}: wanted `{w}` in: {err}");
        }
        assert!(!err.contains("panicked"), "{what}: {err}");
        assert!(!out.exists(), "{what}: nothing may be written");
    }
}

/// What the experiment says beside `addends` is checked too.
#[test]
fn fields_that_do_not_go_with_rank_files_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    rank_files::grads(dir.path(), 3, 10);
    rank_files::write_npy(&dir.path().join("np0.npy"), "<i4", &[2], &[0; 8]);
    rank_files::write_npy(&dir.path().join("f0.npy"), "<f4", &[3], &[0; 8]);
    let bad_expect_len = rank_files::safetensors_bytes(&[
        T::f32("b", &[6], &[0.0; 6]),
        T::f32("w", &[3, 10], &[0.0; 30]),
    ]);
    std::fs::write(dir.path().join("short.safetensors"), bad_expect_len).unwrap();
    let half = rank_files::safetensors_bytes(&[
        T::bf16("b", &[7], &[0; 7]),
        T::f32("w", &[3, 10], &[0.0; 30]),
    ]);
    std::fs::write(dir.path().join("half.safetensors"), half).unwrap();
    let cases: [(&str, &str); 12] = [
        ("arenas = [4]", "field `arenas`: the addends come from the rank files (`addends`), which set the arenas; leave `arenas` out"),
        ("seed = 3", "field `seed`: the addends come from the rank files"),
        ("distribution = \"uniform\"", "field `distribution`: the addends come from the rank files"),
        ("tensors = [\"nope\"]", "rank0.safetensors: has no tensor `nope` (it has `b`, `w`)"),
        ("tensors = []", "`tensors` is empty"),
        ("expect = \"short.safetensors\"", "short.safetensors: tensor `b` has 6 elements, the arena 7"),
        ("expect = \"half.safetensors\"", "half.safetensors: tensor `b` is bf16, but the case reduces in f32: a reduced result is compared in the case's dtype, bit for bit"),
        ("expect = \"none.safetensors\"", "none.safetensors: not found"),
        ("addends = \"rank.safetensors\"", "rank.safetensors: needs `{rank}` where the rank number goes"),
        ("addends = \"rank{rank}.pt\"", "rank{rank}.pt: name files `.safetensors` or `.npy`"),
        ("addends = \"np{rank}.npy\"", "np0.npy: holds `<i4` elements; foldprint reads float32"),
        ("addends = \"f{rank}.npy\"", "f0.npy: truncated: its header declares 3 elements (140 bytes in all), the file has 136 bytes"),
    ];
    for (line, wanted) in cases {
        let text = if line.starts_with("addends") {
            format!("name = \"e\"\n[[case]]\nid = \"c\"\n{line}\n")
        } else {
            format!("name = \"e\"\n[[case]]\nid = \"c\"\naddends = \"rank{{rank}}.safetensors\"\n{line}\n")
        };
        let exp = write(dir.path(), "e.toml", &text);
        let o = fp()
            .args(["run", "--backend", "cpu"])
            .arg(&exp)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{line}: {err}");
        assert!(err.contains(wanted), "{line}: wanted `{wanted}` in: {err}");
    }
    // Without rank files, `tensors` and `expect` mean nothing.
    for line in ["tensors = [\"b\"]", "expect = \"expected.safetensors\""] {
        let exp = write(
            dir.path(),
            "e.toml",
            &format!("name = \"e\"\n[[case]]\nid = \"c\"\nworld = 3\narenas = [7]\n{line}\n"),
        );
        let o = fp()
            .args(["run", "--backend", "cpu"])
            .arg(&exp)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{line}: {err}");
        assert!(err.contains("set `addends` too"), "{line}: {err}");
    }
}

/// Rank files too large for what this process may allocate: exit 3 before
/// any case runs, naming the files and the tensor.
#[test]
fn rank_files_larger_than_memory_allows_are_refused_before_running() {
    use std::os::unix::process::CommandExt;
    let dir = tempfile::tempdir().unwrap();
    let n: usize = 64 << 20; // 256 MiB of float32 per rank
    for r in 0..3 {
        write_big(&dir.path().join(format!("rank{r}.safetensors")), n);
    }
    let exp = write(
        dir.path(),
        "big.toml",
        "name = \"big\"\n[[case]]\nid = \"b\"\naddends = \"rank{rank}.safetensors\"\n",
    );
    let mut cmd = std::process::Command::new(crate::common::bin_path());
    cmd.args(["run", "--backend", "cpu"]).arg(&exp);
    // SAFETY: setrlimit is async-signal-safe; nothing else runs in the child.
    unsafe {
        cmd.pre_exec(|| {
            let lim = libc::rlimit {
                rlim_cur: 512 << 20,
                rlim_max: 512 << 20,
            };
            if libc::setrlimit(libc::RLIMIT_AS, &lim) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let o = cmd.output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(3), "{err}");
    assert!(
        err.contains("case `b` needs") && err.contains("address space (RLIMIT_AS)"),
        "{err}"
    );
    assert!(
        err.contains("its addends are the rank files rank{rank}.safetensors: W = 3 x tensor `big` of 67108864 elements"),
        "{err}"
    );
}

/// A safetensors file of one float32 tensor `big` of `n` zeros, sparse.
fn write_big(path: &Path, n: usize) {
    let mut header = format!(
        "{{\"big\":{{\"dtype\":\"F32\",\"shape\":[{n}],\"data_offsets\":[0,{}]}}}}",
        n * 4
    );
    while header.len() % 8 != 0 {
        header.push(' ');
    }
    let mut bytes = (header.len() as u64).to_le_bytes().to_vec();
    bytes.extend_from_slice(header.as_bytes());
    let f = std::fs::File::create(path).unwrap();
    use std::io::Write;
    (&f).write_all(&bytes).unwrap();
    f.set_len((bytes.len() + n * 4) as u64).unwrap();
}

/// A report whose rank-file block was edited is refused where it is read.
#[test]
fn a_report_whose_inputs_were_edited_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    rank_files::grads(dir.path(), 3, 20);
    let exp = write(
        dir.path(),
        "g.toml",
        "name = \"g\"\n[[case]]\nid = \"c\"\naddends = \"rank{rank}.safetensors\"\nexpect = \"expected.safetensors\"\n",
    );
    let out = dir.path().join("r.json");
    fp().args(["run", "--backend", "cpu", "--out"])
        .arg(&out)
        .arg(&exp)
        .assert()
        .success();
    let text = std::fs::read_to_string(&out).unwrap();
    let r: Value = serde_json::from_str(&text).unwrap();
    // Control: the report as written compares with itself.
    fp().arg("compare").arg(&out).arg(&out).assert().success();
    type Edit = Box<dyn Fn(&mut Value)>;
    let edits: [(&str, Edit, &str); 3] = [
        (
            "a file digest",
            Box::new(|v: &mut Value| {
                v["cases"][0]["params"]["addends"]["files"][1]["sha256"] =
                    Value::String("0".repeat(64));
            }),
            "params.addends.identity is not the identity of its files and arenas",
        ),
        (
            "a seed beside the files",
            Box::new(|v: &mut Value| {
                v["cases"][0]["params"]["seed"] = Value::from(3);
            }),
            "`addends` (files) and `seed`/`distribution` (the generator) both given",
        ),
        (
            "the expect verdict",
            Box::new(|v: &mut Value| {
                v["cases"][0]["expect"]["equal"] = Value::Bool(false);
            }),
            "expect.equal does not follow from its arenas",
        ),
    ];
    for (what, edit, wanted) in edits {
        let mut v = r.clone();
        edit(&mut v);
        let bad = dir.path().join("bad.json");
        std::fs::write(&bad, serde_json::to_string_pretty(&v).unwrap()).unwrap();
        let o = fp().arg("compare").arg(&out).arg(&bad).output().unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{what}: {err}");
        assert!(err.contains(wanted), "{what}: wanted `{wanted}` in {err}");
    }
}

/// Goldens of rank-file experiments: `golden` then `verify` pass, and
/// verify fails once a rank file changes.
#[test]
fn goldens_of_rank_files_catch_a_changed_file() {
    let dir = tempfile::tempdir().unwrap();
    rank_files::grads(dir.path(), 3, 40);
    let exp = write(
        dir.path(),
        "g.toml",
        "name = \"g\"\n[[sweep]]\nid = \"c\"\naddends = \"rank{rank}.safetensors\"\norder = [\"ascending\", \"descending\"]\n",
    );
    let golden = dir.path().join("golden");
    fp().args(["golden", "--golden"])
        .arg(&golden)
        .arg(&exp)
        .assert()
        .success();
    fp().args(["verify", "--backend", "cpu", "--golden"])
        .arg(&golden)
        .arg(&exp)
        .assert()
        .success();
    let mut v = rank_files::mixed(11, 1, 0, 7);
    v[3] = v[3] * 2.0 + 1.0;
    let w = rank_files::mixed(11, 1, 1, 120);
    write_st(
        dir.path(),
        1,
        &[T::f32("w", &[3, 40], &w), T::f32("b", &[7], &v)],
    );
    let o = fp()
        .args(["verify", "--backend", "cpu", "--golden"])
        .arg(&golden)
        .arg(&exp)
        .output()
        .unwrap();
    assert_eq!(
        o.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&o.stdout)
    );
}

/// 16-bit addends whose result, rounded once, depends on the fold order
/// at every other element: there rank 0 holds a large L and rank 2 holds
/// -L, so the float32 partial sums absorb the other ranks' mixed values
/// differently by order. Between them, mixed values alone, whose float32
/// sums may change with the order while their rounded results (almost)
/// never do.
fn cancelling16(dt: rank_files::Dt, w: usize, n: usize) -> Vec<Vec<u16>> {
    let mut ranks: Vec<Vec<u16>> = (0..w)
        .map(|r| rank_files::mixed16(dt, 21, r, 0, n))
        .collect();
    for i in (0..n).step_by(2) {
        // Exact in both types (six fraction bits, below f16's largest).
        let l = 32768.0 * (1.0 + (i % 64) as f32 / 64.0);
        ranks[0][i] = rank_files::narrow16(dt, l);
        ranks[2][i] = rank_files::narrow16(dt, -l);
    }
    ranks
}

fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(sha2::Sha256::digest(bytes))
}

/// Rank files in bf16 and f16 are reduced in their dtype: float32 in rank
/// order, rounded once. The digest, the dump and the sensitivity are those
/// of that result computed here (with the `half` crate, not foldprint's
/// conversions); `dtype = "f32"` keeps today's widening, equal to f32
/// files of the same values.
#[test]
fn sixteen_bit_rank_files_reduce_in_their_dtype_rounded_once() {
    use rank_files::{le16, narrow16, rank_order_sum16, widen16, Dt};
    let dir = tempfile::tempdir().unwrap();
    let (w, n) = (4, 3001);
    let mut addends = Vec::new();
    for (dt, prefix) in [(Dt::Bf16, "bf"), (Dt::F16, "hf")] {
        let ranks = cancelling16(dt, w, n);
        for (r, bits) in ranks.iter().enumerate() {
            let t = match dt {
                Dt::Bf16 => T::bf16("g", &[n], bits),
                _ => T::f16("g", &[n], bits),
            };
            rank_files::write_safetensors(
                &dir.path().join(format!("{prefix}{r}.safetensors")),
                &[t],
            );
            // The same values as float32, for the widening's baseline.
            if dt == Dt::Bf16 {
                let wide: Vec<f32> = bits.iter().map(|&h| widen16(dt, h)).collect();
                rank_files::write_safetensors(
                    &dir.path().join(format!("wf{r}.safetensors")),
                    &[T::f32("g", &[n], &wide)],
                );
            }
        }
        addends.push((dt, prefix, ranks));
    }
    let exp = write(
        dir.path(),
        "x.toml",
        "name = \"x\"\n\
         [[case]]\nid = \"bf\"\naddends = \"bf{rank}.safetensors\"\n\
         [[case]]\nid = \"hf\"\naddends = \"hf{rank}.safetensors\"\n\
         [[case]]\nid = \"bfw\"\naddends = \"bf{rank}.safetensors\"\ndtype = \"f32\"\n\
         [[case]]\nid = \"wf\"\naddends = \"wf{rank}.safetensors\"\n",
    );
    let out = dir.path().join("r.json");
    let dump = dir.path().join("d");
    let o = fp()
        .args(["run", "--backend", "cpu", "--out"])
        .arg(&out)
        .arg("--dump")
        .arg(&dump)
        .arg(&exp)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert_eq!(
        o.status.code(),
        Some(0),
        "{stdout}{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let r = report(&out);
    let case = |id: &str| {
        r["cases"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["id"] == id)
            .unwrap()
            .clone()
    };
    for (dt, prefix, ranks) in &addends {
        let c = case(prefix);
        let name = if *dt == Dt::Bf16 { "bf16" } else { "f16" };
        let want = rank_order_sum16(*dt, ranks);
        let bytes = le16(&want);
        assert_eq!(c["params"]["dtype"], name, "{prefix}");
        assert!(
            c["key"]
                .as_str()
                .unwrap()
                .starts_with(&format!("fixed-order/sum/W4/n3001/{name}/files:")),
            "{}",
            c["key"]
        );
        assert_eq!(c["arenas"][0]["sha256"], sha256_hex(&bytes), "{prefix}");
        assert_eq!(c["ranks_identical"], true);
        assert_eq!(
            std::fs::read(dump.join(format!("x.{prefix}.a0.bin"))).unwrap(),
            bytes
        );
        // Negative control: rounding after every add gives other bits on
        // this data, so the digest above tells the one rounding apart.
        let every_add: Vec<u16> = (0..n)
            .map(|i| {
                let mut acc = ranks[0][i];
                for rank in &ranks[1..] {
                    acc = narrow16(*dt, widen16(*dt, acc) + widen16(*dt, rank[i]));
                }
                acc
            })
            .collect();
        assert_ne!(
            every_add, want,
            "{prefix}: the data cannot tell the roundings apart"
        );
        // Sensitivity counts the elements whose reversed fold, rounded once,
        // has other bits in the dtype.
        let reversed: Vec<Vec<u16>> = ranks.iter().rev().cloned().collect();
        let changed = rank_order_sum16(*dt, &reversed)
            .iter()
            .zip(&want)
            .filter(|(a, b)| a != b)
            .count();
        assert!(changed > 0, "{prefix}: order-blind data");
        // Control: the float32 folds, not rounded, change at more elements;
        // the report counts the result's.
        let wide = |rs: &[Vec<u16>]| -> Vec<u32> {
            let v: Vec<Vec<f32>> = rs
                .iter()
                .map(|r| r.iter().map(|&h| widen16(*dt, h)).collect())
                .collect();
            bits(&rank_files::rank_order_sum(&v))
        };
        let changed_f32 = wide(&reversed)
            .iter()
            .zip(&wide(ranks))
            .filter(|(a, b)| a != b)
            .count();
        assert!(
            changed_f32 > changed,
            "{prefix}: {changed_f32} vs {changed}"
        );
        assert_eq!(c["sensitivity"]["changed"], changed, "{prefix}");
        assert_eq!(c["sensitivity"]["checked"], n, "{prefix}");
    }
    // The widening, declared: f32 from end to end, equal to f32 files of
    // the same values (what 16-bit files gave before the dtypes).
    let (bfw, wf) = (case("bfw"), case("wf"));
    let wide: Vec<Vec<f32>> = addends[0]
        .2
        .iter()
        .map(|r| r.iter().map(|&h| widen16(Dt::Bf16, h)).collect())
        .collect();
    let f32_bytes: Vec<u8> = rank_files::rank_order_sum(&wide)
        .iter()
        .flat_map(|v| v.to_le_bytes())
        .collect();
    assert!(bfw["params"].get("dtype").is_none(), "{}", bfw["params"]);
    assert_eq!(bfw["arenas"][0]["sha256"], sha256_hex(&f32_bytes));
    assert_eq!(bfw["arenas"][0]["sha256"], wf["arenas"][0]["sha256"]);
    assert_ne!(
        bfw["arenas"][0]["sha256"],
        case("bf")["arenas"][0]["sha256"]
    );
    // The table says which cases are 16-bit; an f32 row shows lengths only.
    let row = |id: &str| {
        stdout
            .lines()
            .find(|l| l.split_whitespace().nth(1) == Some(id))
            .unwrap_or_else(|| panic!("no row {id}: {stdout}"))
            .to_string()
    };
    assert!(row("bf").contains(" 3001 bf16 "), "{}", row("bf"));
    assert!(row("hf").contains(" 3001 f16 "), "{}", row("hf"));
    assert!(
        row("bfw").contains(" 3001 ") && !row("bfw").contains("f32"),
        "{}",
        row("bfw")
    );
}

/// A 16-bit case never rounds an addend: a tensor of another dtype is
/// refused (exit 2) naming the file, the tensor, both dtypes and where the
/// experiment says it; nothing is written. Each refusal has a control that
/// runs.
#[test]
fn a_tensor_of_another_dtype_is_refused_by_file_tensor_and_place() {
    let dir = tempfile::tempdir().unwrap();
    rank_files::grads(dir.path(), 3, 10);
    for r in 0..3 {
        let a = rank_files::mixed16(rank_files::Dt::Bf16, 5, r, 0, 4);
        let b = rank_files::mixed16(rank_files::Dt::F16, 5, r, 1, 4);
        rank_files::write_safetensors(
            &dir.path().join(format!("mix{r}.safetensors")),
            &[T::bf16("a", &[4], &a), T::f16("b", &[4], &b)],
        );
    }
    let cases: [(&str, &str, Option<&str>); 5] = [
        (
            "addends = \"rank{rank}.safetensors\"\ndtype = \"bf16\"",
            "e.toml:5:9: case `c`: field `dtype`: bf16, but tensor `b` of rank0.safetensors is f32: foldprint never rounds an addend",
            None,
        ),
        (
            "addends = \"mix{rank}.safetensors\"",
            "e.toml:4:11: case `c`: field `dtype`: not set, and the tensors of mix0.safetensors mix dtypes (`a` is bf16, `b` is f16)",
            None,
        ),
        (
            "addends = \"mix{rank}.safetensors\"\ndtype = \"f16\"",
            "e.toml:5:9: case `c`: field `dtype`: f16, but tensor `a` of mix0.safetensors is bf16",
            None,
        ),
        // Controls: the same files, a dtype they hold or the widening.
        ("addends = \"rank{rank}.safetensors\"", "", Some("")),
        ("addends = \"mix{rank}.safetensors\"\ndtype = \"f32\"", "", Some("")),
    ];
    for (lines, wanted, runs) in cases {
        let exp = write(
            dir.path(),
            "e.toml",
            &format!("name = \"e\"\n[[case]]\nid = \"c\"\n{lines}\n"),
        );
        let out = dir.path().join("r.json");
        let _ = std::fs::remove_file(&out);
        let o = run_cpu(&exp, &out);
        let err = String::from_utf8_lossy(&o.stderr);
        if runs.is_some() {
            assert_eq!(o.status.code(), Some(0), "{lines}: {err}");
            continue;
        }
        assert_eq!(o.status.code(), Some(2), "{lines}: {err}");
        assert!(err.contains(wanted), "{lines}: wanted `{wanted}` in: {err}");
        assert!(!err.contains("panicked"), "{err}");
        assert!(!out.exists(), "{lines}: nothing may be written");
    }
    // Picking the tensors of one dtype runs in that dtype.
    let exp = write(
        dir.path(),
        "e.toml",
        "name = \"e\"\n[[case]]\nid = \"c\"\naddends = \"mix{rank}.safetensors\"\ntensors = [\"b\"]\n",
    );
    let out = dir.path().join("r.json");
    let o = run_cpu(&exp, &out);
    assert_eq!(
        o.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert_eq!(report(&out)["cases"][0]["params"]["dtype"], "f16");
}

/// `--expect-gate`: which differences from `expect` exit 1. The files equal
/// fixed-order and differ from the pairwise tree.
#[test]
fn the_expect_gate_chooses_which_differences_exit_1() {
    let dir = tempfile::tempdir().unwrap();
    rank_files::grads(dir.path(), 4, 1000);
    let exp = write(dir.path(), "grads.toml", GRADS);
    let gate = |g: &str| {
        let o = fp()
            .args(["run", "--backend", "cpu", "--expect-gate", g])
            .arg(&exp)
            .output()
            .unwrap();
        (
            o.status.code(),
            String::from_utf8_lossy(&o.stderr).into_owned(),
        )
    };
    // The default and `all`: the tree's difference fails the run.
    assert_eq!(gate("all").0, Some(1));
    // A finding only: exit 0, and stderr says why.
    let (code, err) = gate("none");
    assert_eq!(code, Some(0), "{err}");
    assert!(err.contains("expect gate `none`: no gated case"), "{err}");
    // Gated on the contract the files equal: passes ...
    assert_eq!(gate("fixed-order").0, Some(0));
    // ... and on the one they differ from, fails naming the case
    // (negative control).
    let (code, err) = gate("pairwise-tree");
    assert_eq!(code, Some(1), "{err}");
    assert!(
        err.contains("1 gated case(s) differ from their expect: g[pairwise-tree]"),
        "{err}"
    );
    // A misspelt contract is bad input, named.
    let (code, err) = gate("fixed-ordre");
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("fixed-ordre"), "{err}");
}

/// `bench --inputs` on the CPU oracle, f32 and bf16: the files it writes
/// give the generator's digests and sensitivity, each case is timed end
/// to end (the pass's digests known inside it), and five whole runs of
/// each experiment are recorded.
#[test]
fn bench_inputs_reads_the_generators_values_from_files_and_times_whole_cases() {
    for dtype in ["f32", "bf16"] {
        let o = fp()
            .args(["bench", "--inputs", "--backend", "cpu", "--world", "3"])
            .args(["--log2-len", "14", "-d", dtype, "--json"])
            .output()
            .unwrap();
        assert_eq!(
            o.status.code(),
            Some(0),
            "{}",
            String::from_utf8_lossy(&o.stderr)
        );
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        assert_eq!(v["dtype"], dtype, "{v}");
        assert_eq!(v["same_digests"], true, "{v}");
        assert_eq!(v["same_sensitivity"], true, "{v}");
        assert_eq!(
            v["bytes"],
            3 * (1 << 14) * if dtype == "f32" { 4 } else { 2 }
        );
        let ms = |k: &str| v[k].as_f64().unwrap_or_else(|| panic!("{k}: {v}"));
        // The digests are known no sooner than the bytes, and the case
        // holds the pass.
        assert!(ms("files_hash_ms") >= ms("files_read_ms"), "{v}");
        assert!(
            ms("files_case_ms") > 0.0 && ms("generator_case_ms") > 0.0,
            "{v}"
        );
        assert!((ms("ratio") - ms("files_case_ms") / ms("generator_case_ms")).abs() < 1e-9);
        for k in ["files_run_ms", "generator_run_ms"] {
            assert_eq!(v[k].as_array().map(Vec::len), Some(5), "{k}: {v}");
        }
    }
}
