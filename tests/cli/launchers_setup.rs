//! What a launcher hands a rank, checked before anything waits on it: the
//! launcher variables (values, sizes, two launchers at once), rank 0's
//! address, and the directory rendezvous left behind by one job for the
//! next with the same job id. Every rank is a real `foldprint world`
//! process, started by hand with exactly the variables a launcher sets.

use crate::common::free_port;
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

/// Every variable a launcher or foldprint's rendezvous reads: cleared, so
/// that the test's own environment (a CI step under Slurm, say) adds none.
const LAUNCHER_VARS: &[&str] = &[
    "FOLDPRINT_RANK",
    "FOLDPRINT_WORLD_SIZE",
    "FOLDPRINT_LOCAL_RANK",
    "FOLDPRINT_MASTER_ADDR",
    "FOLDPRINT_MASTER_PORT",
    "FOLDPRINT_JOB_ID",
    "FOLDPRINT_JOB_TOKEN",
    "FOLDPRINT_RENDEZVOUS_DIR",
    "FOLDPRINT_LAUNCHER",
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "MASTER_ADDR",
    "MASTER_PORT",
    "TORCHELASTIC_RUN_ID",
    "SLURM_PROCID",
    "SLURM_NTASKS",
    "SLURM_LOCALID",
    "SLURM_JOB_ID",
    "OMPI_COMM_WORLD_RANK",
    "OMPI_COMM_WORLD_SIZE",
    "OMPI_COMM_WORLD_LOCAL_RANK",
];

/// Launcher variables, as a rank is given them.
type Vars = Vec<(String, String)>;

/// `foldprint ARGS` with exactly `vars` of the launcher variables set.
fn with_vars(args: &[&str], vars: &Vars) -> Command {
    let mut c = Command::new(crate::common::bin_path());
    c.args(args);
    for v in LAUNCHER_VARS {
        c.env_remove(v);
    }
    for (k, v) in vars {
        c.env(k, v);
    }
    c.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    c
}

