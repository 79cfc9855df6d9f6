//! `foldprint audit` on the CPU: the committed CPU matrix passes, bad
//! matrices are rejected with file:line:column, a configuration that
//! changes digests fails and names the cells, and the library pinning is
//! exercised end to end (the link directory, LD_LIBRARY_PATH, and the
//! check against what the child reports it mapped) with a stand-in child.

use foldprint::audit::{self, Cell, Status};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use crate::common::{fp, write};

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn json(path: &Path) -> serde_json::Value {
    serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap()
}

/// Two small cases: one whose sums make NaNs (`specials`), one that does not.
const SPECIALS: &str = r#"
name = "sp"
[defaults]
world = 8
arenas = [4099, 3]
seed = 5
[[case]]
id = "nan"
distribution = "specials"
[[case]]
id = "plain"
distribution = "uniform"
"#;

fn cell<'a>(v: &'a serde_json::Value, case_id: &str, config: &str) -> &'a serde_json::Value {
    let row = v["cases"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["id"] == case_id)
        .unwrap_or_else(|| panic!("no case {case_id}"));
    row["cells"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["config"] == config)
        .unwrap_or_else(|| panic!("no cell {config}"))
}

#[test]
fn the_cpu_matrix_passes_and_records_every_configuration() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("audit.json");
    let keep = dir.path().join("keep");
    let a = fp()
        .args(["audit", "audits/cpu.toml", "--out"])
        .arg(&out)
        .arg("--keep")
        .arg(&keep)
        .assert()
        .code(0);
    let stdout = text(&a.get_output().stdout);
    assert!(stdout.contains("audit PASSED"), "{stdout}");
    assert!(stdout.contains("negative controls"), "{stdout}");

    let v = json(&out);
    assert_eq!(v["format"], "foldprint-audit");
    assert_eq!(v["ok"], true);
    assert_eq!(v["exit_code"], 0);
    assert_eq!(v["baseline"], "baseline");
    let configs = v["configurations"].as_array().unwrap();
    assert!(configs.len() >= 5);
    for c in configs {
        assert_eq!(c["status"], "ok", "{}", c["name"]);
        assert_eq!(c["exit_code"], 0);
        assert_eq!(c["backend"], "cpu");
        assert!(c["cases"].as_u64().unwrap() > 40);
    }
    let cases = v["cases"].as_array().unwrap();
    for row in cases {
        for c in row["cells"].as_array().unwrap() {
            let state = c["state"].as_str().unwrap();
            let control =
                configs.iter().find(|x| x["name"] == c["config"]).unwrap()["control"] == true;
            if control {
                assert!(state == "changed" || state == "unchanged", "{c}");
            } else {
                assert!(state == "equal" || state == "baseline", "{row}");
            }
        }
        assert_eq!(row["oracle"]["vs_baseline"]["state"], "equal", "{row}");
    }
    // The NaN-policy control changes exactly the NaN-producing cases.
    assert_eq!(
        cell(&v, "dist[specials]", "nan-preserve")["state"],
        "changed"
    );
    assert_eq!(
        cell(&v, "dist[uniform]", "nan-preserve")["state"],
        "unchanged"
    );
    // The contract's own controls can fail: reversing the fold order of a
    // sensitive fixed-order case changes it, and a blind case cannot.
    let row = |id: &str| cases.iter().find(|r| r["id"] == id).unwrap();
    assert_eq!(
        row("orders[descending,fixed-order]")["oracle"]["arrival_reversed"]["state"],
        "changed"
    );
    assert_eq!(
        row("dist[exact-integers]")["oracle"]["arrival_reversed"]["state"],
        "unchanged"
    );
    // The CPU oracle ran as one more child, `run --backend cpu`, over
    // experiments the audit wrote (one round each), and kept its files.
    let cmd = std::fs::read_to_string(keep.join(".oracle/command.sh")).unwrap();
    assert!(
        cmd.contains(" run --out ")
            && cmd.contains(" --json --backend cpu --nan-policy canonical -- "),
        "{cmd}"
    );
    let oracle = json(&keep.join(".oracle/report.json"));
    assert_eq!(oracle["backend"], "cpu");
    let runs = oracle["cases"].as_array().unwrap();
    assert!(runs.len() > cases.len(), "{} runs", runs.len());
    assert!(runs.iter().all(|c| c["params"]["rounds"] == 1));
    let own = row("orders[descending,fixed-order]")["oracle"]["digests"].clone();
    assert!(
        runs.iter()
            .any(|c| c["params"]["contract"] == "fixed-order" && c["arenas"][0]["sha256"] == own[0]),
        "{own}"
    );
    // The environment reached the child: rayon ran one thread there.
    let r1 = json(&keep.join("threads-1/report.json"));
    assert_eq!(r1["environment"]["backend"]["threads"], 1);
    let cmd = std::fs::read_to_string(keep.join("threads-1/command.sh")).unwrap();
    assert!(cmd.starts_with("RAYON_NUM_THREADS=1 "), "{cmd}");
    assert!(
        cmd.contains(" run --out ")
            && cmd.contains(" --json --backend cpu ")
            && cmd.contains(" --no-kernel-cache "),
        "{cmd}"
    );
}

