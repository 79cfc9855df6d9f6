//! Outputs never destroy or forge: dump directories are checked against
//! their files, temp files cannot be redirected, special files are not
//! replaced, dump names are one to one, dump directories are replaced
//! whole, signals stop a run at a case boundary with nothing written, an
//! output may not be an input, and everything is checked before any work.

use predicates::prelude::*;
use std::path::Path;

use crate::common::{fp, listing, write, SLOW, TINY};

const ONE: &str = "name = \"one\"\n[[case]]\nid = \"c\"\nworld = 3\narenas = [100]\n";

/// Every entry of a directory with its bytes (a subdirectory: its listing).
fn snapshot(dir: &Path) -> Vec<(String, Vec<u8>)> {
    listing(dir)
        .into_iter()
        .map(|n| {
            let p = dir.join(&n);
            let b = if p.is_dir() {
                listing(&p).join("\n").into_bytes()
            } else {
                std::fs::read(&p).unwrap()
            };
            (n, b)
        })
        .collect()
}

fn sha256sum_ok(dir: &Path) -> bool {
    std::process::Command::new("sha256sum")
        .args(["-c", "--quiet", "SHA256SUMS"])
        .current_dir(dir)
        .output()
        .expect("sha256sum (coreutils) is needed for this test")
        .status
        .success()
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir(to).unwrap();
    for n in listing(from) {
        std::fs::copy(from.join(&n), to.join(&n)).unwrap();
    }
}

fn stderr_of(a: &assert_cmd::assert::Assert) -> String {
    String::from_utf8_lossy(&a.get_output().stderr).into_owned()
}

// 1. compare of dump directories hashes the files it compares.
#[test]
fn compare_of_dump_dirs_hashes_the_files() {
    let dir = tempfile::tempdir().unwrap();
    let exp = write(dir.path(), "tiny.toml", TINY);
    let a = dir.path().join("a");
    fp().args(["run", "--backend", "cpu", "--dump"])
        .arg(&a)
        .arg(&exp)
        .assert()
        .success();
    let b = dir.path().join("b");
    copy_dir(&a, &b);
    // Negative control: an exact copy agrees.
    fp().arg("compare").arg(&a).arg(&b).assert().success();
    let first = listing(&b)
        .into_iter()
        .find(|n| n.ends_with(".bin"))
        .unwrap();
    // One flipped byte that SHA256SUMS does not know about.
    let mut bytes = std::fs::read(b.join(&first)).unwrap();
    bytes[0] ^= 1;
    std::fs::write(b.join(&first), &bytes).unwrap();
    let err = stderr_of(&fp().arg("compare").arg(&a).arg(&b).assert().code(2));
    assert!(
        err.contains(&first) && err.contains("SHA256SUMS says"),
        "{err}"
    );
    // A deleted file.
    std::fs::remove_file(b.join(&first)).unwrap();
    let err = stderr_of(&fp().arg("compare").arg(&a).arg(&b).assert().code(2));
    assert!(err.contains(&first), "{err}");
    // A file SHA256SUMS does not list.
    std::fs::write(b.join(&first), std::fs::read(a.join(&first)).unwrap()).unwrap();
    std::fs::write(b.join("extra.bin"), b"0000").unwrap();
    let err = stderr_of(&fp().arg("compare").arg(&a).arg(&b).assert().code(2));
    assert!(err.contains("extra.bin"), "{err}");
}

// 2. Temp files have unpredictable names and never follow a planted link.
#[test]
fn planted_temp_file_links_are_not_followed() {
    let dir = tempfile::tempdir().unwrap();
    let exp = write(dir.path(), "one.toml", ONE);
    let victim = write(dir.path(), "victim.txt", "precious\n");
    // The old scheme named the temp file `.<name>.<pid>.tmp`: plant a link
    // for each of the next process ids.
    let last: u32 = std::fs::read_to_string("/proc/sys/kernel/ns_last_pid")
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    for pid in last + 1..last + 2000 {
        std::os::unix::fs::symlink(&victim, dir.path().join(format!(".r.json.{pid}.tmp"))).unwrap();
    }
    fp().current_dir(dir.path())
        .args(["run", "--backend", "cpu", "--out", "r.json"])
        .arg(&exp)
        .assert()
        .success();
    assert_eq!(
        std::fs::read_to_string(&victim).unwrap(),
        "precious\n",
        "the report was written through a planted link"
    );
    let report = dir.path().join("r.json");
    assert!(std::fs::symlink_metadata(&report)
        .unwrap()
        .file_type()
        .is_file());
    foldprint::report::Report::read(&report).unwrap();
}

