//! A long run is never silent: on a terminal the progress line keeps
//! ticking while a case runs; piped, each case's row arrives when the case
//! finishes. Reports name the commit they were built from.

use std::io::BufRead;
use std::path::PathBuf;

use crate::common::{write, SLOW};

fn bin() -> PathBuf {
    crate::common::bin_path()
}

/// Stop `child` with SIGINT as soon as its first row is read: if rows are
/// streamed, the run is then still going and stops at a case boundary
/// (exit 130, fewer than all 30 cases done); a run that printed only at
/// its end would already be over. No duration is assumed.
fn first_row_arrives_while_the_run_goes_on(mut child: std::process::Child) -> String {
    let mut lines = std::io::BufReader::new(child.stdout.take().unwrap()).lines();
    let first_row = lines
        .by_ref()
        .map(|l| l.unwrap())
        .find(|l| l.starts_with("  ok ") || l.starts_with("  FAIL "))
        .expect("a case row");
    // SAFETY: signalling the process this test started.
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    let rest: Vec<String> = lines.map(|l| l.unwrap()).collect();
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(130), "{err}\n{rest:?}");
    let done: usize = err
        .split("interrupted by SIGINT after ")
        .nth(1)
        .and_then(|t| t.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no case count in: {err}"));
    assert!((1..30).contains(&done), "{done} of 30 cases: {err}");
    first_row
}

fn slow_child(dir: &std::path::Path, args: &[&str]) -> std::process::Child {
    std::process::Command::new(bin())
        .args(args)
        .current_dir(dir)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap()
}

#[test]
fn piped_rows_stream_as_cases_finish() {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), "slow.toml", SLOW);
    let child = slow_child(dir.path(), &["run", "--backend", "cpu", "slow.toml"]);
    let first_row = first_row_arrives_while_the_run_goes_on(child);
    assert!(first_row.contains("s[seed=1]"), "{first_row}");
    // Negative control: the whole run, unsignalled, prints all 30 rows.
    let all = crate::common::fp()
        .current_dir(dir.path())
        .args(["run", "--backend", "cpu", "slow.toml"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&all.stdout);
    assert_eq!(text.lines().filter(|l| l.starts_with("  ok ")).count(), 30);
    assert!(
        text.lines().any(|l| l.starts_with("ok: 30 cases")),
        "{text}"
    );
}

/// `verify` piped streams its rows too, before its verdict.
#[test]
fn piped_verify_rows_stream_as_cases_finish() {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), "slow.toml", SLOW);
    let made = std::process::Command::new(bin())
        .current_dir(dir.path())
        .args(["golden", "slow.toml", "--golden", "golden"])
        .output()
        .unwrap();
    assert!(made.status.success(), "{made:?}");
    let child = slow_child(
        dir.path(),
        &[
            "verify",
            "--backend",
            "cpu",
            "--golden",
            "golden",
            "slow.toml",
        ],
    );
    first_row_arrives_while_the_run_goes_on(child);
}

#[test]
fn a_terminal_shows_progress_while_a_long_case_runs() {
    let dir = tempfile::tempdir().unwrap();
    // A case far longer than any test waits (1000 rounds of 8 Mi elements
    // at W = 8): the test stops it once it has seen what it looks for, so
    // nothing depends on how fast this machine is.
    let exp = write(
        dir.path(),
        "two.toml",
        "name = \"two\"\n[defaults]\nworld = 8\n[[case]]\nid = \"long\"\narenas = [8388608]\nrounds = 1000\n\
         [[case]]\nid = \"short\"\narenas = [100]\n",
    );
    // Run under a pseudo-terminal and record what it draws; once the
    // progress line has shown two spinner frames (it ticks while the case
    // runs), stop the run (the second SIGINT stops at once). A line drawn
    // and left still never gets there: the script gives up after 120 s.
    let script = r#"
import os, pty, re, signal, sys, time
pid, fd = pty.fork()
if pid == 0:
    os.execv(sys.argv[1], sys.argv[1:])
out = b""
start = time.time()
stopped = False
while True:
    try:
        d = os.read(fd, 65536)
    except OSError:
        break
    if not d:
        break
    out += d
    frames = set(re.findall(r"(\S) \[0/2\] two/long", out.decode("utf-8", "replace")))
    if not stopped and len(frames) >= 2:
        stopped = True
        os.kill(pid, signal.SIGINT)
        time.sleep(0.2)
        os.kill(pid, signal.SIGINT)
    if not stopped and time.time() - start > 120:
        os.kill(pid, signal.SIGKILL)
        break
_, status = os.waitpid(pid, 0)
sys.stdout.write(out.decode("utf-8", "replace"))
sys.stdout.write("\nexit %d\n" % os.waitstatus_to_exitcode(status))
"#;
    let out = std::process::Command::new("python3")
        // A terminal has a type; a build sandbox's environment names none.
        .env("TERM", "xterm-256color")
        .arg("-c")
        .arg(script)
        .arg(bin())
        .args(["run", "--backend", "cpu"])
        .arg(&exp)
        .output()
        .expect("python3 is needed for this test");
    let text = String::from_utf8_lossy(&out.stdout);
    // The spinner ticked while the long case ran: two frames or more.
    let frames: std::collections::BTreeSet<char> = text
        .match_indices(" [0/2] two/long")
        .filter_map(|(i, _)| text[..i].chars().last())
        .collect();
    assert!(frames.len() >= 2, "spinner frames {frames:?}: {text:?}");
    // It was still running when the test stopped it (the second SIGINT
    // ends it by the signal).
    assert!(text.contains("\nexit -2\n"), "{text:?}");
    assert!(!text.contains("ok: 2 cases"), "{text:?}");
}

#[test]
fn reports_record_the_git_commit() {
    let head = std::process::Command::new("git")
        .args(["rev-parse", "HEAD"])
        .output()
        .expect("git");
    assert!(head.status.success(), "the tests run in a git checkout");
    let head = String::from_utf8(head.stdout).unwrap().trim().to_string();
    let out = std::process::Command::new(bin())
        .args([
            "run",
            "--backend",
            "cpu",
            "--json",
            "experiments/smoke.toml",
        ])
        .output()
        .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let git = v["foldprint"]["git"].as_str().unwrap();
    match std::env::var("FOLDPRINT_GIT_REV") {
        // Packaging may stamp its own revision.
        Ok(rev) => assert_eq!(git, rev),
        Err(_) => assert_eq!(git, head),
    }
}
