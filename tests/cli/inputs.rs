//! What a run reads, held to what it is: a case of thousands of arenas
//! prints its table; no size a file declares wraps; no output replaces an
//! input; a declared world agrees with the rank files on disk; two
//! selections of tensors never share an identity.

use crate::common::rank_files::{self, T};
use crate::common::{fp, run_cpu, write};
use serde_json::Value;
use std::path::Path;

fn report(path: &Path) -> Value {
    serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap()
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// 3,856 arenas (an MoE model's gradients in one safetensors file): `run`
/// and `verify` print their tables, the row giving the count and the
/// first digests, as wide as its header; a case of two arenas keeps its
/// row as before.
#[test]
fn a_case_of_thousands_of_arenas_prints_its_table() {
    const N: usize = 3856;
    let dir = tempfile::tempdir().unwrap();
    for r in 0..2 {
        let tensors: Vec<T> = (0..N)
            .map(|i| T::f32(&format!("expert.{i:04}"), &[2], &[r as f32, i as f32]))
            .collect();
        rank_files::write_safetensors(&dir.path().join(format!("rank{r}.safetensors")), &tensors);
    }
    std::fs::create_dir(dir.path().join("small")).unwrap();
    rank_files::grads(&dir.path().join("small"), 2, 10);
    let exp = write(
        dir.path(),
        "moe.toml",
        "name = \"moe\"\n[[case]]\nid = \"m\"\naddends = \"rank{rank}.safetensors\"\n\
         [[case]]\nid = \"s\"\naddends = \"small/rank{rank}.safetensors\"\n",
    );
    let out = dir.path().join("r.json");
    let o = run_cpu(&exp, &out);
    let (stdout, stderr) = (text(&o.stdout), text(&o.stderr));
    assert_eq!(o.status.code(), Some(0), "{stdout}{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    let r = report(&out);
    let digest = |case: usize, a: usize| -> String {
        r["cases"][case]["arenas"][a]["sha256"].as_str().unwrap()[..16].to_string()
    };
    let lines: Vec<&str> = stdout.lines().collect();
    let header = lines
        .iter()
        .find(|l| l.contains("SHA-256 (per arena"))
        .unwrap_or_else(|| panic!("no header in {stdout}"));
    let row = |id: &str| -> &str {
        lines
            .iter()
            .find(|l| l.starts_with(&format!("  ok   {id} ")))
            .unwrap_or_else(|| panic!("no row of `{id}` in {stdout}"))
    };
    let big = row("m");
    assert!(big.contains(" 3856 arenas "), "{big}");
    let shown: Vec<String> = (0..7).map(|a| digest(0, a)).collect();
    assert!(
        big.contains(&format!("{} +3849 more ", shown.join(" "))),
        "{big}"
    );
    assert!(
        !big.contains(&digest(0, 7)),
        "the 8th digest is elided: {big}"
    );
    // TIME stays in its column: every row as wide as the header.
    assert_eq!(big.chars().count(), header.chars().count(), "{stdout}");
    // Two arenas: their lengths and both digests, as always.
    let small = row("s");
    assert!(small.contains(" 7+30 "), "{small}");
    assert!(
        small.contains(&format!("{} {}", digest(1, 0), digest(1, 1))),
        "{small}"
    );
    assert_eq!(small.chars().count(), header.chars().count(), "{stdout}");
    // verify prints the same table.
    let golden = dir.path().join("golden");
    fp().args(["golden", "--golden"])
        .arg(&golden)
        .arg(&exp)
        .assert()
        .success();
    let o = fp()
        .args(["verify", "--backend", "cpu", "--golden"])
        .arg(&golden)
        .arg(&exp)
        .output()
        .unwrap();
    let stdout = text(&o.stdout);
    assert_eq!(o.status.code(), Some(0), "{stdout}{}", text(&o.stderr));
    assert!(stdout.contains(" 3856 arenas "), "{stdout}");
}

/// An npy header whose dimensions multiply past 2^64, and a safetensors
/// header whose tensors end past the file: exit 2 naming the file and the
/// shape or tensor, never a small arena made of a wrapped product.
#[test]
fn sizes_a_rank_file_declares_never_wrap() {
    fn npy(shape: &[usize], floats: usize) -> impl Fn(&Path) + 'static {
        let shape = shape.to_vec();
        move |d: &Path| {
            rank_files::write_npy(&d.join("np0.npy"), "<f4", &shape, &vec![0u8; floats * 4])
        }
    }
    // Eight float32 tensors of 2^59 - 1 elements each: 2^64 - 32 bytes of
    // declared data in a file of a few hundred bytes.
    let huge = |d: &Path| {
        let per = (1u64 << 59) - 1;
        let mut header = String::from("{");
        for i in 0..8u64 {
            if i > 0 {
                header.push(',');
            }
            header.push_str(&format!(
                "\"t{i}\":{{\"dtype\":\"F32\",\"shape\":[{per}],\"data_offsets\":[{},{}]}}",
                i * per * 4,
                (i + 1) * per * 4
            ));
        }
        header.push('}');
        while header.len() % 8 != 0 {
            header.push(' ');
        }
        let mut b = (header.len() as u64).to_le_bytes().to_vec();
        b.extend_from_slice(header.as_bytes());
        std::fs::write(d.join("rank0.safetensors"), b).unwrap();
    };
    type Setup = Box<dyn Fn(&Path)>;
    let refused: Vec<(&str, &str, Setup, &str)> = vec![
        (
            "(2^63+1, 2^63+3) with 3 floats",
            "np{rank}.npy",
            Box::new(npy(&[(1 << 63) + 1, (1 << 63) + 3], 3)),
            "np0.npy: its header declares shape (9223372036854775809, 9223372036854775811)",
        ),
        (
            "(2^32, 2^32) with no data",
            "np{rank}.npy",
            Box::new(npy(&[1 << 32, 1 << 32], 0)),
            "np0.npy: its header declares shape (4294967296, 4294967296)",
        ),
        (
            "(0, 2^40, 2^40): empty, but its strides pass 2^64 (numpy refuses it too)",
            "np{rank}.npy",
            Box::new(npy(&[0, 1 << 40, 1 << 40], 0)),
            "np0.npy: its header declares shape (0, 1099511627776, 1099511627776)",
        ),
        (
            "safetensors tensors summing to 2^64 - 32 bytes",
            "rank{rank}.safetensors",
            Box::new(huge),
            "rank0.safetensors: tensor `t7` declares data up to byte 18446744073709551584: more than a file can hold",
        ),
    ];
    for (what, template, setup, wanted) in refused {
        let dir = tempfile::tempdir().unwrap();
        setup(dir.path());
        let exp = write(
            dir.path(),
            "e.toml",
            &format!("name = \"e\"\n[[case]]\nid = \"c\"\naddends = \"{template}\"\n"),
        );
        let out = dir.path().join("r.json");
        let o = run_cpu(&exp, &out);
        let err = text(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{what}: {err}{}", text(&o.stdout));
        assert!(err.contains(wanted), "{what}: wanted `{wanted}` in {err}");
        assert!(!err.contains("panicked"), "{what}: {err}");
        assert!(!out.exists(), "{what}: nothing may be written");
    }
    // Controls: a plain array, and an empty one whose nonzero dimensions fit.
    for (shape, floats) in [(vec![3usize], 3usize), (vec![0, 1 << 32], 0)] {
        let dir = tempfile::tempdir().unwrap();
        npy(&shape, floats)(dir.path());
        let exp = write(
            dir.path(),
            "e.toml",
            "name = \"e\"\n[[case]]\nid = \"c\"\naddends = \"np{rank}.npy\"\n",
        );
        let out = dir.path().join("r.json");
        fp().args(["run", "--backend", "cpu", "--out"])
            .arg(&out)
            .arg(&exp)
            .assert()
            .success();
        assert_eq!(
            report(&out)["cases"][0]["params"]["arenas"][0],
            Value::from(floats),
            "{shape:?}"
        );
    }
}

/// Every input of a run, whatever the spelling: a rank file, the expect
/// file, a golden, an audit matrix and its experiment's rank file are
/// never replaced by a report, a JUnit file or a dump directory. Exit 2,
/// naming the flag and the input; the input is left as it was.
#[test]
fn no_output_replaces_an_input() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    std::fs::create_dir(d.join("grads")).unwrap();
    rank_files::grads(&d.join("grads"), 3, 20);
    let exp = write(
        d,
        "g.toml",
        "name = \"g\"\n[[case]]\nid = \"c\"\naddends = \"grads/rank{rank}.safetensors\"\n\
         expect = \"grads/expected.safetensors\"\n",
    );
    let inputs = [
        "g.toml",
        "grads/rank0.safetensors",
        "grads/rank1.safetensors",
        "grads/rank2.safetensors",
        "grads/expected.safetensors",
    ];
    let before: Vec<Vec<u8>> = inputs
        .iter()
        .map(|p| std::fs::read(d.join(p)).unwrap())
        .collect();
    std::os::unix::fs::symlink("grads/rank2.safetensors", d.join("link.json")).unwrap();
    let golden = d.join("golden");
    fp().args(["golden", "--golden"])
        .arg(&golden)
        .arg(&exp)
        .assert()
        .success();
    let golden_before = std::fs::read(golden.join("g.json")).unwrap();
    let refused: [(&[&str], &str); 8] = [
        (
            &["run", "--out", "grads/rank1.safetensors"],
            "--out grads/rank1.safetensors is rank 1's file",
        ),
        (
            &["run", "--out", "./grads/../grads/rank0.safetensors"],
            "is rank 0's file",
        ),
        (
            &["run", "--out", "link.json"],
            "--out link.json is rank 2's file",
        ),
        (
            &["run", "--junit", "grads/rank0.safetensors"],
            "--junit grads/rank0.safetensors is rank 0's file",
        ),
        (
            &["run", "--out", "grads/expected.safetensors"],
            "is the expect file",
        ),
        (&["run", "--dump", "grads"], "--dump grads: rank 0's file"),
        (
            &[
                "verify",
                "--golden",
                "golden",
                "--junit",
                "grads/expected.safetensors",
            ],
            "is the expect file",
        ),
        (
            &["verify", "--golden", "golden", "--out", "golden/g.json"],
            "is the golden",
        ),
    ];
    for (args, wanted) in refused {
        let o = fp()
            .current_dir(d)
            .args(&args[..1])
            .args(["--backend", "cpu"])
            .args(&args[1..])
            .arg("g.toml")
            .output()
            .unwrap();
        let err = text(&o.stderr);
        assert_eq!(
            o.status.code(),
            Some(2),
            "{args:?}: {err}{}",
            text(&o.stdout)
        );
        assert!(err.contains(wanted), "{args:?}: wanted `{wanted}` in {err}");
        for (p, b) in inputs.iter().zip(&before) {
            assert_eq!(
                &std::fs::read(d.join(p)).unwrap(),
                b,
                "{args:?} changed {p}"
            );
        }
        assert_eq!(std::fs::read(golden.join("g.json")).unwrap(), golden_before);
    }
    // An audit's matrix, and a rank file of the experiment it names.
    let matrix = write(
        d,
        "m.toml",
        "name = \"m\"\nexperiments = [\"g.toml\"]\noracle = false\n[[config]]\nname = \"base\"\nbackend = \"cpu\"\n",
    );
    let matrix_before = std::fs::read(&matrix).unwrap();
    for (out, wanted) in [
        ("m.toml", "--out m.toml is the audit matrix"),
        (
            "grads/rank1.safetensors",
            "--out grads/rank1.safetensors is rank 1's file",
        ),
    ] {
        let o = fp()
            .current_dir(d)
            .args(["audit", "m.toml", "--out", out])
            .output()
            .unwrap();
        let err = text(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "audit --out {out}: {err}");
        assert!(
            err.contains(wanted),
            "audit --out {out}: wanted `{wanted}` in {err}"
        );
    }
    assert_eq!(std::fs::read(&matrix).unwrap(), matrix_before);
    for (p, b) in inputs.iter().zip(&before) {
        assert_eq!(&std::fs::read(d.join(p)).unwrap(), b, "audit changed {p}");
    }
    // Control: outputs beside the inputs are written.
    fp().current_dir(d)
        .args([
            "run",
            "--backend",
            "cpu",
            "--out",
            "grads/r.json",
            "--junit",
            "j.xml",
        ])
        .args(["--dump", "dump", "g.toml"])
        .assert()
        .success();
    assert!(d.join("grads/r.json").exists() && d.join("j.xml").exists());
}

/// A declared world and the rank files on disk agree, or the run stops
/// saying what it found.
#[test]
fn a_declared_world_agrees_with_the_rank_files() {
    let run = |files: &[usize], world: usize| -> (Option<i32>, String, bool) {
        let dir = tempfile::tempdir().unwrap();
        rank_files::grads(dir.path(), files.iter().max().unwrap() + 1, 10);
        for r in 0..=*files.iter().max().unwrap() {
            if !files.contains(&r) {
                std::fs::remove_file(dir.path().join(format!("rank{r}.safetensors"))).unwrap();
            }
        }
        let exp = write(
            dir.path(),
            "e.toml",
            &format!("name = \"e\"\n[[case]]\nid = \"c\"\naddends = \"rank{{rank}}.safetensors\"\nworld = {world}\n"),
        );
        let out = dir.path().join("r.json");
        let o = run_cpu(&exp, &out);
        (o.status.code(), text(&o.stderr), out.exists())
    };
    let (code, err, written) = run(&[0, 1, 2], 2);
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains("rank{rank}.safetensors: world = 2, but 3 file(s) match it (ranks 0 ..= 2)"),
        "{err}"
    );
    assert!(!written);
    let (code, err, _) = run(&[0, 1, 2, 3], 2);
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains("world = 2, but 4 file(s) match it (ranks 0 ..= 3)"),
        "{err}"
    );
    assert!(!err.contains("missing"), "nothing is missing: {err}");
    let (code, err, _) = run(&[0, 1, 2, 5], 3);
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains("world = 3, but 4 file(s) match it (ranks 0 ..= 2, 5)"),
        "{err}"
    );
    let (code, err, _) = run(&[0, 2], 2);
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains("rank1.safetensors: not found: W = 2 needs a file for each of ranks 0 ..= 1; found ranks 0, 2"),
        "{err}"
    );
    // Control: the world the files give.
    let (code, err, written) = run(&[0, 1, 2], 3);
    assert_eq!(code, Some(0), "{err}");
    assert!(written);
}