/// `foldprint world` as one rank, `timeout_s` to meet the others.
fn world(vars: &Vars, timeout_s: u64) -> Child {
    let t = timeout_s.to_string();
    with_vars(&["world", "--init-timeout", &t], vars)
        .spawn()
        .unwrap()
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn vars(pairs: &[(&str, &str)]) -> Vars {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// Each rank of a job, its exit code and what it printed.
fn finish(ranks: Vec<Child>) -> Vec<(Option<i32>, String, String)> {
    ranks
        .into_iter()
        .map(|c| {
            let o: Output = c.wait_with_output().unwrap();
            (o.status.code(), text(&o.stdout), text(&o.stderr))
        })
        .collect()
}

// ---- launcher values -------------------------------------------------

#[test]
fn launcher_values_out_of_range_exit_2_naming_the_variable() {
    let port = free_port().to_string();
    let addr = [("MASTER_ADDR", "127.0.0.1"), ("MASTER_PORT", port.as_str())];
    let cases: &[(&[(&str, &str)], &str)] = &[
        // Panicked (exit 101) and tried to allocate 144 TB (exit 134).
        (
            &[("RANK", "0"), ("WORLD_SIZE", "18446744073709551615")],
            "WORLD_SIZE=\"18446744073709551615\"",
        ),
        (
            &[("RANK", "0"), ("WORLD_SIZE", "1000000000000")],
            "WORLD_SIZE=\"1000000000000\"",
        ),
        // Exited 4, "infrastructure, rerun".
        (&[("RANK", "-1"), ("WORLD_SIZE", "2")], "RANK=\"-1\""),
        (&[("RANK", "2"), ("WORLD_SIZE", "2")], "RANK=2"),
        (&[("RANK", "0")], "WORLD_SIZE is not"),
        (
            &[
                ("RANK", "0"),
                ("WORLD_SIZE", "2"),
                ("MASTER_ADDR", "127.0.0.1"),
                ("MASTER_PORT", "70000"),
            ],
            "MASTER_PORT=\"70000\"",
        ),
    ];
    // Every case is tried, then every wrong one is listed.
    let mut wrong = Vec::new();
    for (pairs, want) in cases {
        let mut v = vars(&addr);
        v.retain(|(k, _)| !pairs.iter().any(|(p, _)| p == k));
        v.extend(vars(pairs));
        let t = Instant::now();
        let (code, _, err) = finish(vec![world(&v, 10)]).remove(0);
        let first = err.lines().next().unwrap_or("");
        if code != Some(2) || !err.contains(want) || t.elapsed() > Duration::from_secs(8) {
            wrong.push(format!(
                "{pairs:?}: exit {code:?} after {:?}: {first}",
                t.elapsed()
            ));
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
    // `run --backend nccl` refuses them before it looks for a GPU.
    let v = vars(&[("RANK", "-1"), ("WORLD_SIZE", "2")]);
    let o = with_vars(&["run", "experiments/smoke.toml", "--backend", "nccl"], &v)
        .output()
        .unwrap();
    let err = text(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(err.contains("RANK=\"-1\""), "{err}");
    // Negative control: sound values meet (a world of one).
    let mut v = vars(&addr);
    v.extend(vars(&[("RANK", "0"), ("WORLD_SIZE", "1")]));
    let (code, out, err) = finish(vec![world(&v, 10)]).remove(0);
    assert_eq!(code, Some(0), "{err}");
    assert!(out.contains("world of 1 rank(s) under torchrun,"), "{out}");
}

// ---- two launchers at once --------------------------------------------

/// Rank `r` of 2 as mpirun inside an sbatch step starts it: Open MPI's
/// variables, and the batch step's `SLURM_PROCID=0`, `SLURM_NTASKS=1`.
fn mpirun_in_sbatch(r: usize, port: u16, extra: &[(&str, &str)]) -> Child {
    let mut v = vars(&[
        ("OMPI_COMM_WORLD_RANK", &r.to_string()),
        ("OMPI_COMM_WORLD_SIZE", "2"),
        ("OMPI_COMM_WORLD_LOCAL_RANK", &r.to_string()),
        ("SLURM_PROCID", "0"),
        ("SLURM_NTASKS", "1"),
        ("SLURM_LOCALID", "0"),
        ("FOLDPRINT_MASTER_ADDR", "127.0.0.1"),
        ("FOLDPRINT_MASTER_PORT", &port.to_string()),
        ("FOLDPRINT_JOB_TOKEN", "t"),
    ]);
    v.extend(vars(extra));
    world(&v, 20)
}

#[test]
fn launchers_that_disagree_are_refused_naming_both() {
    let port = free_port();
    // Each rank believed Slurm, saw "a world of 1" and passed (exit 0).
    let ranks = (0..2).map(|r| mpirun_in_sbatch(r, port, &[])).collect();
    for (r, (code, out, err)) in finish(ranks).into_iter().enumerate() {
        assert_eq!(code, Some(2), "rank {r}: {out}{err}");
        for want in [
            "slurm says rank 0 of 1 (SLURM_PROCID=0, SLURM_NTASKS=1)",
            &format!(
                "openmpi says rank {r} of 2 (OMPI_COMM_WORLD_RANK={r}, OMPI_COMM_WORLD_SIZE=2)"
            ),
            "FOLDPRINT_LAUNCHER",
        ] {
            assert!(err.contains(want), "rank {r}: {want}: {err}");
        }
        assert!(!out.contains("ok:"), "rank {r}: {out}");
    }
    // Named, the launcher is used, and the other one is reported.
    let port = free_port();
    let chosen = [("FOLDPRINT_LAUNCHER", "openmpi")];
    let ranks = (0..2).map(|r| mpirun_in_sbatch(r, port, &chosen)).collect();
    let done = finish(ranks);
    for (r, (code, _, err)) in done.iter().enumerate() {
        assert_eq!(*code, Some(0), "rank {r}: {err}");
    }
    let out = &done[0].1;
    assert!(
        out.contains(
            "world of 2 rank(s) under openmpi (chosen by FOLDPRINT_LAUNCHER; slurm ignored \
             (SLURM_PROCID=0, SLURM_NTASKS=1))"
        ),
        "{out}"
    );
}

#[test]
fn launchers_that_agree_are_named_in_the_world() {
    let port = free_port().to_string();
    let ranks = (0..2)
        .map(|r| {
            let r = r.to_string();
            let v = vars(&[
                ("SLURM_PROCID", &r),
                ("SLURM_NTASKS", "2"),
                ("OMPI_COMM_WORLD_RANK", &r),
                ("OMPI_COMM_WORLD_SIZE", "2"),
                ("FOLDPRINT_MASTER_ADDR", "127.0.0.1"),
                ("FOLDPRINT_MASTER_PORT", &port),
                ("FOLDPRINT_JOB_TOKEN", "t"),
            ]);
            with_vars(&["world", "--json", "--init-timeout", "20"], &v)
                .spawn()
                .unwrap()
        })
        .collect();
    let done = finish(ranks);
    for (r, (code, _, err)) in done.iter().enumerate() {
        assert_eq!(*code, Some(0), "rank {r}: {err}");
    }
    let v: serde_json::Value = serde_json::from_str(&done[0].1).unwrap();
    assert_eq!(v["launcher"], "slurm", "{v}");
    assert_eq!(
        v["other_launchers"],
        serde_json::json!([{
            "launcher": "openmpi",
            "verdict": "agrees",
            "variables": {"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "2"},
        }]),
        "{v}"
    );
}

#[test]
fn launch_inside_another_launchers_job_uses_its_own_ranks() {
    // `foldprint launch` in an sbatch script under torchrun's variables:
    // its ranks name foldprint as their launcher.
    let v = vars(&[
        ("SLURM_PROCID", "0"),
        ("SLURM_NTASKS", "1"),
        ("RANK", "0"),
        ("WORLD_SIZE", "1"),
    ]);
    let o = with_vars(&["launch", "-n", "3", "--", "world"], &v)
        .output()
        .unwrap();
    let (out, err) = (text(&o.stdout), text(&o.stderr));
    assert_eq!(o.status.code(), Some(0), "{out}{err}");
    assert!(
        out.contains("world of 3 rank(s) under foldprint (chosen by FOLDPRINT_LAUNCHER;"),
        "{out}"
    );
    assert!(
        out.contains("slurm ignored (SLURM_PROCID=0, SLURM_NTASKS=1)"),
        "{out}"
    );
}

// ---- rank 0's address -------------------------------------------------

#[test]
fn rank_zero_refuses_an_address_it_cannot_listen_on() {
    let port = free_port().to_string();
    // Each made rank 0 listen on 0.0.0.0 (or, for port 0, wait out the
    // whole timeout) and end with exit 4.
    let cases: &[(&str, &str, &str, &str)] = &[
        (
            "FOLDPRINT_MASTER_ADDR",
            "192.0.2.1",
            &port,
            "FOLDPRINT_MASTER_ADDR=\"192.0.2.1\" is not this host's",
        ),
        (
            "FOLDPRINT_MASTER_ADDR",
            "nowhere.invalid",
            &port,
            "FOLDPRINT_MASTER_ADDR=\"nowhere.invalid\" does not resolve",
        ),
        (
            "FOLDPRINT_MASTER_ADDR",
            "127.0.0.1:29400",
            &port,
            "FOLDPRINT_MASTER_ADDR=\"127.0.0.1:29400\" is not a host name or address",
        ),
        (
            "FOLDPRINT_MASTER_ADDR",
            "127.0.0.1",
            "0",
            "FOLDPRINT_MASTER_PORT=\"0\" is not a port number",
        ),
        // torchrun's MASTER_ADDR, empty.
        ("MASTER_ADDR", "", &port, "MASTER_ADDR=\"\" is empty"),
    ];
    let mut wrong = Vec::new();
    for (addr_var, addr, port, want) in cases {
        let port_var = addr_var.replace("ADDR", "PORT");
        let v = vars(&[
            ("RANK", "0"),
            ("WORLD_SIZE", "2"),
            (addr_var, addr),
            (&port_var, port),
        ]);
        // A refusal comes at once; 20 s leaves room for a slow resolver,
        // and is well short of the 30 s deadline waited out before.
        let t = Instant::now();
        let (code, _, err) = finish(vec![world(&v, 30)]).remove(0);
        let first = err.lines().next().unwrap_or("");
        if code != Some(2) || !err.contains(want) || t.elapsed() > Duration::from_secs(20) {
            wrong.push(format!(
                "{addr_var}={addr:?} {port_var}={port}: exit {code:?} after {:?}: {first}",
                t.elapsed()
            ));
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
    // Negative control: a name for this host listens, and a world of one
    // meets there.
    let v = vars(&[
        ("RANK", "0"),
        ("WORLD_SIZE", "1"),
        ("FOLDPRINT_MASTER_ADDR", "localhost"),
        ("FOLDPRINT_MASTER_PORT", &port),
    ]);
    let (code, _, err) = finish(vec![world(&v, 10)]).remove(0);
    assert_eq!(code, Some(0), "{err}");
}

// ---- the directory rendezvous -----------------------------------------

/// Rank `r` of 2 meeting through the directory `dir` as job `job`.
fn by_dir(r: usize, dir: &Path, job: &str, timeout_s: u64) -> Child {
    let v = vars(&[
        ("FOLDPRINT_RANK", &r.to_string()),
        ("FOLDPRINT_WORLD_SIZE", "2"),
        ("FOLDPRINT_LOCAL_RANK", &r.to_string()),
        ("FOLDPRINT_RENDEZVOUS_DIR", &dir.display().to_string()),
        ("FOLDPRINT_JOB_ID", job),
    ]);
    world(&v, timeout_s)
}

fn entries(dir: &Path) -> Vec<String> {
    let mut n: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    n.sort();
    n
}

#[test]
fn a_directory_rendezvous_leaves_nothing_behind_and_the_next_job_with_its_id_meets() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    // Two steps of one Slurm job: the same job id, one after the other.
    for step in 0..3 {
        let ranks = vec![by_dir(1, d, "4242", 30), by_dir(0, d, "4242", 30)];
        for (code, out, err) in finish(ranks) {
            assert_eq!(code, Some(0), "step {step}: {out}{err}");
        }
        assert_eq!(entries(d), Vec::<String>::new(), "step {step}");
    }
    // A job that fails (rank 1 never comes) cleans up too.
    let (code, _, err) = finish(vec![by_dir(0, d, "4242", 2)]).remove(0);
    assert_eq!(code, Some(4), "{err}");
    assert!(err.contains("ranks [1] did not acknowledge"), "{err}");
    assert_eq!(entries(d), Vec::<String>::new());
}

#[test]
fn a_killed_jobs_files_neither_pass_a_peer_nor_stop_the_next_job() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    // Rank 0 of a job whose rank 1 never came, killed while it waits.
    let mut zero = by_dir(0, d, "7", 60);
    let id = d.join("7.id");
    let t = Instant::now();
    while !id.exists() {
        assert!(t.elapsed() < Duration::from_secs(20), "no {}", id.display());
        std::thread::sleep(Duration::from_millis(20));
    }
    zero.kill().unwrap();
    zero.wait().unwrap();
    // A peer alone with its file must not pass: it read "rank 0's" id and
    // exited 0 before.
    let (code, out, err) = finish(vec![by_dir(1, d, "7", 3)]).remove(0);
    assert_eq!(code, Some(4), "{out}{err}");
    // The next job with that id meets, even with its peer started first,
    // and leaves nothing (rank 0 refused the stale file with exit 4 before).
    let one = by_dir(1, d, "7", 30);
    std::thread::sleep(Duration::from_secs(1));
    let zero = by_dir(0, d, "7", 30);
    for (code, out, err) in finish(vec![zero, one]) {
        assert_eq!(code, Some(0), "{out}{err}");
    }
    assert_eq!(entries(d), Vec::<String>::new());
}

#[test]
#[ignore = "needs Open MPI's mpirun: ci/launchers.sh installs it and runs this with --ignored"]
fn mpirun_inside_an_sbatch_step_is_refused_unless_the_launcher_is_named() {
    let mpirun = |chosen: Option<&str>| {
        let mut c = Command::new("mpirun");
        for v in LAUNCHER_VARS {
            c.env_remove(v);
        }
        // What an sbatch script's environment holds, inherited by mpirun.
        c.env("SLURM_PROCID", "0")
            .env("SLURM_NTASKS", "1")
            .env("SLURM_JOB_ID", "77")
            .env("FOLDPRINT_MASTER_ADDR", "127.0.0.1")
            .env("FOLDPRINT_MASTER_PORT", free_port().to_string())
            .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
            .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
            .args(["-np", "3", "--oversubscribe"])
            .args(["-x", "FOLDPRINT_MASTER_ADDR", "-x", "FOLDPRINT_MASTER_PORT"])
            .arg(crate::common::bin_path())
            .args(["world", "--init-timeout", "30"])
            .stdin(Stdio::null());
        if let Some(l) = chosen {
            c.env("FOLDPRINT_LAUNCHER", l);
        }
        let o = c.output().unwrap();
        (o.status.success(), text(&o.stdout), text(&o.stderr))
    };
    let (ok, out, err) = mpirun(None);
    assert!(!ok, "{out}{err}");
    assert!(!out.contains("world of 1"), "{out}");
    // mpirun aborts the job as soon as one rank exits non-zero, so the
    // others may be killed before they print: at least one rank refused,
    // naming both launchers.
    let refused = (0..3)
        .filter(|r| {
            err.contains(&format!(
                "launchers disagree: slurm says rank 0 of 1 (SLURM_PROCID=0, SLURM_NTASKS=1); \
                 openmpi says rank {r} of 3"
            ))
        })
        .count();
    assert!(refused >= 1, "{err}");
    // Negative control: named, Open MPI's ranks meet.
    let (ok, out, err) = mpirun(Some("openmpi"));
    assert!(ok, "{out}{err}");
    assert!(
        out.contains(
            "world of 3 rank(s) under openmpi (chosen by FOLDPRINT_LAUNCHER; slurm ignored"
        ),
        "{out}"
    );
}

#[test]
fn a_stopped_rank_zero_ends_a_directory_rendezvous_on_every_rank_and_cleans_up() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    // Rank 2 of 3 never comes; rank 1 acknowledges and waits.
    let v = |r: usize| {
        vars(&[
            ("FOLDPRINT_RANK", &r.to_string()),
            ("FOLDPRINT_WORLD_SIZE", "3"),
            ("FOLDPRINT_RENDEZVOUS_DIR", &d.display().to_string()),
            ("FOLDPRINT_JOB_ID", "9"),
        ])
    };
    let zero = world(&v(0), 60);
    let one = world(&v(1), 60);
    let ack = d.join("9.ack.1");
    let t = Instant::now();
    while !ack.exists() {
        assert!(
            t.elapsed() < Duration::from_secs(20),
            "no {}",
            ack.display()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let t = Instant::now();
    // SAFETY: kill(2) on our own child's pid.
    unsafe { libc::kill(zero.id() as i32, libc::SIGTERM) };
    let done = finish(vec![zero, one]);
    assert_eq!(done[0].0, Some(143), "rank 0: {}", done[0].2);
    // Rank 1 took rank 0's file as its answer the moment it read it, and
    // passed (exit 0) before.
    assert_eq!(done[1].0, Some(4), "rank 1: {}{}", done[1].1, done[1].2);
    assert!(
        done[1].2.contains("rank 0 was stopped by SIGTERM"),
        "{}",
        done[1].2
    );
    assert!(t.elapsed() < Duration::from_secs(10), "{:?}", t.elapsed());
    assert_eq!(entries(d), Vec::<String>::new());
}