/// The audit reads children's reports typed: the backend block of a report
/// made now reads back and writes the same bytes.
#[test]
fn a_report_made_now_reads_typed_and_writes_the_same_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("r.json");
    fp().args(["run", "--backend", "cpu", "experiments/smoke.toml", "--out"])
        .arg(&path)
        .assert()
        .code(0);
    let bytes = std::fs::read_to_string(&path).unwrap();
    let r = foldprint::report::Report::read(&path).unwrap();
    let env = r.backend_environment();
    assert_eq!(env.kind, "cpu");
    assert_eq!(env.libraries, None);
    let v: serde_json::Value = serde_json::from_str(&bytes).unwrap();
    assert_eq!(
        serde_json::to_string_pretty(&env).unwrap(),
        serde_json::to_string_pretty(&v["environment"]["backend"]).unwrap()
    );
    // The whole typed environment writes the bytes the run wrote.
    assert_eq!(
        serde_json::to_string_pretty(&r.environment).unwrap(),
        serde_json::to_string_pretty(&v["environment"]).unwrap()
    );
}

#[test]
fn a_requested_nvrtc_that_does_not_exist_is_bad_input() {
    let dir = tempfile::tempdir().unwrap();
    let m = write(
        dir.path(),
        "m.toml",
        "experiments = [\"x.toml\"]\n[defaults]\nbackend = \"cuda\"\n[[config]]\nname = \"nv\"\nnvrtc = \"/no/such/dir/libnvrtc.so.12\"\n",
    );
    let out = dir.path().join("audit.json");
    let a = fp()
        .arg("audit")
        .arg(&m)
        .arg("--out")
        .arg(&out)
        .assert()
        .code(2);
    let err = text(&a.get_output().stderr);
    assert!(err.contains("m.toml:6:9"), "{err}");
    assert!(
        err.contains("`/no/such/dir/libnvrtc.so.12` does not exist"),
        "{err}"
    );
    assert!(!err.contains("panicked"), "{err}");
    assert!(!out.exists(), "a rejected matrix must not write a result");
}

#[test]
fn an_unknown_key_is_named_with_file_line_and_column() {
    let dir = tempfile::tempdir().unwrap();
    let m = write(
        dir.path(),
        "bad.toml",
        "experiments = [\"x.toml\"]\n[defaults]\nbackend = \"cpu\"\n[[config]]\nname = \"a\"\nkernal = \"seed\"\n",
    );
    let a = fp().arg("audit").arg(&m).assert().code(2);
    let err = text(&a.get_output().stderr);
    assert!(err.contains("bad.toml:6:1"), "{err}");
    assert!(err.contains("kernal"), "{err}");
    // An unknown backend is named at its value.
    let m = write(
        dir.path(),
        "bad2.toml",
        "experiments = [\"x.toml\"]\n[[config]]\nname = \"a\"\nbackend = \"tpu\"\n",
    );
    let a = fp().arg("audit").arg(&m).assert().code(2);
    let err = text(&a.get_output().stderr);
    assert!(
        err.contains("bad2.toml:4:11") && err.contains("unknown backend `tpu`"),
        "{err}"
    );
}