/// Tensor names holding a tab or a newline can spell another selection's
/// identity text; escaped, two selections never share a case key, and the
/// same selection keeps it.
#[test]
fn two_selections_of_tensors_never_share_a_key() {
    let dir = tempfile::tempdir().unwrap();
    // `x` reads as arenas p and q, `y` as q and r, in the text unescaped.
    let x = "p\tf32\t1\t1\narena\tq";
    let y = "q\tf32\t1\t1\narena\tr";
    for r in 0..2 {
        let v = |k: usize| [(10 * r + k) as f32 + 0.25];
        rank_files::write_safetensors(
            &dir.path().join(format!("rank{r}.safetensors")),
            &[
                T::f32("p", &[1], &v(1)),
                T::f32("q", &[1], &v(2)),
                T::f32("r", &[1], &v(3)),
                T::f32(x, &[1], &v(4)),
                T::f32(y, &[1], &v(5)),
            ],
        );
    }
    let toml_x = "p\\tf32\\t1\\t1\\narena\\tq";
    let toml_y = "q\\tf32\\t1\\t1\\narena\\tr";
    let key = |name: &str, tensors: &str| -> String {
        let exp = write(
            dir.path(),
            &format!("{name}.toml"),
            &format!(
                "name = \"{name}\"\n[[case]]\nid = \"c\"\naddends = \"rank{{rank}}.safetensors\"\ntensors = [{tensors}]\n"
            ),
        );
        let out = dir.path().join(format!("{name}.json"));
        fp().args(["run", "--backend", "cpu", "--out"])
            .arg(&out)
            .arg(&exp)
            .assert()
            .success();
        report(&out)["cases"][0]["key"]
            .as_str()
            .unwrap()
            .to_string()
    };
    let a = key("a", &format!("\"{toml_x}\", \"r\""));
    let b = key("b", &format!("\"p\", \"{toml_y}\""));
    assert!(a.contains("/n1+1/files:"), "{a}");
    assert_ne!(a, b, "two selections of other tensors share a key");
    // Control: the same selection, in another experiment, the same key.
    assert_eq!(key("a2", &format!("\"{toml_x}\", \"r\"")), a);
}