// 3. --out onto a fifo or a symlink is refused; the special file stays.
#[test]
fn out_onto_a_fifo_or_symlink_is_refused() {
    use std::os::unix::fs::FileTypeExt;
    let dir = tempfile::tempdir().unwrap();
    let exp = write(dir.path(), "one.toml", ONE);
    let fifo = dir.path().join("pipe.json");
    let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o644) }, 0);
    let err = stderr_of(
        &fp()
            .args(["run", "--backend", "cpu", "--out"])
            .arg(&fifo)
            .arg(&exp)
            .assert()
            .code(2),
    );
    assert!(err.contains("fifo"), "{err}");
    assert!(std::fs::symlink_metadata(&fifo)
        .unwrap()
        .file_type()
        .is_fifo());

    let target = write(dir.path(), "target.json", "mine\n");
    let link = dir.path().join("link.json");
    std::os::unix::fs::symlink(&target, &link).unwrap();
    for flag in ["--out", "--junit"] {
        let err = stderr_of(
            &fp()
                .args(["run", "--backend", "cpu", flag])
                .arg(&link)
                .arg(&exp)
                .assert()
                .code(2),
        );
        assert!(err.contains("symbolic link"), "{err}");
    }
    assert!(std::fs::symlink_metadata(&link)
        .unwrap()
        .file_type()
        .is_symlink());
    assert_eq!(std::fs::read_to_string(&target).unwrap(), "mine\n");
    // Negative control: a regular file is replaced.
    fp().args(["run", "--backend", "cpu", "--out"])
        .arg(&target)
        .arg(&exp)
        .assert()
        .success();
    foldprint::report::Report::read(&target).unwrap();
}

// 4. Case ids that clean to the same file name get distinct dump files.
#[test]
fn colliding_case_ids_get_distinct_dump_files() {
    let dir = tempfile::tempdir().unwrap();
    let exp = write(
        dir.path(),
        "ids.toml",
        "name = \"ids\"\n[defaults]\nworld = 3\narenas = [64]\n\
         [[case]]\nid = \"a/b\"\nseed = 1\n[[case]]\nid = \"a_b\"\nseed = 2\n\
         [[case]]\nid = \"a b\"\nseed = 3\n[[case]]\nid = \"plain\"\nseed = 4\n",
    );
    let (d, r, st) = (
        dir.path().join("d"),
        dir.path().join("r.json"),
        dir.path().join("st.json"),
    );
    fp().args(["run", "--backend", "cpu", "--dump"])
        .arg(&d)
        .arg("--out")
        .arg(&r)
        .arg(&exp)
        .assert()
        .success();
    let files = listing(&d);
    assert_eq!(files.len(), 6, "4 arenas, SHA256SUMS, manifest: {files:?}");
    let sums = std::fs::read_to_string(d.join("SHA256SUMS")).unwrap();
    let names: std::collections::BTreeSet<&str> = sums
        .lines()
        .map(|l| l.split_once("  ").unwrap().1)
        .collect();
    assert_eq!(names.len(), 4, "{sums}");
    assert!(names.contains("ids.plain.a0.bin"), "{sums}");
    assert!(sha256sum_ok(&d));
    // The names map back to the report's cases.
    fp().arg("attest")
        .arg(&r)
        .arg("--dump")
        .arg(&d)
        .arg("--out")
        .arg(&st)
        .assert()
        .success();
}

