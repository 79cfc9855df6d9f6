//! `foldprint world` under real launchers: `foldprint launch`, ranks started
//! by hand as a launcher would, Open MPI's `mpirun` and Slurm's `srun`
//! (these two ignored here; ci/launchers.sh installs them, starts a
//! one-node Slurm and runs them). Each rank is a real process and the
//! rendezvous is real TCP on loopback.

use crate::common::{fp, free_port};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

fn bin() -> std::path::PathBuf {
    crate::common::bin_path()
}

fn json_of(out: &[u8]) -> serde_json::Value {
    serde_json::from_slice(out).unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(out)))
}

#[test]
fn world_under_launch_lists_every_rank() {
    let out = fp()
        .args(["launch", "-n", "4", "--", "world", "--json"])
        .timeout(Duration::from_secs(60))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v = json_of(&out.stdout);
    assert_eq!(v["world"], 4);
    assert_eq!(v["launcher"], "foldprint");
    let members = v["members"].as_array().unwrap();
    let ranks: Vec<u64> = members
        .iter()
        .map(|m| m["rank"].as_u64().unwrap())
        .collect();
    assert_eq!(ranks, [0, 1, 2, 3]);
    let pids: std::collections::BTreeSet<u64> =
        members.iter().map(|m| m["pid"].as_u64().unwrap()).collect();
    assert_eq!(pids.len(), 4, "four processes: {members:?}");
    // The table says the same.
    fp().args(["launch", "-n", "3", "--", "world"])
        .timeout(Duration::from_secs(60))
        .assert()
        .success()
        .stdout(predicates::str::contains(
            "world of 3 rank(s) under foldprint",
        ))
        .stdout(predicates::str::contains("ok: 3 rank(s) met and agreed"));
}

#[test]
fn world_without_a_launcher_says_how_to_start_it() {
    fp().arg("world")
        .env_remove("RANK")
        .env_remove("SLURM_PROCID")
        .env_remove("OMPI_COMM_WORLD_RANK")
        .env_remove("FOLDPRINT_RANK")
        .assert()
        .code(2)
        .stderr(predicates::str::contains("torchrun, srun, mpirun"));
}

#[test]
fn a_misspelt_emulation_variable_is_refused_and_nothing_is_written() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("r.json");
    fp().args(["run", "experiments/smoke.toml", "--backend", "cpu", "--out"])
        .arg(&out)
        .env("FOLDPRINT_EMULATE_HOSTS", "ye")
        .assert()
        .code(2)
        .stderr(predicates::str::contains("FOLDPRINT_EMULATE_HOSTS=\"ye\""));
    assert!(!out.exists());
    // Negative control: a value it knows runs.
    fp().args(["run", "experiments/smoke.toml", "--backend", "cpu", "--out"])
        .arg(&out)
        .env("FOLDPRINT_EMULATE_HOSTS", "0")
        .assert()
        .success();
    assert!(out.exists());
}

/// Rank `r` of a world of `world` started the way a launcher starts it.
fn rank(r: usize, world: usize, port: u16, timeout_s: u64) -> Child {
    Command::new(bin())
        .args(["world", "--init-timeout", &timeout_s.to_string()])
        .env("FOLDPRINT_RANK", r.to_string())
        .env("FOLDPRINT_WORLD_SIZE", world.to_string())
        .env("FOLDPRINT_LOCAL_RANK", r.to_string())
        .env("FOLDPRINT_MASTER_ADDR", "127.0.0.1")
        .env("FOLDPRINT_MASTER_PORT", port.to_string())
        .env("FOLDPRINT_JOB_TOKEN", "t")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

#[test]
fn a_rank_killed_mid_rendezvous_ends_the_others_in_seconds() {
    let port = free_port();
    // Rank 3 never starts, so the world cannot form; rank 2 joins and is
    // killed. Without noticing, ranks 0 and 1 would wait the full 60 s.
    let zero = rank(0, 4, port, 60);
    let one = rank(1, 4, port, 60);
    let mut two = rank(2, 4, port, 60);
    std::thread::sleep(Duration::from_secs(2));
    let t = Instant::now();
    two.kill().unwrap();
    two.wait().unwrap();
    for (who, child) in [("rank 0", zero), ("rank 1", one)] {
        let out = child.wait_with_output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(4), "{who}: {err}");
        assert!(
            err.contains("rank 2 (") && err.contains("closed its connection"),
            "{who}: {err}"
        );
    }
    assert!(t.elapsed() < Duration::from_secs(10), "{:?}", t.elapsed());
}