#[test]
fn a_configuration_that_changes_digests_fails_and_names_the_cells() {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), "sp.toml", SPECIALS);
    let matrix = |control: bool| {
        format!(
            "experiments = [\"sp.toml\"]\n[defaults]\nbackend = \"cpu\"\n[[config]]\nname = \"canonical\"\n[[config]]\nname = \"preserve\"\nnan_policy = \"preserve\"\ncontrol = {control}\n"
        )
    };
    let m = write(dir.path(), "m.toml", &matrix(false));
    let out = dir.path().join("audit.json");
    let a = fp()
        .arg("audit")
        .arg(&m)
        .arg("--out")
        .arg(&out)
        .assert()
        .code(1);
    let stdout = text(&a.get_output().stdout);
    assert!(
        stdout.contains("configuration `preserve`: case `sp/nan` arena 0: digest"),
        "{stdout}"
    );
    assert!(!stdout.contains("case `sp/plain`"), "{stdout}");
    assert!(stdout.contains("audit FAILED (exit 1)"), "{stdout}");
    let v = json(&out);
    assert_eq!(v["ok"], false);
    assert_eq!(cell(&v, "nan", "preserve")["state"], "differs");
    assert_eq!(cell(&v, "nan", "preserve")["arena"], 0);
    assert_eq!(cell(&v, "plain", "preserve")["state"], "equal");
    let base = cell(&v, "nan", "canonical")["digests"][0].as_str().unwrap();
    let other = cell(&v, "nan", "preserve")["digests"][0].as_str().unwrap();
    assert_ne!(base, other);
    // The row in the table shows the differing digest, marked.
    assert!(stdout.contains(&format!("!{}", &other[..8])), "{stdout}");

    // The same configuration as a control is expected to change: exit 0.
    let m = write(dir.path(), "m.toml", &matrix(true));
    let a = fp().arg("audit").arg(&m).arg("--json").assert().code(0);
    let v: serde_json::Value = serde_json::from_slice(&a.get_output().stdout).unwrap();
    assert_eq!(cell(&v, "nan", "preserve")["state"], "changed");
    assert_eq!(cell(&v, "plain", "preserve")["state"], "unchanged");
}

#[test]
fn a_pinned_library_the_run_did_not_load_is_a_mismatch() {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), "sp.toml", SPECIALS);
    let nv = dir.path().join("nv");
    std::fs::create_dir(&nv).unwrap();
    write(&nv, "libnvrtc.so.12", "not a library");
    write(&nv, "libnvrtc-builtins.so.12.4", "not a library");
    let m = write(
        dir.path(),
        "m.toml",
        "experiments = [\"sp.toml\"]\noracle = false\n[defaults]\nbackend = \"cpu\"\n[[config]]\nname = \"plain\"\n[[config]]\nname = \"pinned\"\nnvrtc = \"nv\"\n",
    );
    let keep = dir.path().join("keep");
    let a = fp()
        .arg("audit")
        .arg(&m)
        .arg("--keep")
        .arg(&keep)
        .assert()
        .code(1);
    let stdout = text(&a.get_output().stdout);
    let real = std::fs::canonicalize(nv.join("libnvrtc.so.12")).unwrap();
    assert!(
        stdout.contains(&format!(
            "requested nvrtc nv ({}), but the run loaded no nvrtc (backend `cpu`)",
            real.display()
        )),
        "{stdout}"
    );
    // The child was given the link directory first on its search path.
    let lib = keep.join("pinned/lib");
    assert_eq!(
        std::fs::canonicalize(lib.join("libnvrtc.so")).unwrap(),
        real
    );
    assert!(lib.join("libnvrtc-builtins.so.12.4").exists());
    let cmd = std::fs::read_to_string(keep.join("pinned/command.sh")).unwrap();
    assert!(
        cmd.starts_with(&format!("LD_LIBRARY_PATH={}", lib.display())),
        "{cmd}"
    );
}