// 5a. A dump directory is replaced whole, never merged with an older one.
#[test]
fn a_dump_directory_is_replaced_whole() {
    let dir = tempfile::tempdir().unwrap();
    let tiny = write(dir.path(), "tiny.toml", TINY);
    let one = write(dir.path(), "one.toml", ONE);
    let d = dir.path().join("d");
    for exp in [&tiny, &one] {
        fp().args(["run", "--backend", "cpu", "--dump"])
            .arg(&d)
            .arg(exp)
            .assert()
            .success();
    }
    assert_eq!(
        listing(&d),
        ["FOLDPRINT-DUMP.json", "SHA256SUMS", "one.c.a0.bin"]
    );
    assert!(sha256sum_ok(&d));
    assert_eq!(listing(dir.path()), ["d", "one.toml", "tiny.toml"]);
    // A directory that holds anything else is not ours to replace.
    let mine = dir.path().join("mine");
    std::fs::create_dir(&mine).unwrap();
    write(&mine, "notes.txt", "keep\n");
    let err = stderr_of(
        &fp()
            .args(["run", "--backend", "cpu", "--dump"])
            .arg(&mine)
            .arg(&one)
            .assert()
            .code(2),
    );
    assert!(err.contains("notes.txt"), "{err}");
    assert_eq!(listing(&mine), ["notes.txt"]);
}

/// Start a slow run over existing outputs, send `sig` once its first
/// arena is written, and check that nothing changed.
fn interrupt_keeps_old_outputs(sig: i32, code: i32, name: &str) {
    let dir = tempfile::tempdir().unwrap();
    let one = write(dir.path(), "one.toml", ONE);
    let slow = write(dir.path(), "slow.toml", SLOW);
    let (d, r, j) = (
        dir.path().join("d"),
        dir.path().join("r.json"),
        dir.path().join("j.xml"),
    );
    fp().args(["run", "--backend", "cpu", "--dump"])
        .arg(&d)
        .arg("--out")
        .arg(&r)
        .arg("--junit")
        .arg(&j)
        .arg(&one)
        .assert()
        .success();
    let before = snapshot(dir.path());
    let before_d = snapshot(&d);
    let child = std::process::Command::new(crate::common::bin_path())
        .args(["run", "--backend", "cpu", "--dump"])
        .arg(&d)
        .arg("--out")
        .arg(&r)
        .arg("--junit")
        .arg(&j)
        .arg(&slow)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // Wait until a case has finished: its arena is in the hidden staging directory.
    let t0 = std::time::Instant::now();
    loop {
        // The preflight makes and removes an empty probe of the same name
        // first, so a staging directory may vanish between two reads.
        let started = listing(dir.path())
            .iter()
            .filter(|n| n.starts_with(".d.partial-"))
            .any(|n| std::fs::read_dir(dir.path().join(n)).is_ok_and(|mut d| d.next().is_some()));
        if started {
            break;
        }
        assert!(
            t0.elapsed() < std::time::Duration::from_secs(60),
            "no case finished"
        );
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    // SAFETY: signalling our own child.
    unsafe { libc::kill(child.id() as i32, sig) };
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(code), "{err}");
    assert!(
        err.contains(&format!("interrupted by {name} after")) && err.contains("of 30 cases"),
        "{err}"
    );
    assert!(err.contains("left as they were"), "{err}");
    assert_eq!(snapshot(dir.path()), before, "the outputs changed");
    assert_eq!(snapshot(&d), before_d, "the dump directory changed");
    assert!(sha256sum_ok(&d));
}

// 5b. SIGINT and SIGTERM stop at a case boundary and write nothing.
#[test]
fn sigint_stops_at_a_case_boundary_and_keeps_old_outputs() {
    interrupt_keeps_old_outputs(libc::SIGINT, 130, "SIGINT");
}

#[test]
fn sigterm_stops_at_a_case_boundary_and_keeps_old_outputs() {
    interrupt_keeps_old_outputs(libc::SIGTERM, 143, "SIGTERM");
}