#[test]
fn a_stopped_rank_zero_stops_waiting_and_its_peer_hears_of_it() {
    let port = free_port();
    let zero = rank(0, 3, port, 60);
    let one = rank(1, 3, port, 60);
    std::thread::sleep(Duration::from_secs(2));
    let t = Instant::now();
    // What a launcher does to the ranks left when one fails.
    // SAFETY: kill(2) on our own child's pid.
    unsafe { libc::kill(zero.id() as i32, libc::SIGTERM) };
    let out = zero.wait_with_output().unwrap();
    assert_eq!(
        out.status.code(),
        Some(143),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = one.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(4), "{err}");
    assert!(err.contains("rank 0 was stopped"), "{err}");
    assert!(t.elapsed() < Duration::from_secs(10), "{:?}", t.elapsed());
}

/// A launcher users already run, as CI runs it on one host.
#[derive(Clone, Copy)]
enum Launcher {
    /// Open MPI's `mpirun` (as root in CI containers).
    Mpirun,
    /// Slurm's `srun` against the one-node Slurm ci/launchers.sh starts.
    Srun,
}

impl Launcher {
    /// The variable holding a rank's global rank, and how reports name it.
    fn rank_var_and_source(self) -> (&'static str, &'static str) {
        match self {
            Launcher::Mpirun => ("OMPI_COMM_WORLD_RANK", "openmpi"),
            Launcher::Srun => ("SLURM_PROCID", "slurm"),
        }
    }

    /// `np` ranks of `program`, each told rank 0's rendezvous address.
    fn run(self, np: usize, program: &[&std::ffi::OsStr]) -> std::process::Output {
        let port = free_port().to_string();
        let n = np.to_string();
        let mut c = match self {
            Launcher::Mpirun => {
                let mut c = Command::new("mpirun");
                c.args(["-np", &n, "--oversubscribe"])
                    .args(["-x", "FOLDPRINT_MASTER_ADDR", "-x", "FOLDPRINT_MASTER_PORT"])
                    .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
                    .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1");
                c
            }
            Launcher::Srun => {
                let mut c = Command::new("srun");
                c.args(["-n", &n, "--overcommit", "--kill-on-bad-exit=1"]);
                c
            }
        };
        c.env("FOLDPRINT_MASTER_ADDR", "127.0.0.1")
            .env("FOLDPRINT_MASTER_PORT", port)
            .args(program)
            .stdin(Stdio::null())
            .output()
            .unwrap()
    }

    /// `sh -c SCRIPT` as each of 4 ranks.
    fn sh(self, script: &str) -> std::process::Output {
        let script = std::ffi::OsStr::new(script);
        self.run(4, &["sh".as_ref(), "-c".as_ref(), script])
    }
}