/// A stand-in for a GPU child: runs the real CPU oracle, then reports
/// (consistently: backend `cuda`, environment kind `cuda-loopback`) as the
/// NVRTC it mapped the file behind `libnvrtc.so` in the first
/// LD_LIBRARY_PATH directory (or $FAKE_LOADED), with NVRTC version 12.4,
/// the way the CUDA backend's report does.
const FAKE_GPU: &str = r#"#!/bin/sh
while [ "$#" -gt 0 ] && [ "$1" != "--" ]; do shift; done
shift
first="${LD_LIBRARY_PATH%%:*}"
lib="${FAKE_LOADED:-$(readlink -f "$first/libnvrtc.so")}"
"$FOLDPRINT_REAL" run --json --backend cpu -- "$@" | sed "s|\"backend\": \"cpu\",|\"backend\": \"cuda\",|; s|\"kind\": \"cpu\",|\"kind\": \"cuda-loopback\", \"nvrtc\": {\"version\": \"12.4\"}, \"libraries\": [{\"family\": \"nvrtc\", \"path\": \"$lib\", \"sha256\": \"0000000000000000000000000000000000000000000000000000000000000000\", \"bytes\": 13}],|"
"#;

fn script(dir: &Path, name: &str, body: &str) -> PathBuf {
    let p = write(dir, name, body);
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
    p
}

#[test]
fn the_library_check_accepts_the_requested_file_and_rejects_another() {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), "sp.toml", SPECIALS);
    let (nv, other) = (dir.path().join("nv124"), dir.path().join("other"));
    for d in [&nv, &other] {
        std::fs::create_dir(d).unwrap();
        write(d, "libnvrtc.so.12", "not a library");
    }
    let exe = script(dir.path(), "fake-gpu", FAKE_GPU);
    let real_bin = crate::common::bin_path();
    let real_bin = real_bin.display();
    let text = format!(
        r#"
experiments = ["sp.toml"]
oracle = false
[defaults]
backend = "cuda"
env = {{ FOLDPRINT_REAL = "{real_bin}" }}
[[config]]
name = "by-dir"
nvrtc = "nv124"
[[config]]
name = "by-file"
nvrtc = "${{NV_FILE_FOR_TEST:-nv124/libnvrtc.so.12}}"
target = "compute_75"
[[config]]
name = "wrong"
nvrtc = "nv124"
env = {{ FAKE_LOADED = "{}" }}
"#,
        other.join("libnvrtc.so.12").display()
    );
    let path = write(dir.path(), "m.toml", &text);
    let m = audit::load(&path).unwrap();
    let opts = audit::Options { exe, keep: None };
    let r = audit::run(&m, &opts, &mut ()).unwrap();
    let want = std::fs::canonicalize(nv.join("libnvrtc.so.12")).unwrap();
    for o in &r.configurations[..2] {
        assert_eq!(o.status, Status::Ok, "{o:?}");
        assert_eq!(o.requested.len(), 1);
        assert!(o.requested[0].ok, "{:?}", o.requested[0]);
        assert_eq!(o.requested[0].loaded, [want.display().to_string()]);
        assert_eq!(
            o.requested[0].sha256,
            Some(foldprint::digest::Sha256::from_bytes([0; 32]))
        );
        assert_eq!(o.versions.nvrtc.as_deref(), Some("12.4"));
        assert!(o.env["LD_LIBRARY_PATH"].contains("/by-"), "{:?}", o.env);
    }
    let wrong = &r.configurations[2];
    assert!(!wrong.requested[0].ok);
    assert_eq!(r.exit_code, 1);
    let msg = r.failures.join("\n");
    assert!(
        msg.contains(&format!(
            "configuration `wrong`: requested nvrtc nv124 ({}), loaded {}",
            want.display(),
            std::fs::canonicalize(other.join("libnvrtc.so.12"))
                .unwrap()
                .display()
        )),
        "{msg}"
    );
    // Digests still compared: the stand-in runs the oracle, so all equal.
    for row in &r.cases {
        assert!(row.cells.iter().skip(1).all(|c| c.cell == Cell::Equal));
    }
}