// 6. An output may not be an input, nor another output.
#[test]
fn outputs_that_are_inputs_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let exp = write(dir.path(), "one.toml", ONE);
    let r = dir.path().join("r.json");
    // The experiment itself, spelt differently.
    let err = stderr_of(
        &fp()
            .current_dir(dir.path())
            .args(["run", "--backend", "cpu", "--out", "./one.toml", "one.toml"])
            .assert()
            .code(2),
    );
    assert!(err.contains("refusing to overwrite"), "{err}");
    assert_eq!(std::fs::read_to_string(&exp).unwrap(), ONE);
    fp().args(["run", "--backend", "cpu", "--junit"])
        .arg(&exp)
        .arg(&exp)
        .assert()
        .code(2);
    assert_eq!(std::fs::read_to_string(&exp).unwrap(), ONE);
    // --junit onto --out.
    fp().args(["run", "--backend", "cpu", "--out"])
        .arg(&r)
        .arg("--junit")
        .arg(&r)
        .arg(&exp)
        .assert()
        .code(2)
        .stderr(predicate::str::contains("refusing to overwrite"));
    assert!(!r.exists());
    // attest R --out R.
    fp().args(["run", "--backend", "cpu", "--out"])
        .arg(&r)
        .arg(&exp)
        .assert()
        .success();
    let before = std::fs::read(&r).unwrap();
    fp().arg("attest")
        .arg(&r)
        .arg("--out")
        .arg(&r)
        .assert()
        .code(2)
        .stderr(predicate::str::contains("refusing to overwrite"));
    assert_eq!(std::fs::read(&r).unwrap(), before);
    // --out inside the dump directory it would replace.
    fp().args(["run", "--backend", "cpu", "--dump"])
        .arg(dir.path().join("d"))
        .arg("--out")
        .arg(dir.path().join("d").join("r.json"))
        .arg(&exp)
        .assert()
        .code(2);
}

// 7. Output paths and every case's memory are checked before any work.
#[test]
fn outputs_and_memory_are_checked_before_any_work() {
    let dir = tempfile::tempdir().unwrap();
    let exp = write(dir.path(), "one.toml", ONE);
    let d = dir.path().join("d");
    let err = stderr_of(
        &fp()
            .args(["run", "--backend", "cpu", "--dump"])
            .arg(&d)
            .arg("--out")
            .arg(dir.path().join("no/such/dir/r.json"))
            .arg(&exp)
            .assert()
            .code(2),
    );
    assert!(err.contains("no/such/dir"), "{err}");
    assert!(!d.exists(), "dumps were written before the --out check");
    // audit, too, checks its --out before starting any configuration.
    let t0 = std::time::Instant::now();
    fp().args(["audit", "audits/cpu.toml", "--out"])
        .arg(dir.path().join("no/such/dir/audit.json"))
        .assert()
        .code(2)
        .stderr(predicate::str::contains("cannot write there"));
    assert!(t0.elapsed() < std::time::Duration::from_secs(5));
    // A small case first, then one that can never fit.
    let two = write(
        dir.path(),
        "two.toml",
        "name = \"two\"\n[[case]]\nid = \"small\"\nworld = 3\narenas = [100]\n\
         [[case]]\nid = \"big\"\nworld = 64\narenas = [4000000000]\n",
    );
    let t0 = std::time::Instant::now();
    fp().args(["run", "--backend", "cpu", "--dump"])
        .arg(&d)
        .arg(&two)
        .assert()
        .code(3)
        .stderr(predicate::str::contains("case `big` needs"));
    assert!(
        !d.exists(),
        "the small case ran before the big one was refused"
    );
    assert!(t0.elapsed() < std::time::Duration::from_secs(20));
    assert_eq!(listing(dir.path()), ["one.toml", "two.toml"]);
}

