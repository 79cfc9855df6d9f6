//! Inputs and outputs a hostile or unlucky user hands foldprint: FIFOs and
//! devices where files belong, a symlinked dump directory, two runs racing
//! on the same outputs, a Ctrl-C as the run finishes, memory running out
//! while reading a dump. Each must end quickly with the documented exit
//! code, never hang, and never leave a mixed or truncated output.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use crate::common::{write, TINY};

fn bin() -> PathBuf {
    crate::common::bin_path()
}

fn mkfifo(path: &Path) {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes()).unwrap();
    // SAFETY: a NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o644) }, 0, "mkfifo");
}

/// Wait for `child` at most `limit`; on overrun kill it and fail the test
/// (a hang is the bug these tests look for).
fn wait_within(mut child: Child, limit: Duration, what: &str) -> Output {
    let t0 = Instant::now();
    loop {
        if child.try_wait().unwrap().is_some() {
            return child.wait_with_output().unwrap();
        }
        if t0.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{what}: still running after {limit:?} (hangs)");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn spawn(dir: &Path, args: &[&str]) -> Child {
    Command::new(bin())
        .current_dir(dir)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// Run with a 30 s deadline; returns (exit code, stderr).
fn run_within(dir: &Path, args: &[&str]) -> (Option<i32>, String) {
    let out = wait_within(spawn(dir, args), Duration::from_secs(30), &args.join(" "));
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn assert_bad_input(dir: &Path, args: &[&str], needle: &str) {
    let (code, err) = run_within(dir, args);
    assert_eq!(code, Some(2), "{args:?}: exit {code:?}, stderr: {err}");
    assert!(err.contains(needle), "{args:?}: want `{needle}` in: {err}");
}

/// A dump directory and report of TINY, made by foldprint itself.
fn tiny_run(dir: &Path) -> (PathBuf, PathBuf) {
    write(dir, "tiny.toml", TINY);
    let (code, err) = run_within(dir, &["run", "tiny.toml", "--out", "r.json", "--dump", "d"]);
    assert_eq!(code, Some(0), "{err}");
    (dir.join("r.json"), dir.join("d"))
}

fn first_bin(d: &Path) -> PathBuf {
    let mut bins: Vec<PathBuf> = std::fs::read_dir(d)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "bin"))
        .collect();
    bins.sort();
    bins.remove(0)
}

#[test]
fn fifo_experiment_report_and_golden_are_refused_without_hanging() {
    let t = tempfile::tempdir().unwrap();
    let dir = t.path();
    let (_, _) = tiny_run(dir);
    mkfifo(&dir.join("fifo.toml"));
    assert_bad_input(dir, &["run", "fifo.toml"], "fifo");
    mkfifo(&dir.join("fifo.json"));
    assert_bad_input(dir, &["compare", "fifo.json", "r.json"], "fifo");
    assert_bad_input(dir, &["attest", "fifo.json", "--out", "st.json"], "fifo");
    let golden = dir.join("golden");
    std::fs::create_dir(&golden).unwrap();
    mkfifo(&golden.join("tiny.json"));
    assert_bad_input(dir, &["verify", "tiny.toml", "--golden", "golden"], "fifo");
    mkfifo(&dir.join("matrix.toml"));
    assert_bad_input(dir, &["audit", "matrix.toml"], "fifo");
}

#[test]
fn fifo_bin_in_a_dump_directory_is_refused_without_hanging() {
    let t = tempfile::tempdir().unwrap();
    let dir = t.path();
    let (_, d) = tiny_run(dir);
    let copy = dir.join("d2");
    std::fs::create_dir(&copy).unwrap();
    for e in std::fs::read_dir(&d).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), copy.join(e.file_name())).unwrap();
    }
    let victim = first_bin(&copy);
    std::fs::remove_file(&victim).unwrap();
    mkfifo(&victim);
    assert_bad_input(dir, &["compare", "d", "d2"], "fifo");
    assert_bad_input(
        dir,
        &["attest", "r.json", "--dump", "d2", "--out", "st.json"],
        "fifo",
    );
}

#[test]
fn bin_symlinked_to_dev_zero_is_refused() {
    let t = tempfile::tempdir().unwrap();
    let dir = t.path();
    let (_, d) = tiny_run(dir);
    let copy = dir.join("d2");
    std::fs::create_dir(&copy).unwrap();
    for e in std::fs::read_dir(&d).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), copy.join(e.file_name())).unwrap();
    }
    let victim = first_bin(&copy);
    std::fs::remove_file(&victim).unwrap();
    std::os::unix::fs::symlink("/dev/zero", &victim).unwrap();
    assert_bad_input(dir, &["compare", "d", "d2"], "character device");
    assert_bad_input(
        dir,
        &["attest", "r.json", "--dump", "d2", "--out", "st.json"],
        "character device",
    );
}

