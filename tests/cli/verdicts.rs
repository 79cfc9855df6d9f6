//! What the command line says at a glance must be the whole truth: an
//! `expect` verdict under the run's NaN policy, a `verify` row of a case
//! that differs from its golden, JUnit's skipped cases, the hints of a
//! wrong `--golden` or `--backend`, and a run waiting for another run's
//! output lock that a signal must end.

use crate::common::rank_files::{self, T};
use crate::common::{fp, listing, write};
use serde_json::Value;
use std::path::Path;
use std::time::{Duration, Instant};

fn text_of(o: &std::process::Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

const NAN_CASE: &str = r#"
name = "nan"
[[case]]
id = "c"
addends = "rank{rank}.safetensors"
expect = "expected.safetensors"
"#;

/// Two ranks whose sum is inf + -inf in element 0 (a NaN whose bits the
/// CPU chooses: 0xffc00000 on x86) and plain numbers elsewhere, and an
/// expect file holding `expected`.
fn nan_inputs(dir: &Path, expected: &[f32]) {
    rank_files::write_safetensors(
        &dir.join("rank0.safetensors"),
        &[T::f32("t", &[4], &[f32::INFINITY, 1.0, 2.0, 3.0])],
    );
    rank_files::write_safetensors(
        &dir.join("rank1.safetensors"),
        &[T::f32("t", &[4], &[f32::NEG_INFINITY, 1.0, 2.0, 3.0])],
    );
    rank_files::write_safetensors(
        &dir.join("expected.safetensors"),
        &[T::f32("t", &[4], expected)],
    );
}

fn run_nan(dir: &Path, policy: &str) -> (Option<i32>, String, Value) {
    let exp = write(dir, "nan.toml", NAN_CASE);
    let out = dir.join("r.json");
    let o = fp()
        .args(["run", "--backend", "cpu", "--nan-policy", policy, "--out"])
        .arg(&out)
        .arg(&exp)
        .output()
        .unwrap();
    let r: Value = serde_json::from_slice(&std::fs::read(&out).unwrap()).unwrap();
    (o.status.code(), text_of(&o), r)
}

/// Finding 1: the canonical NaN policy (the default) makes every NaN one
/// NaN for `expect` as for the digests; `preserve` compares the bits.
#[test]
fn expect_compares_nans_under_the_runs_nan_policy() {
    let dir = tempfile::tempdir().unwrap();
    // The quiet NaN most frameworks write, whatever the CPU made of inf + -inf.
    nan_inputs(dir.path(), &[f32::from_bits(0x7fc0_0000), 2.0, 4.0, 6.0]);
    let (code, text, r) = run_nan(dir.path(), "canonical");
    assert_eq!(code, Some(0), "{text}");
    assert!(
        text.contains("expect: case `c` equals expected.safetensors bit for bit"),
        "{text}"
    );
    assert_eq!(r["cases"][0]["expect"]["equal"], true, "{}", r["cases"][0]);
    assert_eq!(r["cases"][0]["expect"]["arenas"][0]["differing"], 0);

    // Negative control: a NaN payload no arithmetic makes. Equal under
    // canonical, a difference under preserve, on any CPU.
    nan_inputs(dir.path(), &[f32::from_bits(0x7fd0_0123), 2.0, 4.0, 6.0]);
    let (code, text, _) = run_nan(dir.path(), "canonical");
    assert_eq!(code, Some(0), "{text}");
    let (code, text, r) = run_nan(dir.path(), "preserve");
    assert_eq!(code, Some(1), "{text}");
    assert!(text.contains("  DIFF c"), "{text}");
    let a = &r["cases"][0]["expect"]["arenas"][0];
    assert_eq!(a["differing"], 1, "{a}");
    assert_eq!(a["first"][0]["index"], 0, "{a}");
    assert_eq!(a["first"][0]["right"], 0x7fd0_0123u32, "{a}");

    // A real difference stays one under canonical: one ULP in element 2,
    // and only there (the NaN of element 0 is equal).
    let off = f32::from_bits(4.0f32.to_bits() + 1);
    nan_inputs(dir.path(), &[f32::from_bits(0x7fc0_0000), 2.0, off, 6.0]);
    let (code, text, r) = run_nan(dir.path(), "canonical");
    assert_eq!(code, Some(1), "{text}");
    let a = &r["cases"][0]["expect"]["arenas"][0];
    assert_eq!(a["differing"], 1, "{a}");
    assert_eq!(a["max_ulp"], 1, "{a}");
    assert_eq!(a["first"][0]["index"], 2, "{a}");
}

/// Two experiments, each with a case `c`, and their goldens.
fn two_experiments(dir: &Path) -> (Vec<std::path::PathBuf>, std::path::PathBuf) {
    let exps = vec![
        write(
            dir,
            "one.toml",
            "name = \"one\"\n[defaults]\nworld = 3\narenas = [100]\n[[case]]\nid = \"c\"\nseed = 1\n[[case]]\nid = \"d\"\nseed = 2\n",
        ),
        write(
            dir,
            "two.toml",
            "name = \"two\"\n[defaults]\nworld = 3\narenas = [100]\n[[case]]\nid = \"c\"\nseed = 3\n",
        ),
    ];
    let golden = dir.join("golden");
    fp().args(["golden", "--golden"])
        .arg(&golden)
        .args(&exps)
        .assert()
        .success();
    (exps, golden)
}

/// The testcase elements of a JUnit file, by classname, with their body.
fn testcases(xml: &str) -> Vec<(String, String)> {
    xml.split("<testcase ")
        .skip(1)
        .map(|t| {
            let class = t
                .split("classname=\"")
                .nth(1)
                .and_then(|r| r.split('"').next())
                .unwrap_or_default()
                .to_string();
            let body = t
                .split("</testcase>")
                .next()
                .unwrap_or_default()
                .to_string();
            (class, body)
        })
        .collect()
}

/// Finding 3: a case that differs from its golden says so on its row and
/// in its own JUnit testcase (not a same-named case of another
/// experiment), and the verdict line never says every check passed.
#[test]
fn verify_marks_the_row_and_testcase_of_a_case_that_differs_from_its_golden() {
    let dir = tempfile::tempdir().unwrap();
    let (exps, golden) = two_experiments(dir.path());
    let junit = dir.path().join("j.xml");
    let verify = || {
        fp().args(["verify", "--backend", "cpu", "--golden"])
            .arg(&golden)
            .arg("--junit")
            .arg(&junit)
            .args(&exps)
            .output()
            .unwrap()
    };
    // Control: the goldens as written verify.
    let o = verify();
    assert_eq!(o.status.code(), Some(0), "{}", text_of(&o));
    assert!(text_of(&o).contains("every check passed"));

    // One digest of experiment `one`'s case `c` edited.
    let path = golden.join("one.json");
    let mut g: Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    let d = g["cases"][0]["arenas"][0].as_str().unwrap().to_string();
    assert_eq!(g["cases"][0]["id"], "c");
    let edited = format!("{}{}", if d.starts_with('0') { '1' } else { '0' }, &d[1..]);
    g["cases"][0]["arenas"][0] = Value::String(edited.clone());
    std::fs::write(&path, serde_json::to_string_pretty(&g).unwrap()).unwrap();

    let o = verify();
    let (stdout, text) = (String::from_utf8_lossy(&o.stdout).to_string(), text_of(&o));
    assert_eq!(o.status.code(), Some(1), "{text}");
    let rows: Vec<&str> = stdout
        .lines()
        .filter(|l| l.starts_with("  ok ") || l.starts_with("  FAIL "))
        .collect();
    assert_eq!(rows.len(), 3, "{stdout}");
    let failing: Vec<&&str> = rows.iter().filter(|l| l.starts_with("  FAIL")).collect();
    assert_eq!(failing.len(), 1, "one row FAIL:\n{stdout}");
    // The failing row is experiment one's `c`: the first row, with the
    // line under it naming the golden's digest.
    assert!(rows[0].starts_with("  FAIL c "), "{stdout}");
    assert!(
        stdout.contains(&format!(
            "       arena 0: digest {} but golden {} says {}",
            &d[..16],
            path.display(),
            &edited[..16]
        )),
        "{stdout}"
    );
    assert!(!stdout.contains("every check passed"), "{stdout}");
    assert!(stdout.contains("verify FAILED: 1 problem(s)"), "{stdout}");

    let xml = std::fs::read_to_string(&junit).unwrap();
    assert!(xml.contains("failures=\"1\""), "{xml}");
    for (class, body) in testcases(&xml) {
        assert_eq!(
            body.contains("<failure "),
            class == "one.c",
            "{class}: {body}\n{xml}"
        );
    }
}

/// Finding 4: a case the backend skips is a JUnit testcase of its own,
/// `<skipped>` with the reason, counted in `tests` and `skipped`.
#[test]
fn junit_lists_skipped_cases_as_skipped() {
    let dir = tempfile::tempdir().unwrap();
    let exp = write(
        dir.path(),
        "mixed.toml",
        "name = \"mixed\"\n[defaults]\nworld = 2\narenas = [64]\n[[case]]\nid = \"run\"\n\
         [[case]]\nid = \"nccl\"\ncontract = \"nccl-allreduce\"\n",
    );
    let junit = dir.path().join("j.xml");
    let out = dir.path().join("r.json");
    let o = fp()
        .args(["run", "--backend", "cpu", "--junit"])
        .arg(&junit)
        .arg("--out")
        .arg(&out)
        .arg(&exp)
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", text_of(&o));
    let r: Value = serde_json::from_slice(&std::fs::read(&out).unwrap()).unwrap();
    let reason = r["skipped"][0]["reason"].as_str().unwrap().to_string();
    let ran = r["cases"].as_array().unwrap().len() + r["groups"].as_array().unwrap().len();
    let xml = std::fs::read_to_string(&junit).unwrap();
    let counts = format!("tests=\"{}\" failures=\"0\" skipped=\"1\"", ran + 1);
    assert_eq!(xml.matches(&counts).count(), 2, "{counts} in {xml}");
    let cases = testcases(&xml);
    assert_eq!(cases.len(), ran + 1, "{xml}");
    let skipped: Vec<&(String, String)> = cases
        .iter()
        .filter(|(_, b)| b.contains("<skipped "))
        .collect();
    assert_eq!(skipped.len(), 1, "{xml}");
    assert_eq!(skipped[0].0, "mixed.nccl", "{xml}");
    assert!(
        skipped[0]
            .1
            .contains(&format!("<skipped message=\"{reason}\"/>")),
        "{xml}"
    );
}

/// Finding 5: `--golden` naming a file is a usage error whose hint says
/// what the flag takes; `--backend gpu` is told the GPU backends.
#[test]
fn a_wrong_golden_or_backend_gets_the_right_hint() {
    let dir = tempfile::tempdir().unwrap();
    let exp = write(
        dir.path(),
        "e.toml",
        "name = \"e\"\n[[case]]\nid = \"c\"\nworld = 3\narenas = [10]\n",
    );
    let file = write(dir.path(), "e.json", "{}");
    for cmd in ["verify", "golden"] {
        let mut c = fp();
        c.arg(cmd);
        if cmd == "verify" {
            c.args(["--backend", "cpu"]);
        }
        let o = c.arg("--golden").arg(&file).arg(&exp).output().unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{cmd}: {err}");
        assert!(err.contains("is not a directory"), "{cmd}: {err}");
        assert!(
            err.contains("--golden takes the directory of goldens")
                && err.contains("experiments/golden"),
            "{cmd}: {err}"
        );
        assert!(!err.contains("generate it with"), "{cmd}: {err}");
        assert_eq!(std::fs::read_to_string(&file).unwrap(), "{}", "{cmd}");
    }
    let e = exp.to_str().unwrap();
    for args in [
        vec!["run", e],
        vec!["verify", "--golden", "g", e],
        vec!["bench"],
    ] {
        let o = fp()
            .args(&args)
            .args(["--backend", "gpu"])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {err}");
        assert!(
            err.contains("`cuda`") && err.contains("`nccl`"),
            "{args:?}: {err}"
        );
        assert!(!err.contains("'cpu'"), "{args:?}: {err}");
    }
    // Control: another wrong value keeps clap's own message.
    let o = fp()
        .args(["run", "--backend", "cpy"])
        .arg(&exp)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(
        err.contains("possible values: auto, cpu, cuda, nccl"),
        "{err}"
    );
}

/// Holds `.NAME.lock` the way another run's output lock is held.
struct HeldLock {
    _file: std::fs::File,
}

fn hold_lock(path: &Path) -> HeldLock {
    use std::os::fd::AsRawFd;
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(path)
        .unwrap();
    // SAFETY: flock on a descriptor this test owns.
    let locked = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
    assert_eq!(locked, 0);
    HeldLock { _file: file }
}

/// Wait for `child` until `deadline`; then, if it is still running,
/// `None` (killed first when `kill`).
fn wait_until(
    child: &mut std::process::Child,
    deadline: Instant,
    kill: bool,
) -> Option<std::process::ExitStatus> {
    loop {
        if let Some(s) = child.try_wait().unwrap() {
            return Some(s);
        }
        if Instant::now() > deadline {
            if kill {
                let _ = child.kill();
                let _ = child.wait();
            }
            return None;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Finding 6: a run waiting for another run's output lock ends at a signal
/// (128+N) promptly, leaves the other run's lock file alone and leaves
/// nothing of its own (it holds the JUnit file's lock while it waits for
/// the report's).
#[test]
fn a_signal_ends_the_wait_for_another_runs_output_lock() {
    use std::io::BufRead;
    for (sig, code) in [(libc::SIGTERM, 143), (libc::SIGINT, 130)] {
        let dir = tempfile::tempdir().unwrap();
        let exp = write(
            dir.path(),
            "e.toml",
            "name = \"e\"\n[[case]]\nid = \"c\"\nworld = 3\narenas = [10]\n",
        );
        let lock = dir.path().join(".r.json.lock");
        let held = hold_lock(&lock);
        let before = listing(dir.path());
        let mut child = std::process::Command::new(crate::common::bin_path())
            .args(["run", "--backend", "cpu", "--out"])
            .arg(dir.path().join("r.json"))
            .arg("--junit")
            .arg(dir.path().join("j.xml"))
            .arg(&exp)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        // Its stderr says when it waits (read on a thread, so a run that
        // never says it cannot hang the test).
        let stderr = child.stderr.take().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        let reader = std::thread::spawn(move || {
            let mut all = String::new();
            for line in std::io::BufReader::new(stderr).lines() {
                let line = line.unwrap_or_default();
                if line.contains("waiting for another foldprint run writing") {
                    let _ = tx.send(());
                }
                all.push_str(&line);
                all.push('\n');
            }
            all
        });
        if rx.recv_timeout(Duration::from_secs(60)).is_err() {
            let _ = child.kill();
            panic!("the run never waited: {}", reader.join().unwrap());
        }
        // It holds the lock of the output it locked first.
        assert!(dir.path().join(".j.xml.lock").exists());
        // SAFETY: signalling our own child.
        unsafe { libc::kill(child.id() as i32, sig) };
        let mut status = wait_until(&mut child, Instant::now() + Duration::from_secs(5), false);
        if status.is_none() {
            // As a user would: signal again, which ends any run at once.
            // SAFETY: signalling our own child.
            unsafe { libc::kill(child.id() as i32, sig) };
            let again = wait_until(&mut child, Instant::now() + Duration::from_secs(5), true);
            let left = listing(dir.path());
            let err = reader.join().unwrap();
            panic!(
                "signal {sig}: still waiting for the lock 5 s after the signal; \
                 after a second one: {again:?}, left {left:?}: {err}"
            );
        }
        let status = status.take().unwrap();
        let err = reader.join().unwrap();
        assert_eq!(status.code(), Some(code), "{err}");
        assert!(err.contains("nothing was written"), "{err}");
        // The other run's lock file is where it was; nothing else appeared
        // (no lock file of its own).
        assert_eq!(listing(dir.path()), before, "{err}");
        assert!(lock.exists());
        drop(held);
    }
}

/// A second signal ends a run at once; the lock files of its outputs go
/// with its staging files. The run is stopped (SIGSTOP) while both signals
/// are sent, so that both are pending at once whatever the machine's load.
#[test]
fn a_second_signal_leaves_no_lock_file() {
    let dir = tempfile::tempdir().unwrap();
    let exp = write(dir.path(), "slow.toml", crate::common::SLOW);
    let mut child = std::process::Command::new(crate::common::bin_path())
        .args(["run", "--backend", "cpu", "--out"])
        .arg(dir.path().join("r.json"))
        .arg("--junit")
        .arg(dir.path().join("j.xml"))
        .arg(&exp)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    // Both lock files exist once the outputs are locked, before the first
    // case (30 cases follow).
    let t0 = Instant::now();
    while !(dir.path().join(".r.json.lock").exists() && dir.path().join(".j.xml.lock").exists()) {
        assert!(t0.elapsed() < Duration::from_secs(60), "never locked");
        std::thread::sleep(Duration::from_millis(5));
    }
    // Into its first case (the signals are then handled well before the
    // next case boundary).
    std::thread::sleep(Duration::from_millis(200));
    let pid = child.id() as i32;
    // SAFETY: signalling our own child.
    unsafe {
        libc::kill(pid, libc::SIGSTOP);
        libc::kill(pid, libc::SIGINT);
        libc::kill(pid, libc::SIGTERM);
        libc::kill(pid, libc::SIGCONT);
    }
    let status = wait_until(&mut child, Instant::now() + Duration::from_secs(30), true)
        .expect("the run ended at the second signal");
    use std::os::unix::process::ExitStatusExt;
    // Ended by the second signal, or (had the first stopped it at a case
    // boundary in the same instant) by the first.
    assert!(
        status.signal().is_some() || matches!(status.code(), Some(130 | 143)),
        "{status:?}"
    );
    assert_eq!(listing(dir.path()), ["slow.toml"]);
}