// Issue 20, High 1: a directory foldprint did not make is never replaced,
// even one holding only `*.bin` files.
#[test]
fn a_directory_of_someone_elses_bin_files_survives() {
    let dir = tempfile::tempdir().unwrap();
    let exp = write(dir.path(), "one.toml", ONE);
    let models = dir.path().join("models");
    std::fs::create_dir(&models).unwrap();
    std::fs::write(models.join("pytorch_model.bin"), vec![7u8; 100_000]).unwrap();
    let a = fp()
        .args(["run", "--backend", "cpu", "--dump"])
        .arg(&models)
        .arg(&exp)
        .assert()
        .code(2);
    assert!(
        stderr_of(&a).contains("FOLDPRINT-DUMP.json"),
        "{}",
        stderr_of(&a)
    );
    assert_eq!(listing(&models), ["pytorch_model.bin"]);
    assert_eq!(
        std::fs::read(models.join("pytorch_model.bin")).unwrap(),
        vec![7u8; 100_000]
    );
    // A directory foldprint made is replaced.
    let d = dir.path().join("d");
    for _ in 0..2 {
        fp().args(["run", "--backend", "cpu", "--dump"])
            .arg(&d)
            .arg(&exp)
            .assert()
            .success();
    }
    assert!(sha256sum_ok(&d));
    // A file of the user's dropped into that directory is not one of its
    // dumps (SHA256SUMS does not list it): refused, and kept.
    std::fs::write(d.join("checkpoint.bin"), b"weights").unwrap();
    let before = snapshot(&d);
    let a = fp()
        .args(["run", "--backend", "cpu", "--dump"])
        .arg(&d)
        .arg(&exp)
        .assert()
        .code(2);
    assert!(
        stderr_of(&a).contains("`checkpoint.bin`, which its SHA256SUMS does not list"),
        "{}",
        stderr_of(&a)
    );
    assert_eq!(snapshot(&d), before);
}

// Issue 20, High 2: a name too long for its temp file fails before the
// dumps are touched.
#[test]
fn a_too_long_out_name_fails_before_the_dumps_are_touched() {
    let dir = tempfile::tempdir().unwrap();
    let exp = write(dir.path(), "one.toml", ONE);
    let d = dir.path().join("d");
    fp().args(["run", "--backend", "cpu", "--dump"])
        .arg(&d)
        .arg(&exp)
        .assert()
        .success();
    let before = snapshot(&d);
    let long = dir.path().join("x".repeat(245));
    fp().args(["run", "--backend", "cpu", "--dump"])
        .arg(&d)
        .arg("--out")
        .arg(&long)
        .arg(&exp)
        .assert()
        .code(2);
    assert_eq!(snapshot(&d), before);
    assert_eq!(listing(dir.path()), ["d", "one.toml"]);
}

/// Under an address-space limit just above what the preflight counts, a
/// run used to abort (134, "memory allocation failed") with its staging
/// directory left behind. Find the lowest limit that runs, then every limit
/// in the 2 MiB below it must refuse cleanly (3) and leave nothing.
#[test]
fn a_tight_address_space_limit_refuses_and_never_aborts() {
    let bin = crate::common::bin_path();
    let dir = tempfile::tempdir().unwrap();
    let run = |kib: u64| -> i32 {
        let _ = std::fs::remove_dir_all(dir.path().join("d"));
        let st = std::process::Command::new("bash")
            .arg("-c")
            .arg(format!(
                "ulimit -v {kib}; exec \"$0\" run experiments/smoke.toml --backend cpu --dump \"$1\" >/dev/null 2>&1"
            ))
            .arg(&bin)
            .arg(dir.path().join("d"))
            .status()
            .unwrap();
        st.code().unwrap_or(128 + 100)
    };
    // The lowest passing limit, to 100 KiB, between 4 MiB and 1 GiB.
    let (mut lo, mut hi) = (4 << 10, 1 << 20);
    assert_eq!(run(hi), 0, "the run must pass with 1 GiB of address space");
    while hi - lo > 100 {
        let mid = (lo + hi) / 2;
        if run(mid) == 0 {
            hi = mid;
        } else {
            lo = mid;
        }
    }
    for kib in (hi.saturating_sub(2048)..hi).step_by(50) {
        let code = run(kib);
        assert!(code == 0 || code == 3, "ulimit -v {kib}: exit {code}");
        let left: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n != "d")
            .collect();
        assert!(left.is_empty(), "ulimit -v {kib}: left {left:?}");
    }
}
