//! One exit-code model: documented in README and `--help` alike, and no
//! panic where a clear error or a quiet exit belongs.

use predicates::prelude::*;
use std::os::unix::process::CommandExt;

use crate::common::fp;

fn no_panic() -> impl Predicate<str> {
    predicate::str::contains("panicked").not()
}

/// The rows of README's "Exit codes" table as (code, meaning).
fn readme_codes() -> Vec<(String, String)> {
    let readme = std::fs::read_to_string("README.md").unwrap();
    let section = readme
        .split("## Exit codes")
        .nth(1)
        .expect("README has an Exit codes section");
    section
        .lines()
        .skip_while(|l| !l.starts_with("| code"))
        .skip(2)
        .take_while(|l| l.starts_with('|'))
        .map(|l| {
            let cells: Vec<&str> = l.trim_matches('|').split('|').map(str::trim).collect();
            (cells[0].to_string(), cells[1].to_string())
        })
        .collect()
}

// 11. Every code is documented, the same way, in README and --help.
#[test]
fn exit_codes_are_documented_in_readme_and_help() {
    let rows = readme_codes();
    let codes: Vec<&str> = rows.iter().map(|(c, _)| c.as_str()).collect();
    assert_eq!(codes, ["0", "1", "2", "3", "4", "128+N"]);
    let help = fp().arg("--help").assert().success();
    let help = String::from_utf8_lossy(&help.get_output().stdout).into_owned();
    for (code, meaning) in &rows {
        let line = help
            .lines()
            .find(|l| l.trim_start().starts_with(&format!("{code} ")))
            .unwrap_or_else(|| panic!("--help lacks exit code {code}:\n{help}"));
        assert_eq!(
            line.trim_start()[code.len()..].trim(),
            meaning,
            "exit code {code}"
        );
    }
    // The library's enum gives the same numbers.
    use foldprint::exit::ExitCode;
    let numbers: Vec<i32> = [
        ExitCode::Ok,
        ExitCode::CheckFailed,
        ExitCode::BadInput,
        ExitCode::Unavailable,
        ExitCode::Infrastructure,
    ]
    .iter()
    .map(|c| c.code())
    .collect();
    assert_eq!(numbers, [0, 1, 2, 3, 4]);
}

// 12. bench with zero sizes is a usage error, not a panic.
#[test]
fn bench_rejects_zero_sizes() {
    for args in [["--sha-mib", "0"], ["--world", "0"]] {
        fp().arg("bench")
            .args(args)
            .assert()
            .code(2)
            .stderr(no_panic());
    }
}

// 12. The NCCL sweep's flags: a bad size, factor or dtype, or -b past -e,
// is a usage error named before any GPU or NCCL is touched.
#[test]
fn bench_sweep_flags_are_checked_before_nccl_starts() {
    let cases: [(&[&str], &str); 10] = [
        (&["-b", "1X"], "`1X` is not a size in bytes"),
        (&["-e", "1.5G"], "`1.5G` is not a size in bytes"),
        (&["--minbytes=-4K"], "`-4K` is not a size in bytes"),
        (&["-f", "1"], "-f/--stepfactor 1"),
        (&["-f", "two"], "--stepfactor"),
        (
            &["-d", "fp8"],
            "unknown dtype `fp8` (expected f32, bf16 or f16)",
        ),
        (
            &["-b", "2G", "-e", "1G"],
            "-b/--minbytes 2G is larger than -e/--maxbytes 1G",
        ),
        (
            &["-b", "6", "-e", "1K"],
            "-b/--minbytes 6: a size is a positive whole number of f32 elements",
        ),
        (&["-b", "0", "-d", "bf16"], "-b/--minbytes 0"),
        (
            &["--collective", "gather"],
            "unknown collective `gather` (expected all-reduce or reduce-scatter)",
        ),
    ];
    for (args, says) in cases {
        fp().args(["bench", "--backend", "nccl"])
            .args(args)
            .assert()
            .code(2)
            .stderr(predicate::str::contains(says))
            .stderr(no_panic());
    }
    // The sweep's flags on another backend are refused, not ignored.
    fp().args(["bench", "--backend", "cpu", "-b", "1K", "--csv"])
        .assert()
        .code(2)
        .stderr(predicate::str::contains(
            "-b, --csv belong(s) to the NCCL sweep",
        ));
    fp().args(["bench", "--collective", "reduce-scatter"])
        .assert()
        .code(2)
        .stderr(predicate::str::contains(
            "--collective belong(s) to the NCCL sweep",
        ));
    // Control: an odd size of 16-bit elements is fine for -d bf16 as far
    // as the arguments go (what follows needs NCCL, absent or not here).
    let o = fp()
        .args([
            "bench",
            "--backend",
            "nccl",
            "-b",
            "2",
            "-e",
            "6",
            "-f",
            "3",
            "-d",
            "bf16",
        ])
        .args(["-n", "1"])
        .env("FOLDPRINT_NCCL_LIBRARY", "/nonexistent/libnccl.so.2")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_ne!(o.status.code(), Some(2), "{err}");
    assert!(
        !err.contains("--minbytes") && !err.contains("--maxbytes"),
        "{err}"
    );
    assert!(!err.contains("panicked"), "{err}");
}

