//! Helpers every command-line test file shares. Each test crate uses only
//! some of them, hence the `dead_code` allowances.

pub mod rank_files;

use assert_cmd::Command;
use std::path::{Path, PathBuf};

/// The path of the foldprint binary under test: this build's, or the one
/// `FOLDPRINT_TEST_BIN` names (to run these tests against an older build and
/// see which of them it fails).
#[allow(dead_code)]
pub fn bin_path() -> PathBuf {
    match std::env::var_os("FOLDPRINT_TEST_BIN") {
        Some(p) if !p.is_empty() => PathBuf::from(p),
        _ => assert_cmd::cargo::cargo_bin("foldprint"),
    }
}

/// The foldprint binary under test (see [`bin_path`]). This build's goes
/// through assert_cmd, which also honours a cross-compiling runner
/// (`CARGO_TARGET_<TRIPLE>_RUNNER`, as ci/cross-arch.sh sets for qemu-user).
#[allow(dead_code)]
pub fn fp() -> Command {
    match std::env::var_os("FOLDPRINT_TEST_BIN") {
        Some(p) if !p.is_empty() => Command::new(p),
        _ => Command::cargo_bin("foldprint").unwrap(),
    }
}

/// A TCP port on loopback that was free a moment ago, for a rank 0 to
/// listen on.
#[allow(dead_code)]
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Write `text` to `dir/name` and return the path.
#[allow(dead_code)]
pub fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    p
}

/// W = 3, two small arenas, three delivery orders for a fixed-order group
/// and its arrival-order control.
#[allow(dead_code)]
pub const TINY: &str = r#"
name = "tiny"
[defaults]
world = 3
arenas = [257, 5]
seed = 7
[[sweep]]
id = "o"
order = ["ascending", "descending", [1, 2, 0]]
contract = ["fixed-order", "arrival-order"]
"#;

/// 30 cases of about 0.1-0.2 s each on a 2-core machine: long enough to
/// interrupt a run or watch its progress.
#[allow(dead_code)]
pub const SLOW: &str = r#"
name = "slow"
[defaults]
world = 8
arenas = [1048576]
[[sweep]]
id = "s"
seed = [1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20,21,22,23,24,25,26,27,28,29,30]
"#;

/// A report and dump directory that foldprint itself wrote.
#[allow(dead_code)]
pub struct RunOutputs {
    pub report: PathBuf,
    pub dump: PathBuf,
}

/// `run --backend cpu EXPERIMENT --out DIR/NAME.json --dump DIR/NAME`,
/// which must pass: the outputs tests read, edit or compare.
#[allow(dead_code)]
pub fn run_outputs(dir: &Path, experiment: &Path, name: &str) -> RunOutputs {
    let report = dir.join(format!("{name}.json"));
    let dump = dir.join(name);
    fp().args(["run", "--backend", "cpu", "--out"])
        .arg(&report)
        .arg("--dump")
        .arg(&dump)
        .arg(experiment)
        .assert()
        .success();
    RunOutputs { report, dump }
}

/// `foldprint run --backend cpu --out OUT EXPERIMENT`, as it ended.
#[allow(dead_code)]
pub fn run_cpu(
    experiment: impl AsRef<std::ffi::OsStr>,
    out: impl AsRef<std::ffi::OsStr>,
) -> std::process::Output {
    fp().args(["run", "--backend", "cpu", "--out"])
        .arg(out)
        .arg(experiment)
        .output()
        .unwrap()
}

/// Run `experiment` twice (`a`, `b`) and check that `compare` finds the
/// two reports in agreement: the baseline a test then breaks one thing of.
#[allow(dead_code)]
pub fn run_twice_agreeing(dir: &Path, experiment: &Path) -> (RunOutputs, RunOutputs) {
    let (a, b) = (
        run_outputs(dir, experiment, "a"),
        run_outputs(dir, experiment, "b"),
    );
    fp().arg("compare")
        .arg(&a.report)
        .arg(&b.report)
        .assert()
        .success()
        .stdout(predicates::str::contains("agree"));
    (a, b)
}

/// A directory's entry names, sorted.
#[allow(dead_code)]
pub fn listing(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    v.sort();
    v
}
