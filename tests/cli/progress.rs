//! A long run is never silent: on a terminal the progress line keeps
//! ticking while a case runs; piped, each case's row arrives when the case
//! finishes. Reports name the commit they were built from.

use std::io::BufRead;
use std::path::PathBuf;

use crate::common::{write, SLOW};

fn bin() -> PathBuf {
    assert_cmd::cargo::cargo_bin("foldprint")
}

#[test]
fn piped_rows_stream_as_cases_finish() {
    let dir = tempfile::tempdir().unwrap();
    let exp = write(dir.path(), "slow.toml", SLOW);
    let mut child = std::process::Command::new(bin())
        .args(["run", "--backend", "cpu"])
        .arg(&exp)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = std::io::BufReader::new(child.stdout.take().unwrap()).lines();
    let first_row = lines
        .by_ref()
        .map(|l| l.unwrap())
        .find(|l| l.starts_with("  ok ") || l.starts_with("  FAIL "))
        .expect("a case row");
    let t_row = std::time::Instant::now();
    assert!(first_row.contains("s[seed=1]"), "{first_row}");
    let rest: Vec<String> = lines.map(|l| l.unwrap()).collect();
    let t_end = std::time::Instant::now();
    assert!(child.wait().unwrap().success());
    // The first row came while the other 29 cases were still to run.
    assert!(
        t_end - t_row > std::time::Duration::from_secs(1),
        "the first row arrived only {:?} before the end",
        t_end - t_row
    );
    assert_eq!(
        rest.iter().filter(|l| l.starts_with("  ok ")).count(),
        29,
        "{rest:?}"
    );
    assert!(rest.iter().any(|l| l.starts_with("ok: 30 cases")));
}

/// `verify` piped streams its rows too, before its verdict.
#[test]
fn piped_verify_rows_stream_as_cases_finish() {
    let dir = tempfile::tempdir().unwrap();
    let exp = write(dir.path(), "slow.toml", SLOW);
    let gold = dir.path().join("golden");
    let made = std::process::Command::new(bin())
        .arg("golden")
        .arg(&exp)
        .arg("--golden")
        .arg(&gold)
        .output()
        .unwrap();
    assert!(made.status.success(), "{made:?}");
    let mut child = std::process::Command::new(bin())
        .args(["verify", "--backend", "cpu", "--golden"])
        .arg(&gold)
        .arg(&exp)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = std::io::BufReader::new(child.stdout.take().unwrap()).lines();
    lines
        .by_ref()
        .map(|l| l.unwrap())
        .find(|l| l.starts_with("  ok "))
        .expect("a case row");
    let t_row = std::time::Instant::now();
    let rest: Vec<String> = lines.map(|l| l.unwrap()).collect();
    let t_end = std::time::Instant::now();
    assert!(child.wait().unwrap().success());
    assert!(
        t_end - t_row > std::time::Duration::from_secs(1),
        "the first row arrived only {:?} before the end",
        t_end - t_row
    );
    assert!(
        rest.iter().any(|l| l.starts_with("verify ok: 30 cases")),
        "{rest:?}"
    );
}

#[test]
fn a_terminal_shows_progress_while_a_long_case_runs() {
    let dir = tempfile::tempdir().unwrap();
    // One case of about a second or more, then a short one.
    let exp = write(
        dir.path(),
        "two.toml",
        "name = \"two\"\n[defaults]\nworld = 8\n[[case]]\nid = \"long\"\narenas = [8388608]\nrounds = 4\n\
         [[case]]\nid = \"short\"\narenas = [100]\n",
    );
    // Run under a pseudo-terminal and record what it draws, with times.
    let script = r#"
import os, pty, sys, time
pid, fd = pty.fork()
if pid == 0:
    os.execv(sys.argv[1], sys.argv[1:])
out = b""
while True:
    try:
        d = os.read(fd, 65536)
    except OSError:
        break
    if not d:
        break
    out += d
os.waitpid(pid, 0)
sys.stdout.write(out.decode("utf-8", "replace"))
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
    // The progress line for the long case is redrawn while it runs (the
    // spinner ticks), not drawn once and left still.
    let draws = text.matches("[0/2] two/long").count();
    assert!(draws >= 2, "{draws} draw(s) during the long case: {text:?}");
    assert!(text.contains("ok: 2 cases"), "{text:?}");
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