// 12. A closed pipe ends the output quietly, with the run's own verdict.
#[test]
fn a_closed_stdout_pipe_is_not_a_panic() {
    let mut child = std::process::Command::new(crate::common::bin_path())
        .args([
            "run",
            "--backend",
            "cpu",
            "--json",
            "experiments/smoke.toml",
        ])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stdout.take()); // the reader went away (`| head -0`)
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{err}");
    assert!(err.is_empty(), "a closed pipe is not an error: {err}");
}

// 12. A full stdout is an error (exit 3) with a message, not a panic.
#[test]
fn a_full_stdout_is_a_clear_error() {
    let full = std::fs::OpenOptions::new()
        .write(true)
        .open("/dev/full")
        .expect("/dev/full");
    let out = std::process::Command::new(crate::common::bin_path())
        .args([
            "run",
            "--backend",
            "cpu",
            "--json",
            "experiments/smoke.toml",
        ])
        .stdout(full)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(3), "{err}");
    assert!(err.contains("cannot write to standard output"), "{err}");
    assert!(!err.contains("panicked"), "{err}");
}

/// `cmd` with the address space limited to `bytes` (as `ulimit -v` does).
fn limited(cmd: &mut std::process::Command, bytes: u64) -> &mut std::process::Command {
    // SAFETY: setrlimit is async-signal-safe; nothing else runs in the child.
    unsafe {
        cmd.pre_exec(move || {
            let lim = libc::rlimit {
                rlim_cur: bytes,
                rlim_max: bytes,
            };
            if libc::setrlimit(libc::RLIMIT_AS, &lim) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        })
    }
}

// 12. Worker threads that cannot start are a missing resource, not a panic.
#[test]
fn a_thread_pool_that_cannot_start_is_exit_3() {
    let mut cmd = std::process::Command::new(crate::common::bin_path());
    cmd.args(["run", "--backend", "cpu", "experiments/smoke.toml"])
        .env("RAYON_NUM_THREADS", "100000");
    let out = limited(&mut cmd, 1 << 30).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(3), "{err}");
    assert!(err.contains("cannot start worker threads"), "{err}");
    assert!(!err.contains("panicked"), "{err}");
}

// 13. Memory checks honour RLIMIT_AS: exit 3 before allocating, not an abort.
#[test]
fn memory_checks_honour_the_address_space_limit() {
    let dir = tempfile::tempdir().unwrap();
    let exp = dir.path().join("big.toml");
    std::fs::write(
        &exp,
        "name = \"big\"\n[[case]]\nid = \"w1\"\nworld = 1\narenas = [2147483648]\n",
    )
    .unwrap();
    let mut cmd = std::process::Command::new(crate::common::bin_path());
    cmd.args(["run", "--backend", "cpu"]).arg(&exp);
    let out = limited(&mut cmd, 4 << 30).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(3), "{err}");
    assert!(
        // The arena's 8 GiB plus the preflight's 4 MiB margin for the
        // allocations the count does not model.
        err.contains("case `w1` needs 8594128896 bytes of address space (RLIMIT_AS)"),
        "{err}"
    );
}

// 13. Inputs have a size cap: a regular file past it is an error, not an
// OOM; a device such as /dev/zero is refused before any read.
#[test]
fn inputs_have_a_size_cap() {
    let dir = tempfile::tempdir().unwrap();
    // Sparse files: their size is what is checked, no data is written.
    let big = |name: &str, bytes: u64| {
        let p = dir.path().join(name);
        std::fs::File::create(&p).unwrap().set_len(bytes).unwrap();
        p
    };
    let exp = big("huge.toml", (4 << 20) + 1);
    fp().args(["run", "--backend", "cpu"])
        .arg(&exp)
        .assert()
        .code(2)
        .stderr(predicate::str::contains(
            "cannot read: larger than the 4 MiB",
        ));
    let report = big("huge.json", (256 << 20) + 1);
    fp().arg("compare")
        .arg(&report)
        .arg(&report)
        .assert()
        .code(2)
        .stderr(predicate::str::contains("larger than the 256 MiB"));
    fp().args(["run", "--backend", "cpu", "/dev/zero"])
        .assert()
        .code(2)
        .stderr(predicate::str::contains(
            "/dev/zero: cannot read: it is a character device; foldprint reads only regular files",
        ));
}