#[test]
fn a_child_that_cannot_run_is_exit_3_with_its_stderr() {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), "sp.toml", SPECIALS);
    let exe = script(
        dir.path(),
        "no-gpu",
        "#!/bin/sh\necho 'error: backend `cuda` is not usable here: no driver' >&2\nexit 3\n",
    );
    let path = write(
        dir.path(),
        "m.toml",
        "experiments = [\"sp.toml\"]\noracle = false\n[defaults]\nbackend = \"cuda\"\n[[config]]\nname = \"a\"\n[[config]]\nname = \"b\"\n",
    );
    let m = audit::load(&path).unwrap();
    let r = audit::run(&m, &audit::Options { exe, keep: None }, &mut ()).unwrap();
    assert_eq!(r.exit_code, 3);
    assert_eq!(r.configurations[0].status, Status::CouldNotRun);
    assert_eq!(r.configurations[0].exit_code, Some(3));
    // Nothing can be compared without the baseline: the rest is not run.
    assert_eq!(r.configurations[1].status, Status::NotRun);
    let msg = r.failures.join("\n");
    assert!(
        msg.contains("configuration `a` could not run") && msg.contains("no driver"),
        "{msg}"
    );

    // A child that hangs is killed at the matrix's timeout.
    let exe = script(dir.path(), "hang", "#!/bin/sh\nexec sleep 30\n");
    let path = write(
        dir.path(),
        "t.toml",
        "experiments = [\"sp.toml\"]\noracle = false\ntimeout_s = 1\n[defaults]\nbackend = \"cpu\"\n[[config]]\nname = \"a\"\n",
    );
    let m = audit::load(&path).unwrap();
    let t = std::time::Instant::now();
    let r = audit::run(&m, &audit::Options { exe, keep: None }, &mut ()).unwrap();
    assert!(t.elapsed().as_secs() < 20);
    assert_eq!(r.exit_code, 3);
    assert!(r.failures[0].contains("timed out"), "{:?}", r.failures);
}

#[test]
fn an_oracle_child_that_cannot_run_stops_the_audit_with_exit_3() {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), "sp.toml", SPECIALS);
    let exe = script(
        dir.path(),
        "no-memory",
        "#!/bin/sh\necho 'error: not enough host memory' >&2\nexit 3\n",
    );
    let path = write(
        dir.path(),
        "m.toml",
        "experiments = [\"sp.toml\"]\n[defaults]\nbackend = \"cpu\"\n[[config]]\nname = \"a\"\n",
    );
    let m = audit::load(&path).unwrap();
    let e = audit::run(&m, &audit::Options { exe, keep: None }, &mut ()).unwrap_err();
    let msg = e.to_string();
    assert!(
        msg.starts_with("CPU oracle: exit 3") && msg.contains("not enough host memory"),
        "{msg}"
    );
    use foldprint::exit::{ExitCode, HasExitCode};
    assert_eq!(e.exit_code(), ExitCode::Unavailable);
}

#[test]
fn a_child_that_rejects_its_arguments_is_exit_2() {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), "sp.toml", SPECIALS);
    let m = write(
        dir.path(),
        "m.toml",
        "experiments = [\"sp.toml\"]\noracle = false\n[defaults]\nbackend = \"cpu\"\n[[config]]\nname = \"a\"\n[[config]]\nname = \"b\"\nargs = [\"--no-such-flag\"]\n",
    );
    let a = fp().arg("audit").arg(&m).assert().code(2);
    let stdout = text(&a.get_output().stdout);
    let stderr = text(&a.get_output().stderr);
    assert!(
        stdout.contains("configuration `b` could not run: the run rejected its arguments"),
        "{stdout}"
    );
    assert!(stderr.contains("--no-such-flag"), "{stderr}");
}