/// A grid (`audit`, `world`) sizes its columns from their cells; a cell
/// past the 65,535 that a format width takes (here a configuration's
/// environment value in SETTINGS) is printed, not a panic.
#[test]
fn a_grid_cell_of_any_width_prints() {
    let dir = tempfile::tempdir().unwrap();
    write(
        dir.path(),
        "e.toml",
        "name = \"e\"\n[[case]]\nid = \"c\"\nworld = 2\narenas = [5]\n",
    );
    let long = "a".repeat(70_000);
    write(
        dir.path(),
        "m.toml",
        &format!(
            "name = \"m\"\nexperiments = [\"e.toml\"]\noracle = false\n[[config]]\nname = \"base\"\n\
             backend = \"cpu\"\nenv = {{ FOLDPRINT_NOTE = \"{long}\" }}\n"
        ),
    );
    let o = fp()
        .current_dir(dir.path())
        .args(["audit", "m.toml"])
        .output()
        .unwrap();
    let (stdout, stderr) = (text(&o.stdout), text(&o.stderr));
    assert_eq!(
        o.status.code(),
        Some(0),
        "{}",
        &stderr[..stderr.len().min(3000)]
    );
    assert!(!stderr.contains("panicked"));
    assert!(
        stdout.contains(&format!("FOLDPRINT_NOTE={long}")),
        "the whole value"
    );
}