#[test]
fn dump_to_a_symlink_with_a_trailing_slash_is_refused() {
    let t = tempfile::tempdir().unwrap();
    let dir = t.path();
    write(dir, "tiny.toml", TINY);
    let real = dir.join("real");
    std::fs::create_dir(&real).unwrap();
    std::fs::write(real.join("keep.bin"), b"user data").unwrap();
    std::os::unix::fs::symlink(&real, dir.join("link")).unwrap();
    for spelling in ["link/", "link//"] {
        assert_bad_input(
            dir,
            &["run", "tiny.toml", "--dump", spelling],
            "symbolic link",
        );
    }
    assert_eq!(std::fs::read(real.join("keep.bin")).unwrap(), b"user data");
    assert_eq!(std::fs::read_dir(&real).unwrap().count(), 1);
}

/// Every arena digest of the report at `r`, and every `.bin` digest the
/// dump directory's SHA256SUMS lists.
fn digests(r: &Path, d: &Path) -> (BTreeSet<String>, BTreeSet<String>) {
    let report: serde_json::Value = serde_json::from_slice(&std::fs::read(r).unwrap()).unwrap();
    let mut from_report = BTreeSet::new();
    for case in report["cases"].as_array().unwrap() {
        for a in case["arenas"].as_array().unwrap() {
            from_report.insert(a["sha256"].as_str().unwrap().to_string());
        }
    }
    let sums = std::fs::read_to_string(d.join("SHA256SUMS")).unwrap();
    let from_dump = sums
        .lines()
        .filter(|l| l.ends_with(".bin"))
        .map(|l| l.split_whitespace().next().unwrap().to_string())
        .collect();
    (from_report, from_dump)
}

#[test]
fn concurrent_runs_on_the_same_outputs_never_mix() {
    let t = tempfile::tempdir().unwrap();
    let dir = t.path();
    // Same name and case ids, different data: a report of one beside the
    // dumps of the other shows as differing digests.
    write(dir, "a.toml", TINY);
    write(dir, "b.toml", &TINY.replace("seed = 7", "seed = 8"));
    for round in 0..10 {
        let a = spawn(dir, &["run", "a.toml", "--out", "R.json", "--dump", "D"]);
        let b = spawn(dir, &["run", "b.toml", "--out", "R.json", "--dump", "D"]);
        let limit = Duration::from_secs(60);
        let oa = wait_within(a, limit, "run a");
        let ob = wait_within(b, limit, "run b");
        for o in [&oa, &ob] {
            assert_eq!(
                o.status.code(),
                Some(0),
                "round {round}: {}",
                String::from_utf8_lossy(&o.stderr)
            );
        }
        let (rep, dump) = digests(&dir.join("R.json"), &dir.join("D"));
        assert_eq!(
            rep, dump,
            "round {round}: report and dumps of different runs"
        );
        let left: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with('.'))
            .collect();
        assert!(left.is_empty(), "round {round}: left behind {left:?}");
    }
}

/// Ctrl-C at moments spread over a run's end: whenever foldprint says
/// "nothing will be written" it must exit 130 with the old outputs
/// untouched; whenever it exits 0 it must not have said so.
#[test]
fn a_late_sigint_never_both_refuses_and_writes() {
    let t = tempfile::tempdir().unwrap();
    let dir = t.path();
    write(dir, "tiny.toml", TINY);
    // The time a whole run takes, to aim signals at its end: the fastest of
    // three, since a first run (cold caches) or a loaded machine can take
    // several times as long as the runs the signals are aimed at.
    let mut whole = Duration::MAX;
    for _ in 0..3 {
        let t0 = Instant::now();
        let (code, err) = run_within(dir, &["run", "tiny.toml", "--out", "R.json", "--dump", "D"]);
        assert_eq!(code, Some(0), "{err}");
        whole = whole.min(t0.elapsed());
    }
    let mut old_report = std::fs::read(dir.join("R.json")).unwrap();
    let (mut refused, mut written) = (0, 0);
    for i in 0..40u32 {
        let child = spawn(dir, &["run", "tiny.toml", "--out", "R.json", "--dump", "D"]);
        // From 10 % to 244 % of a whole run.
        std::thread::sleep(whole * (10 + 6 * i) / 100);
        // SAFETY: signalling our own child.
        unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGINT) };
        let o = wait_within(child, Duration::from_secs(30), "interrupted run");
        let err = String::from_utf8_lossy(&o.stderr);
        let said_nothing = err.contains("nothing will be written");
        use std::os::unix::process::ExitStatusExt;
        // Killed by the signal itself: it came before the handler was in.
        let code = o.status.code().or(o.status.signal().map(|s| 128 + s));
        match code {
            Some(0) => {
                assert!(!said_nothing, "run {i}: exit 0 after: {err}");
                written += 1;
                old_report = std::fs::read(dir.join("R.json")).unwrap();
            }
            Some(130) => {
                refused += 1;
                // The report carries timings: any rewrite changes it.
                let now = std::fs::read(dir.join("R.json")).unwrap();
                assert!(now == old_report, "run {i}: refused, yet wrote: {err}");
            }
            c => panic!("run {i}: exit {c:?}: {err}"),
        }
    }
    // Both outcomes seen, or the timing did not reach the race at all.
    assert!(
        refused > 0 && written > 0,
        "{refused} refused, {written} written"
    );
}