#[test]
fn keep_must_be_a_new_or_empty_directory() {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), "stale", "x");
    let a = fp()
        .args(["audit", "audits/cpu.toml", "--keep"])
        .arg(dir.path())
        .assert()
        .code(2);
    assert!(text(&a.get_output().stderr).contains("must be a new or empty directory"));
}

/// The direct children of `pid` (from /proc).
fn children_of(pid: u32) -> Vec<u32> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(p) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{p}/stat")) else {
            continue;
        };
        // pid (comm) state ppid ...: comm may hold spaces, so split after ')'.
        let rest = &stat[stat.rfind(')').unwrap() + 2..];
        if rest.split(' ').nth(1) == Some(&pid.to_string()) {
            out.push(p);
        }
    }
    out
}

/// Whether `pid` has a handler installed for `signal` (the SigCgt mask
/// in /proc/PID/status); false once the process is gone.
fn catches(pid: u32, signal: i32) -> bool {
    let Ok(status) = std::fs::read_to_string(format!("/proc/{pid}/status")) else {
        return false;
    };
    status
        .lines()
        .find_map(|l| l.strip_prefix("SigCgt:"))
        .and_then(|m| u64::from_str_radix(m.trim(), 16).ok())
        .is_some_and(|mask| mask & (1u64 << (signal - 1)) != 0)
}

/// Issue 20, medium 6: SIGTERM to `audit` reaches its running child, which
/// is reaped; the temporary work directory goes; the exit is 128 + 15.
#[test]
fn sigterm_stops_the_child_removes_the_work_dir_and_exits_143() {
    signal_stops_the_audit(libc::SIGTERM, "SIGTERM");
}

/// The same for Ctrl-C (128 + 2) and a closed terminal (128 + 1).
#[test]
fn sigint_and_sighup_stop_the_audit_the_same_way() {
    signal_stops_the_audit(libc::SIGINT, "SIGINT");
    signal_stops_the_audit(libc::SIGHUP, "SIGHUP");
}