fn world_lists_every_rank(l: Launcher) {
    let bin = bin();
    let out = l.run(4, &[bin.as_os_str(), "world".as_ref(), "--json".as_ref()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v = json_of(&out.stdout);
    let (_, source) = l.rank_var_and_source();
    assert_eq!(
        (v["world"].as_u64(), v["launcher"].as_str()),
        (Some(4), Some(source))
    );
    let members = v["members"].as_array().unwrap();
    let ranks: Vec<(u64, u64)> = members
        .iter()
        .map(|m| {
            (
                m["rank"].as_u64().unwrap(),
                m["local_rank"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(ranks, [(0, 0), (1, 1), (2, 2), (3, 3)]);
}

fn a_failing_rank_ends_the_job_in_seconds(l: Launcher) {
    let (rank_var, _) = l.rank_var_and_source();
    let t = Instant::now();
    let out = l.sh(&format!(
        "if [ \"${rank_var}\" = 2 ]; then exit 7; fi; exec '{}' world --init-timeout 60",
        bin().display()
    ));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(
        t.elapsed() < Duration::from_secs(20),
        "{:?}: {err}",
        t.elapsed()
    );
    // Negative control: the same job without the failing rank succeeds.
    let out = l.sh(&format!(
        "exec '{}' world --init-timeout 60",
        bin().display()
    ));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
#[ignore = "needs Open MPI's mpirun: ci/launchers.sh installs it and runs this with --ignored"]
fn world_under_mpirun_lists_every_rank() {
    world_lists_every_rank(Launcher::Mpirun);
}

#[test]
#[ignore = "needs Open MPI's mpirun: ci/launchers.sh installs it and runs this with --ignored"]
fn a_failing_rank_under_mpirun_ends_the_job_in_seconds() {
    a_failing_rank_ends_the_job_in_seconds(Launcher::Mpirun);
}

#[test]
#[ignore = "needs a running Slurm: ci/launchers.sh starts one and runs this with --ignored"]
fn world_under_srun_lists_every_rank() {
    world_lists_every_rank(Launcher::Srun);
}

#[test]
#[ignore = "needs a running Slurm: ci/launchers.sh starts one and runs this with --ignored"]
fn a_failing_rank_under_srun_ends_the_job_in_seconds() {
    a_failing_rank_ends_the_job_in_seconds(Launcher::Srun);
}

// ---- `launch --exec`: torchrun's variables, prefixed output ------------

/// Each rank's environment as `launch` gave it, read from the files an
/// `env` child wrote, rank by rank.
fn envs_under_launch(
    extra: &[&str],
    ranks: usize,
) -> Vec<std::collections::BTreeMap<String, String>> {
    let dir = tempfile::tempdir().unwrap();
    let n = ranks.to_string();
    let mut args = vec!["launch", "-n", &n];
    args.extend_from_slice(extra);
    args.extend_from_slice(&["--exec", "--", "sh", "-c", "env > \"$0/$FOLDPRINT_RANK\""]);
    fp().args(&args)
        .arg(dir.path())
        // What an outer torchrun would have left: `launch` replaces it.
        .env("RANK", "7")
        .env("WORLD_SIZE", "9")
        .env("LOCAL_WORLD_SIZE", "9")
        .env("MASTER_PORT", "1")
        .timeout(Duration::from_secs(30))
        .assert()
        .success();
    (0..ranks)
        .map(|r| {
            std::fs::read_to_string(dir.path().join(r.to_string()))
                .unwrap()
                .lines()
                .filter_map(|l| l.split_once('='))
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        })
        .collect()
}

#[test]
fn launch_exec_gives_each_rank_torchrun_variables_equal_to_its_own() {
    for emulate in [false, true] {
        let extra: &[&str] = if emulate { &["--emulate-hosts"] } else { &[] };
        let envs = envs_under_launch(extra, 3);
        let port: u16 = envs[0]["MASTER_PORT"].parse().unwrap();
        let mut host_ids = std::collections::BTreeSet::new();
        for (r, e) in envs.iter().enumerate() {
            let get = |k: &str| e.get(k).map(String::as_str).unwrap_or("<unset>");
            let rank = r.to_string();
            assert_eq!(get("RANK"), rank, "{e:?}");
            assert_eq!(get("FOLDPRINT_RANK"), rank, "{e:?}");
            assert_eq!(get("WORLD_SIZE"), "3", "{e:?}");
            assert_eq!(get("FOLDPRINT_WORLD_SIZE"), "3", "{e:?}");
            assert_eq!(get("LOCAL_WORLD_SIZE"), "3", "{e:?}");
            assert_eq!(get("LOCAL_RANK"), get("FOLDPRINT_LOCAL_RANK"), "{e:?}");
            assert_eq!(get("MASTER_ADDR"), "127.0.0.1", "{e:?}");
            assert_eq!(get("FOLDPRINT_MASTER_ADDR"), "127.0.0.1", "{e:?}");
            // One store port for the job, foldprint's rendezvous just above.
            assert_eq!(get("MASTER_PORT"), port.to_string(), "{e:?}");
            assert_eq!(
                get("FOLDPRINT_MASTER_PORT"),
                (port + 1).to_string(),
                "{e:?}"
            );
            assert_eq!(get("FOLDPRINT_LAUNCHER"), "foldprint", "{e:?}");
            assert_eq!(get("FOLDPRINT_JOB_TOKEN"), envs[0]["FOLDPRINT_JOB_TOKEN"]);
            if emulate {
                // No GPU here: every rank shares device 0, each its own host.
                assert_eq!(get("LOCAL_RANK"), "0", "{e:?}");
                let id = get("NCCL_HOSTID");
                assert!(id.ends_with(&format!("host{r:04}")), "{e:?}");
                host_ids.insert(id.to_string());
            } else {
                assert_eq!(get("LOCAL_RANK"), rank, "{e:?}");
                assert_eq!(get("NCCL_HOSTID"), "<unset>", "{e:?}");
            }
        }
        assert_eq!(host_ids.len(), if emulate { 3 } else { 0 }, "{envs:?}");
    }
}

#[test]
fn a_foldprint_rank_under_launch_exec_sees_torchrun_agree() {
    let out = fp()
        .args(["launch", "-n", "3", "--exec", "--"])
        .arg(bin())
        .args(["world", "--json"])
        .timeout(Duration::from_secs(60))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    let v = json_of(&out.stdout);
    assert_eq!(
        (v["world"].as_u64(), v["launcher"].as_str()),
        (Some(3), Some("foldprint")),
        "{v}"
    );
    assert_eq!(
        v["other_launchers"],
        serde_json::json!([{
            "launcher": "torchrun",
            "verdict": "agrees",
            "variables": {"RANK": "0", "WORLD_SIZE": "3"},
        }]),
        "{v}"
    );
    let ranks: Vec<u64> = v["members"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["rank"].as_u64().unwrap())
        .collect();
    assert_eq!(ranks, [0, 1, 2]);
}

/// Each rank writes `LINES` lines to stdout and to stderr, each line in
/// three writes (so that ranks writing straight to one terminal could mix
/// within a line), and a last stdout line without a newline.
const CHATTY: &str = r#"r=$FOLDPRINT_RANK; pad=$(printf '%0600d' 0); i=0
while [ $i -lt 150 ]; do
  printf 'out %s %s ' $r $i; printf '%s' $pad; printf '\n'
  printf 'err %s %s ' $r $i >&2; printf '%s' $pad >&2; printf '\n' >&2
  i=$((i+1))
done
printf 'last %s' $r"#;
const LINES: usize = 150;

#[test]
fn all_output_prefixes_every_line_of_every_rank_whole() {
    let pad = "0".repeat(600);
    let run = |all: bool| {
        let mut args = vec!["launch", "-n", "3", "--exec"];
        if all {
            args.push("--all-output");
        }
        args.extend_from_slice(&["--", "sh", "-c", CHATTY]);
        let out = fp()
            .args(&args)
            .timeout(Duration::from_secs(60))
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        (
            String::from_utf8(out.stdout).unwrap(),
            String::from_utf8(out.stderr).unwrap(),
        )
    };
    let (out, err) = run(true);
    for (text, stream) in [(&out, "out"), (&err, "err")] {
        let mut next = [0usize; 3];
        let mut last = [false; 3];
        for line in text.lines() {
            let rest = line
                .strip_prefix("[rank ")
                .unwrap_or_else(|| panic!("{line:.80}"));
            let (r, body) = rest
                .split_once("] ")
                .unwrap_or_else(|| panic!("{line:.80}"));
            let r: usize = r.parse().unwrap();
            if body == format!("last {r}") && stream == "out" {
                last[r] = true;
                continue;
            }
            // Whole, in the rank's own order, never another rank's text.
            assert_eq!(
                body,
                format!("{stream} {r} {} {pad}", next[r]),
                "{line:.80}"
            );
            next[r] += 1;
        }
        assert_eq!(next, [LINES; 3], "{stream}");
        assert_eq!(last, [stream == "out"; 3], "{stream}");
    }
    // Negative control: without --all-output, rank 0's stdout alone, every
    // rank's stderr, no prefix.
    let (out, err) = run(false);
    assert!(
        !out.contains("[rank") && !err.contains("[rank"),
        "{out:.200}{err:.200}"
    );
    assert_eq!(
        out.lines().filter(|l| l.starts_with("out 0 ")).count(),
        LINES
    );
    assert!(!out.contains("out 1 ") && !out.contains("out 2 ") && out.ends_with("last 0"));
    for r in 0..3 {
        let mine = format!("err {r} ");
        assert!(err.contains(&mine), "{err:.200}");
    }
}