fn signal_stops_the_audit(signal: i32, name: &str) {
    let dir = tempfile::tempdir().unwrap();
    let tmp = dir.path().join("tmp");
    std::fs::create_dir(&tmp).unwrap();
    // Many short cases: the child stops at a case boundary, soon, but the
    // whole run takes far longer than the test waits for it (seconds).
    let seeds: Vec<String> = (1..=4000).map(|s| s.to_string()).collect();
    let slow = format!(
        "name = \"many\"\n[defaults]\nworld = 8\narenas = [16384]\n\
         [[sweep]]\nid = \"s\"\nseed = [{}]\n",
        seeds.join(",")
    );
    write(dir.path(), "slow.toml", &slow);
    let matrix = write(
        dir.path(),
        "m.toml",
        "name = \"m\"\nexperiments = [\"slow.toml\"]\noracle = false\n\
         [defaults]\nbackend = \"cpu\"\n[[config]]\nname = \"a\"\n[[config]]\nname = \"b\"\n",
    );
    let mut audit = std::process::Command::new(crate::common::bin_path())
        .arg("audit")
        .arg(&matrix)
        .env("TMPDIR", &tmp)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // Wait until a child runs with its own SIGTERM handler in place: a
    // fixed sleep raced the child's start on a loaded machine.
    let t = std::time::Instant::now();
    let child = loop {
        if let Some(&c) = children_of(audit.id())
            .iter()
            .find(|&&c| catches(c, signal))
        {
            break c;
        }
        if let Some(s) = audit.try_wait().unwrap() {
            panic!("audit ended before the test could signal it: {s:?}");
        }
        assert!(t.elapsed().as_secs() < 60, "no child started");
        std::thread::sleep(std::time::Duration::from_millis(5));
    };
    // SAFETY: signalling the process this test started.
    unsafe { libc::kill(audit.id() as i32, signal) };
    let t = std::time::Instant::now();
    let status = loop {
        if let Some(s) = audit.try_wait().unwrap() {
            break s;
        }
        assert!(t.elapsed().as_secs() < 30, "audit did not stop");
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    let mut err = String::new();
    std::io::Read::read_to_string(audit.stderr.as_mut().unwrap(), &mut err).unwrap();
    assert_eq!(status.code(), Some(128 + signal), "{status:?}: {err}");
    assert!(err.contains(name), "{err}");
    assert!(
        !Path::new(&format!("/proc/{child}")).exists(),
        "child {child} still there"
    );
    let left: Vec<_> = std::fs::read_dir(&tmp).unwrap().flatten().collect();
    assert!(left.is_empty(), "left in TMPDIR: {left:?}");
}

/// The oracle writes a case of rank files as the same files, picked tensors
/// and their order included, wherever its experiment is written and
/// whatever characters the files' directory holds: its digests are the
/// baseline's and both of its controls run.
#[test]
fn the_oracle_reads_the_same_rank_files_and_tensors() {
    use crate::common::rank_files::{mixed, write_safetensors, T};
    let dir = tempfile::tempdir().unwrap();
    let files = dir.path().join("we\"ird\\ dir");
    std::fs::create_dir(&files).unwrap();
    for r in 0..5 {
        write_safetensors(
            &files.join(format!("rank{r}.safetensors")),
            &[
                T::f32("a", &[3], &mixed(1, r, 0, 3)),
                T::f32("b", &[70], &mixed(1, r, 1, 70)),
                T::f32("c", &[2], &mixed(1, r, 2, 2)),
            ],
        );
    }
    let exp = dir.path().join("exp");
    std::fs::create_dir(&exp).unwrap();
    write(
        &exp,
        "rf.toml",
        "name = \"rf\"\n[[case]]\nid = \"files\"\n\
         addends = '../we\"ird\\ dir/rank{rank}.safetensors'\ntensors = [\"b\", \"a\"]\n\
         order = \"shuffle:3\"\nmean = true\n",
    );
    let m = write(
        dir.path(),
        "m.toml",
        "experiments = [\"exp/rf.toml\"]\n[defaults]\nbackend = \"cpu\"\n[[config]]\nname = \"baseline\"\n",
    );
    let out = dir.path().join("audit.json");
    let keep = dir.path().join("keep");
    fp().arg("audit")
        .arg(&m)
        .arg("--out")
        .arg(&out)
        .arg("--keep")
        .arg(&keep)
        .assert()
        .code(0);
    let v = json(&out);
    let row = &v["cases"][0];
    assert_eq!(row["world"], 5, "{row}");
    assert_eq!(row["oracle"]["vs_baseline"]["state"], "equal", "{row}");
    assert_eq!(
        row["oracle"]["arrival_reversed"]["state"], "changed",
        "{row}"
    );
    assert_eq!(row["oracle"]["pairwise_tree"]["state"], "changed", "{row}");
    // The oracle's own report names the same tensors, in the case's order.
    let oracle = json(&keep.join(".oracle/report.json"));
    for c in oracle["cases"].as_array().unwrap() {
        let names: Vec<&str> = c["params"]["addends"]["arenas"]
            .as_array()
            .unwrap()
            .iter()
            .map(|a| a["name"].as_str().unwrap())
            .collect();
        assert_eq!(names, ["b", "a"], "{c}");
    }
}

/// An audit matrix over 16-bit experiments runs on the CPU: the oracle's
/// child is written the cases' dtypes (`Case::to_raw`), gives the
/// baseline's digests, and its controls (arrival order reversed, the
/// pairwise tree) change a bf16 case whose rounded result sees the order;
/// the NaN-policy control changes a bf16 case of NaNs.
#[test]
fn an_audit_matrix_over_16_bit_experiments_runs_on_the_cpu() {
    use crate::common::rank_files::{narrow16, write_safetensors, Dt, T};
    let dir = tempfile::tempdir().unwrap();
    let n = 2049;
    // Rank 0 holds L and rank 4 -L at every other element, the others
    // values near L's float32 step: the partial sums absorb them by order
    // and grouping, and one rounding to bf16 keeps the difference.
    let mut ranks: Vec<Vec<u16>> = (0..5)
        .map(|r| {
            crate::common::rank_files::mixed(9, r, 0, n)
                .iter()
                .map(|x| narrow16(Dt::Bf16, x / 4096.0))
                .collect()
        })
        .collect();
    for i in (0..n).step_by(2) {
        let l = 4096.0 * (1.0 + (i % 64) as f32 / 64.0);
        ranks[0][i] = narrow16(Dt::Bf16, l);
        ranks[4][i] = narrow16(Dt::Bf16, -l);
    }
    for (r, bits) in ranks.iter().enumerate() {
        write_safetensors(
            &dir.path().join(format!("bf{r}.safetensors")),
            &[T::bf16("g", &[n], bits)],
        );
    }
    write(
        dir.path(),
        "h.toml",
        "name = \"h\"\n\
         [[case]]\nid = \"files\"\naddends = \"bf{rank}.safetensors\"\n\
         [[case]]\nid = \"nan\"\nworld = 6\narenas = [4099, 3]\nseed = 5\ndistribution = \"specials\"\ndtype = \"bf16\"\n\
         [[case]]\nid = \"half\"\nworld = 3\narenas = [100]\ndtype = \"f16\"\nmean = true\n",
    );
    let m = write(
        dir.path(),
        "m.toml",
        "experiments = [\"h.toml\"]\n[defaults]\nbackend = \"cpu\"\n\
         [[config]]\nname = \"baseline\"\n\
         [[config]]\nname = \"threads-1\"\nenv = { RAYON_NUM_THREADS = \"1\" }\n\
         [[config]]\nname = \"nan-preserve\"\ncontrol = true\nnan_policy = \"preserve\"\n",
    );
    let out = dir.path().join("audit.json");
    let keep = dir.path().join("keep");
    let a = fp()
        .arg("audit")
        .arg(&m)
        .arg("--out")
        .arg(&out)
        .arg("--keep")
        .arg(&keep)
        .output()
        .unwrap();
    assert_eq!(
        a.status.code(),
        Some(0),
        "{}{}",
        text(&a.stdout),
        text(&a.stderr)
    );
    let v = json(&out);
    assert_eq!(v["ok"], true, "{v}");
    for id in ["files", "nan", "half"] {
        assert_eq!(cell(&v, id, "threads-1")["state"], "equal", "{id}");
        let row = v["cases"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["id"] == id)
            .unwrap();
        assert_eq!(
            row["oracle"]["vs_baseline"]["state"], "equal",
            "{id}: {row}"
        );
    }
    // Negative controls: each changes what it must.
    assert_eq!(cell(&v, "nan", "nan-preserve")["state"], "changed");
    let files = v["cases"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["id"] == "files")
        .unwrap();
    assert_eq!(
        files["oracle"]["arrival_reversed"]["state"], "changed",
        "{files}"
    );
    assert_eq!(
        files["oracle"]["pairwise_tree"]["state"], "changed",
        "{files}"
    );
    // The oracle ran the cases in their dtypes.
    let oracle = json(&keep.join(".oracle/report.json"));
    let dtypes: std::collections::BTreeSet<String> = oracle["cases"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["params"]["dtype"].as_str().unwrap_or("f32").to_string())
        .collect();
    assert_eq!(dtypes, ["bf16", "f16"].map(String::from).into(), "{oracle}");
    let written: String = std::fs::read_dir(keep.join(".oracle/experiments"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "toml"))
        .map(|p| std::fs::read_to_string(p).unwrap())
        .collect();
    assert!(
        written.contains("dtype = \"bf16\"") && written.contains("dtype = \"f16\""),
        "{written}"
    );
}
