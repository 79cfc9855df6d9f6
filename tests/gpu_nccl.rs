//! The NCCL backend on a real communicator. Built only with `--features
//! gpu-tests`; needs a CUDA GPU and an NCCL library, and fails without them.
//!
//! Worlds of several ranks run on one GPU through emulated hosts
//! (`foldprint launch --emulate-hosts`: one process and one NCCL host id per
//! rank, NCCL's socket transport on loopback). These tests start the
//! foldprint binary: `FOLDPRINT_BIN` names it where the test binary was
//! copied to another machine, `FOLDPRINT_REPO` the checkout holding
//! experiments/ (default: the current directory). `FOLDPRINT_TEST_NCCL_ALT`
//! names a second NCCL library to compare against; `FOLDPRINT_TEST_OUT` a
//! directory for the digest tables; `FOLDPRINT_TORCHRUN` torchrun's command
//! for the ignored `torchrun_*` tests. docs/GPU-TESTING.md has the commands.

use foldprint::backend::cpu::CpuBackend;
use foldprint::backend::nccl::{NcclBackend, NcclConfig};
use foldprint::backend::{Backend, RunOptions};
use foldprint::data::ALL_DISTRIBUTIONS;
use foldprint::dtype::Dtype;
use foldprint::experiment::{Case, DeliveryOrder};
use foldprint::fold::Contract;
use foldprint::ranks::rendezvous::Plan;
use foldprint::ranks::world::{self, World};
use std::time::Duration;

fn nccl() -> NcclBackend {
    let launch = world::discover(1).unwrap_or_else(|e| panic!("launcher variables: {e}"));
    let mut world = World::new(
        launch,
        Plan::new(&["gpu-tests".into()], "gpu tests"),
        Duration::from_secs(60),
    );
    NcclBackend::new(
        NcclConfig {
            cuda: Default::default(),
            timeout: Duration::from_secs(60),
        },
        &mut world,
    )
    .unwrap_or_else(|e| panic!("the NCCL tests need a GPU and NCCL: {e}"))
}

fn case(arenas: Vec<usize>, dist: usize, contract: Contract, mean: bool) -> Case {
    Case::builder(1, arenas.clone())
        .experiment("gpu-nccl")
        .id(format!("{arenas:?}-{dist}-{contract}-{mean}"))
        .order(DeliveryOrder::Ascending)
        .seed(17)
        .distribution(ALL_DISTRIBUTIONS[dist])
        .contract(contract)
        .mean(mean)
        .rounds(2)
        .build()
        .unwrap()
}

fn digests(be: &mut dyn Backend, c: &Case) -> Vec<Vec<foldprint::digest::Sha256>> {
    let r = be
        .run_case(c, &RunOptions::default())
        .unwrap_or_else(|e| panic!("{}: {e}", be.name()));
    assert!(r.rounds_identical);
    r.arenas.iter().map(|a| a.rank_digests.clone()).collect()
}

#[test]
fn world_of_one_equals_the_cpu_oracle_for_every_distribution() {
    let mut be = nccl();
    assert_eq!(be.world().size(), 1);
    let mut cpu = CpuBackend::new();
    for dist in 0..ALL_DISTRIBUTIONS.len() {
        for mean in [false, true] {
            let c = case(vec![10007, 1, 0, 1 << 20], dist, Contract::FixedOrder, mean);
            assert_eq!(digests(&mut be, &c), digests(&mut cpu, &c), "{}", c.id());
        }
    }
    // Negative control of the comparison: another seed must differ.
    let a = case(vec![4096], 0, Contract::FixedOrder, false);
    let foldprint::experiment::Addends::Generated { seed, distribution } = *a.addends() else {
        panic!("generated addends expected");
    };
    let b = a.clone().with_data(seed + 1, distribution);
    assert_ne!(digests(&mut be, &a), digests(&mut be, &b));
}

#[test]
fn nccl_allreduce_of_one_rank_is_the_identity_and_cpu_skips_it() {
    let mut be = nccl();
    let c = case(vec![4099], 0, Contract::NcclAllreduce, false);
    let fixed = case(vec![4099], 0, Contract::FixedOrder, false);
    assert_eq!(digests(&mut be, &c), digests(&mut be, &fixed));
    assert!(CpuBackend::new().skip_reason(&c).is_some());
}

#[test]
fn other_world_sizes_are_skipped_with_a_reason() {
    let be = nccl();
    let c = case(vec![16], 0, Contract::FixedOrder, false)
        .to_builder()
        .world(4)
        .build()
        .unwrap();
    let why = be.skip_reason(&c).expect("W=4 cannot run on a world of 1");
    assert!(why.contains("W = 4"), "{why}");
}

#[test]
fn environment_names_nccl_version_and_library() {
    let be = nccl();
    let env = be.environment().to_value();
    let v = env["nccl"]["version"].as_str().unwrap().to_string();
    assert!(v.starts_with("2."), "{v}");
    let libs = env["libraries"].as_array().unwrap();
    assert!(libs.iter().any(|l| l["family"] == "nccl"), "{env}");
    eprintln!("NCCL {v} from {}", env["nccl"]["opened"]);
}

// ---------------------------------------------------------------------------
// Several ranks on one GPU: emulated hosts.

use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Instant;

/// A command of this test process without the NCCL log variables an
/// in-process NCCL test may have set meanwhile (foldprint routes NCCL's
/// log by setting them process-wide): a world started here must route its
/// own per-rank logs, not share one file.
fn command(program: impl AsRef<std::ffi::OsStr>) -> Command {
    let mut c = Command::new(program);
    c.env_remove("NCCL_DEBUG")
        .env_remove("NCCL_DEBUG_SUBSYS")
        .env_remove("NCCL_DEBUG_FILE");
    c
}

fn bin() -> PathBuf {
    std::env::var_os("FOLDPRINT_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_foldprint")))
}

fn repo() -> PathBuf {
    if let Some(r) = std::env::var_os("FOLDPRINT_REPO") {
        return PathBuf::from(r);
    }
    let here = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    if here.join("experiments").is_dir() {
        here
    } else {
        std::env::current_dir().unwrap()
    }
}

/// NCCL settings of a launch, and whether host ids are reversed.
#[derive(Clone)]
struct Setting {
    name: String,
    env: Vec<(String, String)>,
    reversed: bool,
}

fn setting(name: &str, env: &[(&str, &str)]) -> Setting {
    Setting {
        name: name.into(),
        env: env
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        reversed: false,
    }
}

/// `foldprint launch -n W --emulate-hosts [...] -- ARGS`, in the checkout.
fn launch(world: usize, s: &Setting, args: &[&str]) -> Output {
    let mut cmd = command(bin());
    cmd.current_dir(repo())
        .args(["launch", "-n", &world.to_string(), "--emulate-hosts"]);
    if s.reversed {
        cmd.args(["--host-ids", "reversed"]);
    }
    cmd.arg("--").args(args);
    for (k, v) in &s.env {
        cmd.env(k, v);
    }
    let out = cmd.output().expect("starting foldprint launch");
    if !out.status.success() {
        eprintln!(
            "launch -n {world} [{}] {args:?} exited {:?}\nstdout:\n{}\nstderr:\n{}",
            s.name,
            out.status.code(),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    out
}

/// `verify` of every committed experiment against its golden, on a world of
/// `world` emulated hosts, report to `out`.
/// `verify` of every golden on the NCCL backend, the report to `out`.
fn verify_args<'a>(out: &'a Path, extra: &[&'a str]) -> Vec<&'a str> {
    let mut args = vec![
        "verify",
        "experiments",
        "--golden",
        "experiments/golden",
        "--backend",
        "nccl",
        "--out",
        out.to_str().unwrap(),
    ];
    args.extend_from_slice(extra);
    args
}

fn verify_goldens(world: usize, extra: &[&str], out: &Path) -> Output {
    launch(world, &setting("default", &[]), &verify_args(out, extra))
}

fn read_json(p: &Path) -> Value {
    serde_json::from_slice(&std::fs::read(p).unwrap_or_else(|e| panic!("{}: {e}", p.display())))
        .unwrap()
}

/// Case key -> arena digests of every case that ran (skipped ones left out).
fn digests_by_key(report: &Value) -> BTreeMap<String, Vec<String>> {
    report["cases"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            let d = c["arenas"]
                .as_array()
                .unwrap()
                .iter()
                .map(|a| a["sha256"].as_str().unwrap().to_string())
                .collect();
            (c["key"].as_str().unwrap().to_string(), d)
        })
        .collect()
}

fn save(name: &str, text: &str) {
    if let Some(dir) = std::env::var_os("FOLDPRINT_TEST_OUT") {
        let _ = std::fs::create_dir_all(&dir);
        std::fs::write(Path::new(&dir).join(name), text).unwrap();
    }
}

fn assert_emulated(report: &Value, world: usize) {
    let b = &report["environment"]["backend"];
    assert_eq!(b["world"], world, "{b}");
    assert_eq!(b["emulated_hosts"]["enabled"], true, "{b}");
    assert!(
        b["emulated_hosts"]["nccl_hostid"]
            .as_str()
            .is_some_and(|h| h.contains("host")),
        "{b}"
    );
    assert!(
        b["transport"]["network"].as_str().is_some(),
        "NCCL's log should name the network transport: {b}"
    );
    assert!(
        b["env"]
            .as_object()
            .is_some_and(|e| e.contains_key("NCCL_HOSTID")),
        "the NCCL_* variables in effect belong in the report: {b}"
    );
}

#[test]
fn emulated_worlds_of_2_to_16_ranks_reproduce_every_golden() {
    let dir = tempfile::tempdir().unwrap();
    let mut table = String::new();
    for world in [2usize, 3, 4, 8, 16] {
        let out = dir.path().join(format!("w{world}.json"));
        let t = Instant::now();
        let o = verify_goldens(world, &[], &out);
        assert!(o.status.success(), "W = {world}: verify failed");
        let r = read_json(&out);
        assert_emulated(&r, world);
        let ran: Vec<&Value> = r["cases"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|c| c["params"]["world"] == world)
            .collect();
        let skipped = r["skipped"].as_array().map_or(0, |s| s.len());
        assert!(!ran.is_empty(), "W = {world}: no committed case ran");
        assert!(
            r["cases"]
                .as_array()
                .unwrap()
                .iter()
                .all(|c| c["params"]["world"] == world),
            "a case of another W ran in a world of {world}"
        );
        let line = format!(
            "W={world:<3} {:>3} cases equal the goldens, {skipped} skipped (other W), {:.1} s, transport {}\n",
            ran.len(),
            t.elapsed().as_secs_f64(),
            r["environment"]["backend"]["transport"]["connections"]
        );
        eprint!("{line}");
        table.push_str(&line);
    }
    save("goldens.txt", &table);
}

/// Contracts whose bits are ours, next to NCCL's own sum, at W = 8.
const SETTINGS_TOML: &str = r#"
name = "nccl-settings"
description = "fixed-order, its controls and NCCL's own sum under one NCCL setting"

[defaults]
world = 8
arenas = [1048576, 10007]
seed = 5
distribution = "mixed-magnitude"

[[sweep]]
id = "fixed"
order = ["ascending", "descending", "shuffle:3"]
contract = ["fixed-order", "arrival-order"]

[[case]]
id = "tree"
contract = "pairwise-tree"

[[case]]
id = "mean"
mean = true

[[case]]
id = "nccl-sum"
contract = "nccl-allreduce"
"#;

fn settings() -> Vec<Setting> {
    let mut v = vec![
        setting("default", &[]),
        setting("NCCL_ALGO=Ring", &[("NCCL_ALGO", "Ring")]),
        setting("NCCL_ALGO=Tree", &[("NCCL_ALGO", "Tree")]),
        setting(
            "NCCL_ALGO=allreduce:ring",
            &[("NCCL_ALGO", "allreduce:ring")],
        ),
        setting(
            "NCCL_ALGO=allreduce:tree",
            &[("NCCL_ALGO", "allreduce:tree")],
        ),
        setting("NCCL_PROTO=Simple", &[("NCCL_PROTO", "Simple")]),
        setting("NCCL_PROTO=LL", &[("NCCL_PROTO", "LL")]),
        setting("NCCL_PROTO=LL128", &[("NCCL_PROTO", "LL128")]),
        setting(
            "1 channel",
            &[("NCCL_MIN_NCHANNELS", "1"), ("NCCL_MAX_NCHANNELS", "1")],
        ),
        setting(
            "8 channels",
            &[("NCCL_MIN_NCHANNELS", "8"), ("NCCL_MAX_NCHANNELS", "8")],
        ),
        setting(
            "4 socket threads x 2 sockets",
            &[
                ("NCCL_SOCKET_NTHREADS", "4"),
                ("NCCL_NSOCKS_PERTHREAD", "2"),
            ],
        ),
    ];
    let mut rev = setting("reversed host ids", &[]);
    rev.reversed = true;
    v.push(rev);
    v
}

/// Run SETTINGS_TOML once per setting; key -> setting -> digests.
fn run_settings(list: &[Setting], dir: &Path) -> BTreeMap<String, BTreeMap<String, Vec<String>>> {
    let exp = dir.join("settings.toml");
    std::fs::write(&exp, SETTINGS_TOML).unwrap();
    let mut by_key: BTreeMap<String, BTreeMap<String, Vec<String>>> = BTreeMap::new();
    for (i, s) in list.iter().enumerate() {
        let out = dir.join(format!("s{i}.json"));
        let o = launch(
            8,
            s,
            &[
                "run",
                exp.to_str().unwrap(),
                "--backend",
                "nccl",
                "--out",
                out.to_str().unwrap(),
            ],
        );
        assert!(o.status.success(), "setting `{}` failed", s.name);
        let r = read_json(&out);
        assert_emulated(&r, 8);
        assert_eq!(r["summary"]["ok"], true, "setting `{}`", s.name);
        for (k, d) in digests_by_key(&r) {
            by_key.entry(k).or_default().insert(s.name.clone(), d);
        }
    }
    by_key
}

fn cpu_digests(dir: &Path) -> BTreeMap<String, Vec<String>> {
    let out = dir.join("cpu.json");
    let o = command(bin())
        .args(["run", dir.join("settings.toml").to_str().unwrap()])
        .args(["--backend", "cpu", "--out", out.to_str().unwrap()])
        .stdout(Stdio::null())
        .status()
        .unwrap();
    assert!(o.success());
    digests_by_key(&read_json(&out))
}

#[test]
fn fixed_order_bits_ignore_every_nccl_setting_while_nccls_own_sum_moves() {
    let dir = tempfile::tempdir().unwrap();
    let list = settings();
    let by_key = run_settings(&list, dir.path());
    let cpu = cpu_digests(dir.path());
    let mut table = String::from("case key | setting | arena digests (first 16 hex)\n");
    let mut allreduce = BTreeSet::new();
    for (key, per) in &by_key {
        for (name, d) in per {
            let short: Vec<&str> = d.iter().map(|x| &x[..16]).collect();
            table.push_str(&format!("{key} | {name} | {}\n", short.join(" ")));
        }
        assert_eq!(
            per.len(),
            list.len(),
            "{key} did not run under every setting"
        );
        if key.starts_with("nccl-allreduce/") {
            allreduce.extend(per.values().cloned());
            continue;
        }
        let want = cpu
            .get(key)
            .unwrap_or_else(|| panic!("CPU oracle lacks {key}"));
        for (name, d) in per {
            assert_eq!(d, want, "{key} under `{name}` differs from the CPU oracle");
        }
    }
    eprint!("{table}");
    save("settings.txt", &table);
    // The negative control: NCCL's own sum must be seen to move, or this
    // test could not tell a setting that changes bits from one that doesn't.
    assert!(
        allreduce.len() >= 2,
        "nccl-allreduce gave the same bits under all {} settings: the control shows nothing on this NCCL; \
         pick settings that move it before trusting the fixed-order result",
        list.len()
    );
    eprintln!(
        "nccl-allreduce: {} distinct digest sets over {} settings",
        allreduce.len(),
        list.len()
    );
}

#[test]
fn a_second_nccl_build_gives_the_same_fixed_order_bits() {
    let alt = std::env::var("FOLDPRINT_TEST_NCCL_ALT").unwrap_or_else(|_| {
        panic!("set FOLDPRINT_TEST_NCCL_ALT to a second NCCL library (e.g. pip's libnccl.so.2)")
    });
    let dir = tempfile::tempdir().unwrap();
    let list = vec![
        setting("default NCCL", &[]),
        setting(
            "FOLDPRINT_NCCL_LIBRARY",
            &[("FOLDPRINT_NCCL_LIBRARY", &alt)],
        ),
    ];
    let by_key = run_settings(&list, dir.path());
    // The two runs must really have loaded two different libraries.
    let versions: BTreeSet<String> = (0..2)
        .map(|i| {
            let r = read_json(&dir.path().join(format!("s{i}.json")));
            let b = &r["environment"]["backend"]["nccl"];
            format!("{} {}", b["version"], b["opened"])
        })
        .collect();
    eprintln!("NCCL builds: {versions:?}");
    assert_eq!(versions.len(), 2, "both runs loaded the same NCCL");
    let mut table = format!("{versions:?}\n");
    for (key, per) in &by_key {
        let d: Vec<&Vec<String>> = per.values().collect();
        table.push_str(&format!(
            "{key}: {}\n",
            if d[0] == d[1] { "equal" } else { "DIFFER" }
        ));
        if !key.starts_with("nccl-allreduce/") {
            assert_eq!(d[0], d[1], "{key} differs between NCCL builds");
        }
    }
    eprint!("{table}");
    save("nccl-builds.txt", &table);
}

#[test]
fn more_ranks_than_gpus_needs_emulated_hosts_and_threads_cannot_emulate() {
    let gpus = foldprint::gpu::probe().device_count;
    let n = (gpus + 1).to_string();
    let o = command(bin())
        .current_dir(repo())
        .args(["launch", "-n", &n, "--", "run", "experiments/smoke.toml"])
        .args(["--backend", "nccl"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(err.contains("--emulate-hosts"), "{err}");
    let o = command(bin())
        .current_dir(repo())
        .args(["run", "experiments/smoke.toml", "--backend", "nccl"])
        .args(["--gpus", &n])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(3), "{err}");
    assert!(err.contains("--emulate-hosts"), "{err}");
}

const KILL_TOML: &str = r#"
name = "kill"
description = "long enough to kill a rank in the middle"

[defaults]
world = 4
arenas = [4194304]
distribution = "uniform"
rounds = 4

[[sweep]]
id = "s"
seed = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32, 33, 34, 35, 36, 37, 38, 39, 40, 41, 42, 43, 44, 45, 46, 47, 48, 49, 50, 51, 52, 53, 54, 55, 56, 57, 58, 59, 60, 61, 62, 63, 64, 65, 66, 67, 68, 69, 70, 71, 72, 73, 74, 75, 76, 77, 78, 79, 80]
"#;

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Wait until `log` shows NCCL connections (the ranks are inside cases).
fn wait_for_connections(log: &Path, limit: Duration) {
    let t = Instant::now();
    while t.elapsed() < limit {
        if std::fs::read_to_string(log).is_ok_and(|s| s.contains(" via ")) {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!("no NCCL connection within {limit:?} ({})", log.display());
}

#[test]
fn a_killed_rank_ends_the_others_fast_with_the_infrastructure_exit_code() {
    let dir = tempfile::tempdir().unwrap();
    let exp = dir.path().join("kill.toml");
    std::fs::write(&exp, KILL_TOML).unwrap();
    let (world, victim, timeout_s) = (4usize, 2usize, 60u64);
    let port = free_port().to_string();
    let token = format!("kill-test-{}", std::process::id());
    let report = dir.path().join("r.json");
    let mut ranks = Vec::new();
    for r in 0..world {
        let log = dir.path().join(format!("nccl.{r}.log"));
        let child = command(bin())
            .args(["run", exp.to_str().unwrap(), "--backend", "nccl"])
            .args(["--timeout", &timeout_s.to_string()])
            .args(["--out", report.to_str().unwrap()])
            .env("FOLDPRINT_RANK", r.to_string())
            .env("FOLDPRINT_WORLD_SIZE", world.to_string())
            .env("FOLDPRINT_LOCAL_RANK", "0")
            .env("FOLDPRINT_MASTER_ADDR", "127.0.0.1")
            .env("FOLDPRINT_MASTER_PORT", &port)
            .env("FOLDPRINT_JOB_TOKEN", &token)
            .env("NCCL_HOSTID", format!("kill-test-host{r}"))
            .env("NCCL_DEBUG", "INFO")
            .env("NCCL_DEBUG_SUBSYS", "INIT,NET")
            .env("NCCL_DEBUG_FILE", &log)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        ranks.push((r, child, log));
    }
    wait_for_connections(&ranks[victim].2, Duration::from_secs(90));
    std::thread::sleep(Duration::from_millis(1500));
    assert!(
        ranks[victim].1.try_wait().unwrap().is_none(),
        "the victim finished before it could be killed: make KILL_TOML longer"
    );
    let killed = Instant::now();
    ranks[victim].1.kill().unwrap(); // SIGKILL
    let mut lines = Vec::new();
    for (r, child, _) in ranks {
        let o = child.wait_with_output().unwrap();
        let after = killed.elapsed();
        if r == victim {
            continue;
        }
        let err = String::from_utf8_lossy(&o.stderr).to_string();
        let line = format!(
            "rank {r}: exit {:?} {:.1} s after the kill: {}",
            o.status.code(),
            after.as_secs_f64(),
            err.lines().find(|l| l.starts_with("error")).unwrap_or("")
        );
        eprintln!("{line}");
        lines.push(line);
        assert_eq!(o.status.code(), Some(4), "rank {r}: {err}");
        assert!(
            after < Duration::from_secs(timeout_s / 3),
            "rank {r} took {after:?}, close to --timeout {timeout_s}s"
        );
        assert!(
            err.contains("case `"),
            "rank {r} should name the case: {err}"
        );
    }
    assert!(
        !report.exists(),
        "no report may be written by a run whose peer died"
    );
    save("kill.txt", &lines.join("\n"));
}

#[test]
fn launch_reports_a_killed_rank_as_an_infrastructure_failure() {
    let dir = tempfile::tempdir().unwrap();
    let exp = dir.path().join("kill.toml");
    std::fs::write(&exp, KILL_TOML).unwrap();
    let mut launcher = command(bin())
        .args(["launch", "-n", "4", "--emulate-hosts", "--"])
        .args([
            "run",
            exp.to_str().unwrap(),
            "--backend",
            "nccl",
            "--timeout",
            "60",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // The launcher's children, in rank order (spawned in that order).
    let pid = launcher.id();
    let t = Instant::now();
    let children = loop {
        let text =
            std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children")).unwrap_or_default();
        let pids: Vec<i32> = text
            .split_whitespace()
            .filter_map(|p| p.parse().ok())
            .collect();
        if pids.len() == 4 {
            break pids;
        }
        assert!(t.elapsed() < Duration::from_secs(30), "ranks did not start");
        std::thread::sleep(Duration::from_millis(50));
    };
    // Let the ranks meet and start the cases, then kill one. With 40 cases
    // the job once ended right at a 12 s kill on an H100: 80 cases now,
    // and the kill at 8 s.
    std::thread::sleep(Duration::from_secs(8));
    assert!(
        launcher.try_wait().unwrap().is_none(),
        "the job ended too early"
    );
    let killed = Instant::now();
    // SAFETY: kill(2) on a pid read from our child's children list.
    unsafe { libc::kill(children[2], libc::SIGKILL) };
    let o = launcher.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    eprintln!(
        "{err}\nlaunch ended {:.1} s after the kill",
        killed.elapsed().as_secs_f64()
    );
    assert_eq!(o.status.code(), Some(4), "{err}");
    assert!(err.contains("killed by signal 9"), "{err}");
    assert!(killed.elapsed() < Duration::from_secs(20));
}

/// Opt-in (`--ignored`): 64 processes on one GPU take minutes.
#[test]
#[ignore]
fn emulated_world_of_64_reproduces_its_goldens() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("w64.json");
    let o = verify_goldens(64, &["--init-timeout", "600"], &out);
    assert!(o.status.success());
    let r = read_json(&out);
    assert_emulated(&r, 64);
    assert!(!r["cases"].as_array().unwrap().is_empty());
}

/// torchrun as `FOLDPRINT_TORCHRUN` names it (`torchrun`, or
/// `python3 -m torch.distributed.run`) starting `n` ranks, in the
/// repository; the caller adds the program.
fn torchrun_cmd(n: usize) -> Command {
    let cmd = std::env::var("FOLDPRINT_TORCHRUN").expect(
        "set FOLDPRINT_TORCHRUN to torchrun's command, e.g. `python3 -m torch.distributed.run`",
    );
    let mut parts = cmd.split_whitespace();
    let mut c = command(parts.next().expect("FOLDPRINT_TORCHRUN is empty"));
    c.args(parts)
        .args(["--standalone", "--nproc_per_node", &n.to_string()])
        .current_dir(repo());
    c
}

/// `torchrun ... --no-python PROGRAM ARGS`.
fn torchrun(n: usize, program: &Path, args: &[&str]) -> Output {
    torchrun_cmd(n)
        .arg("--no-python")
        .arg(program)
        .args(args)
        .output()
        .unwrap()
}

#[test]
#[ignore = "needs torchrun: run with --ignored and FOLDPRINT_TORCHRUN"]
fn torchrun_with_emulated_hosts_reproduces_the_goldens_and_names_the_transport() {
    let dir = tempfile::tempdir().unwrap();
    let mut table = String::new();
    for n in [2, 4, 8] {
        let out = dir.path().join(format!("torchrun-w{n}.json"));
        let o = torchrun(n, &bin(), &verify_args(&out, &["--emulate-hosts"]));
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(o.status.success(), "W={n}: {err}");
        let r = read_json(&out);
        assert_emulated(&r, n);
        let b = &r["environment"]["backend"];
        assert_eq!(b["launch"]["launcher"], "torchrun", "{b}");
        assert_eq!(b["launch"]["variables"]["WORLD_SIZE"], n.to_string(), "{b}");
        assert!(
            b["emulated_hosts"]["layout"]
                .as_str()
                .is_some_and(|l| l.contains("under torchrun")),
            "{b}"
        );
        let members = b["members"].as_array().expect("rank 0 lists the members");
        let ids: std::collections::BTreeSet<&str> = members
            .iter()
            .map(|m| m["nccl_hostid"].as_str().unwrap())
            .collect();
        assert_eq!((members.len(), ids.len()), (n, n), "{b}");
        let cases = r["cases"].as_array().unwrap().len();
        assert!(cases > 0, "W={n}: no case of this world was verified");
        table += &format!(
            "torchrun W={n}: {cases} cases verified, network {}, connections {}\n",
            b["transport"]["network"], b["transport"]["connections"]
        );
    }
    eprint!("{table}");
    save("torchrun.txt", &table);
}

#[test]
#[ignore = "needs torchrun: run with --ignored and FOLDPRINT_TORCHRUN"]
fn torchrun_without_emulated_hosts_refuses_a_local_rank_with_no_device() {
    // One rank more than this host has devices.
    let n = foldprint::gpu::probe().device_count + 1;
    let t = Instant::now();
    let args = [
        "verify",
        "experiments/smoke.toml",
        "--golden",
        "experiments/golden",
        "--backend",
        "nccl",
    ];
    let o = torchrun(n, &bin(), &args);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success(), "{err}");
    assert!(
        err.contains(&format!("local rank {}", n - 1)) && err.contains("--emulate-hosts"),
        "{err}"
    );
    assert!(t.elapsed() < Duration::from_secs(30), "{:?}", t.elapsed());
}

#[test]
#[ignore = "needs torchrun: run with --ignored and FOLDPRINT_TORCHRUN"]
fn torchrun_ends_the_job_in_seconds_when_a_rank_fails() {
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("rank.sh");
    std::fs::write(
        &script,
        format!(
            "#!/bin/sh\n[ \"$RANK\" = 2 ] && exit 7\nexec '{}' verify experiments --golden experiments/golden --backend nccl --emulate-hosts --init-timeout 120\n",
            bin().display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let t = Instant::now();
    let o = torchrun(4, &script, &[]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success(), "{err}");
    // Before, rank 0 sat in the rendezvous until torchrun's SIGKILL.
    assert!(
        t.elapsed() < Duration::from_secs(20),
        "{:?}: {err}",
        t.elapsed()
    );
}

/// The NCCL library PyTorch runs (`FOLDPRINT_TORCH_NCCL`), which foldprint
/// must load too for its control to be comparable.
fn torch_nccl() -> String {
    std::env::var("FOLDPRINT_TORCH_NCCL")
        .expect("set FOLDPRINT_TORCH_NCCL to the libnccl.so.2 of PyTorch's environment")
}

/// Rank 0's arena digest of the case of `report` under `contract`.
fn digest_of_contract(report: &Value, contract: &str) -> String {
    let c = report["cases"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["params"]["contract"] == contract)
        .unwrap_or_else(|| panic!("no {contract} case in the report"));
    c["arenas"][0]["sha256"].as_str().unwrap().to_string()
}

/// SHA-256 of a file PyTorch wrote in `dtype` (n elements), after checking
/// it holds no NaN (so its raw bytes are what foldprint hashes under any
/// NaN policy).
fn digest_of_torch_file(path: &Path, dtype: Dtype, n: usize) -> String {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    assert_eq!(bytes.len(), n * dtype.bytes(), "{}", path.display());
    let nan = bytes.chunks_exact(dtype.bytes()).any(|b| {
        let bits = match *b {
            [a, b] => u32::from(u16::from_le_bytes([a, b])),
            [a, b, c, d] => u32::from_le_bytes([a, b, c, d]),
            _ => unreachable!(),
        };
        dtype.is_nan(bits)
    });
    assert!(!nan, "{} holds a NaN", path.display());
    foldprint::digest::Sha256::of(&bytes).to_string()
}

#[test]
#[ignore = "needs torchrun and PyTorch: FOLDPRINT_TORCHRUN and FOLDPRINT_TORCH_NCCL"]
fn pytorch_all_reduce_is_the_nccl_control_and_its_rank_order_adds_are_fixed_order() {
    torch_parity(Dtype::F32);
}

/// In bf16, PyTorch's all_reduce is NCCL's bf16 all-reduce (foldprint's
/// control in the wire dtype), and fixed-order is PyTorch's float32
/// accumulation in rank order cast once to bf16.
#[test]
#[ignore = "needs torchrun and PyTorch: FOLDPRINT_TORCHRUN and FOLDPRINT_TORCH_NCCL"]
fn pytorch_all_reduce_in_bf16_is_the_control_and_fp32_accumulation_is_fixed_order() {
    torch_parity(Dtype::Bf16);
}

#[test]
#[ignore = "needs torchrun and PyTorch: FOLDPRINT_TORCHRUN and FOLDPRINT_TORCH_NCCL"]
fn pytorch_all_reduce_in_f16_is_the_control_and_fp32_accumulation_is_fixed_order() {
    torch_parity(Dtype::F16);
}

/// foldprint's nccl-allreduce control and fixed-order, against PyTorch's
/// all_reduce and its rank-order adds on the same addends in `dtype`, at
/// W = 4 and 8, with PyTorch's NCCL; NCCL_PROTO=LL is the negative control.
fn torch_parity(dtype: Dtype) {
    const N: usize = 1 << 22;
    const SEED: u64 = 21;
    let nccl = torch_nccl();
    let mut table = String::new();
    for world in [4usize, 8] {
        let dir = tempfile::tempdir().unwrap();
        // Every rank's addends in the dtype, from the generator every
        // backend runs (its float32 value rounded once to the dtype).
        for r in 0..world {
            let lane = foldprint::data::Lane::new(
                foldprint::data::Distribution::MixedMagnitude,
                SEED,
                r as u32,
                0,
            );
            let mut v = vec![0f32; N];
            lane.fill(0, &mut v);
            let mut bytes = Vec::with_capacity(N * dtype.bytes());
            for x in &v {
                dtype.put_le(dtype.narrow(*x), &mut bytes);
            }
            std::fs::write(dir.path().join(format!("rank{r}.{dtype}")), bytes).unwrap();
        }
        // foldprint on the same addends and the same NCCL, each rank its
        // own emulated host with the host id the PyTorch ranks take.
        let exp = dir.path().join("parity.toml");
        std::fs::write(
            &exp,
            format!(
                "name = \"parity\"\n[defaults]\nworld = {world}\narenas = [{N}]\ndistribution = \"mixed-magnitude\"\nseed = {SEED}\ndtype = \"{dtype}\"\n\n[[sweep]]\nid = \"p\"\ncontract = [\"fixed-order\", \"nccl-allreduce\"]\n"
            ),
        )
        .unwrap();
        let report = dir.path().join("r.json");
        let o = torchrun_cmd(world)
            .env("FOLDPRINT_JOB_ID", "parity")
            .env("FOLDPRINT_NCCL_LIBRARY", &nccl)
            .arg("--no-python")
            .arg(bin())
            .args([
                "run",
                exp.to_str().unwrap(),
                "--backend",
                "nccl",
                "--emulate-hosts",
            ])
            .arg("--out")
            .arg(&report)
            .output()
            .unwrap();
        assert!(
            o.status.success(),
            "foldprint {dtype} W={world}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        let r = read_json(&report);
        let (fixed, control) = (
            digest_of_contract(&r, "fixed-order"),
            digest_of_contract(&r, "nccl-allreduce"),
        );
        assert_ne!(
            fixed, control,
            "{dtype} W={world}: NCCL's sum is fixed-order here, nothing to tell apart"
        );
        // PyTorch, under each NCCL setting.
        let torch = |settings: &[(&str, &str)]| {
            let o = torchrun_cmd(world)
                .envs(settings.iter().copied())
                .arg("tools/torch_parity.py")
                .arg(dir.path())
                .arg("foldprint-parity-host")
                .arg(dtype.name())
                .output()
                .unwrap();
            let out = String::from_utf8_lossy(&o.stdout).into_owned();
            assert!(
                o.status.success(),
                "PyTorch {dtype} W={world}: {}",
                String::from_utf8_lossy(&o.stderr)
            );
            (
                digest_of_torch_file(&dir.path().join(format!("allreduce.{dtype}")), dtype, N),
                digest_of_torch_file(&dir.path().join(format!("rank-order.{dtype}")), dtype, N),
                out.trim().to_string(),
            )
        };
        let (all_reduce, rank_order, versions) = torch(&[]);
        assert_eq!(
            rank_order, fixed,
            "{dtype} W={world}: PyTorch's rank-order adds vs fixed-order"
        );
        assert_eq!(
            all_reduce, control,
            "{dtype} W={world}: torch all_reduce vs the nccl-allreduce control"
        );
        table += &format!("{dtype} W={world}: all_reduce == nccl-allreduce control, rank-order adds == fixed-order ({versions})\n");
        if world == 8 {
            // Negative control: another NCCL protocol moves NCCL's bits, and
            // this comparison sees it; the rank-order adds do not move.
            let (ll, rank_order, _) = torch(&[("NCCL_PROTO", "LL")]);
            assert_eq!(rank_order, fixed);
            assert_ne!(
                ll, control,
                "{dtype} W=8: NCCL_PROTO=LL left NCCL's sum unchanged"
            );
            table += &format!("{dtype} W=8, PyTorch under NCCL_PROTO=LL: all_reduce differs from the default control (negative control)\n");
        }
    }
    eprint!("{table}");
    save(&format!("torch-parity-{dtype}.txt"), &table);
}

#[path = "common/rank_files.rs"]
mod rank_files;

/// An experiment of rank files in `dir` (W = `world`), with expect.
fn rank_file_experiment(dir: &Path, world: usize) -> PathBuf {
    rank_files::grads(dir, world, 100_003);
    let exp = dir.join("grads.toml");
    std::fs::write(
        &exp,
        "name = \"grads\"\n[[sweep]]\nid = \"g\"\naddends = \"rank{rank}.safetensors\"\n\
         expect = \"expected.safetensors\"\n\
         contract = [\"fixed-order\", \"nccl-allreduce\"]\n",
    )
    .unwrap();
    exp
}

/// Rank files under `launch`: each rank process opens only its own file
/// and rank 0 learns the others' digests in the rendezvous; digests,
/// sensitivity and the inputs block equal the CPU oracle's; fixed-order
/// equals the rank-order sum in the expect file, NCCL's own sum does not
/// (the negative control); a corrupt rank 2 file is refused by rank 2.
#[test]
fn rank_files_under_launch_each_rank_reading_its_own() {
    let dir = tempfile::tempdir().unwrap();
    let exp = rank_file_experiment(dir.path(), 4);
    let cpu_out = dir.path().join("cpu.json");
    let o = command(bin())
        .args(["run", "--backend", "cpu", "--out"])
        .arg(&cpu_out)
        .arg(&exp)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let out = dir.path().join("nccl.json");
    let exp_s = exp.to_str().unwrap();
    let o = launch(
        4,
        &setting("default", &[]),
        &[
            "run",
            exp_s,
            "--backend",
            "nccl",
            "--out",
            out.to_str().unwrap(),
        ],
    );
    let stdout = String::from_utf8_lossy(&o.stdout);
    // NCCL's ring sum is not the rank-order sum: exit 1, one DIFF row.
    assert_eq!(o.status.code(), Some(1), "{stdout}");
    assert!(stdout.contains("DIFF g[nccl-allreduce]"), "{stdout}");
    let (cpu, nccl) = (read_json(&cpu_out), read_json(&out));
    assert_emulated(&nccl, 4);
    let fixed = |r: &Value| -> Value {
        r["cases"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["params"]["contract"] == "fixed-order")
            .unwrap()
            .clone()
    };
    let (c, n) = (fixed(&cpu), fixed(&nccl));
    assert_eq!(n["key"], c["key"]);
    assert_eq!(n["params"]["addends"], c["params"]["addends"]);
    assert_eq!(n["sensitivity"], c["sensitivity"]);
    assert_eq!(n["expect"]["equal"], true, "{}", n["expect"]);
    assert_eq!(
        digests_by_key(&nccl).get(c["key"].as_str().unwrap()),
        digests_by_key(&cpu).get(c["key"].as_str().unwrap())
    );
    // Every rank presented its own file's digest, which is the file's.
    let members = nccl["environment"]["backend"]["members"]
        .as_array()
        .unwrap();
    for (rank, m) in members.iter().enumerate() {
        assert_eq!(
            m["inputs"][0]["sha256"], c["params"]["addends"]["files"][rank]["sha256"],
            "rank {rank}"
        );
    }
    // A corrupt rank 2 file: rank 2 names it; nothing is written.
    let mut b = std::fs::read(dir.path().join("rank2.safetensors")).unwrap();
    b[8..16].copy_from_slice(b"garbage!");
    std::fs::write(dir.path().join("rank2.safetensors"), b).unwrap();
    let bad_out = dir.path().join("bad.json");
    let o = launch(
        4,
        &setting("default", &[]),
        &[
            "run",
            exp_s,
            "--backend",
            "nccl",
            "--out",
            bad_out.to_str().unwrap(),
        ],
    );
    let all = format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    assert_eq!(o.status.code(), Some(2), "{all}");
    assert!(
        all.contains("rank2.safetensors: not a valid safetensors file"),
        "{all}"
    );
    assert!(!bad_out.exists());
    // Rank 2's file valid but mixing element types where the others hold
    // f32 alone: rank 2 refuses it before the rendezvous, naming the file
    // and both tensors' dtypes (exit 2, nothing written).
    let w = rank_files::mixed(11, 2, 1, 3 * 100_003);
    let h: Vec<u16> = (0..7).collect();
    rank_files::write_safetensors(
        &dir.path().join("rank2.safetensors"),
        &[
            rank_files::T::f32("w", &[3, 100_003], &w),
            rank_files::T::bf16("b", &[7], &h),
        ],
    );
    let o = launch(
        4,
        &setting("default", &[]),
        &[
            "run",
            exp_s,
            "--backend",
            "nccl",
            "--out",
            bad_out.to_str().unwrap(),
        ],
    );
    let all = format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    assert_eq!(o.status.code(), Some(2), "{all}");
    assert!(
        all.contains("the tensors of rank2.safetensors mix dtypes (`b` is bf16, `w` is f32)"),
        "{all}"
    );
    assert!(!bad_out.exists());
    save(
        "rank-files.txt",
        &format!(
            "launch W=4 rank files: fixed-order {} (expect equal), sensitivity {}\n",
            n["key"], n["sensitivity"]["verdict"]
        ),
    );
}

#[test]
#[ignore = "needs torchrun: run with --ignored and FOLDPRINT_TORCHRUN"]
fn rank_files_under_torchrun_equal_the_oracle() {
    let dir = tempfile::tempdir().unwrap();
    let exp = rank_file_experiment(dir.path(), 4);
    let cpu_out = dir.path().join("cpu.json");
    let o = command(bin())
        .args(["run", "--backend", "cpu", "--out"])
        .arg(&cpu_out)
        .arg(&exp)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let out = dir.path().join("torchrun.json");
    let o = torchrun(
        4,
        &bin(),
        &[
            "run",
            exp.to_str().unwrap(),
            "--backend",
            "nccl",
            "--emulate-hosts",
            "--out",
            out.to_str().unwrap(),
        ],
    );
    assert_eq!(
        o.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let (cpu, nccl) = (read_json(&cpu_out), read_json(&out));
    assert_eq!(
        nccl["environment"]["backend"]["launch"]["launcher"],
        "torchrun"
    );
    let key = cpu["cases"][0]["key"].as_str().unwrap();
    assert_eq!(
        digests_by_key(&nccl).get(key),
        digests_by_key(&cpu).get(key)
    );
    assert_eq!(nccl["cases"][0]["expect"]["equal"], true);
    assert_eq!(
        nccl["cases"][0]["sensitivity"],
        cpu["cases"][0]["sensitivity"]
    );
}

/// The nccl-tests-style sweep on a world of 4 emulated hosts: every
/// fixed-order result equals the CPU oracle in every element and on every
/// rank, NCCL's own sum drifts from it (the negative control: the bitwise
/// column can count), the output says it is not a bandwidth result, and
/// the CSV has nccl-tests' columns, one row per size.
#[test]
fn the_sweep_checks_every_bit_and_says_emulated_hosts_are_not_bandwidth() {
    let default = setting("default", &[]);
    let sweep = [
        "bench",
        "--backend",
        "nccl",
        "-b",
        "4K",
        "-e",
        "4M",
        "-f",
        "4",
        "-n",
        "3",
    ];
    let json: Vec<&str> = sweep.iter().copied().chain(["--json"]).collect();
    let o = launch(4, &default, &json);
    assert_eq!(o.status.code(), Some(0));
    let text = String::from_utf8_lossy(&o.stdout).into_owned();
    save("sweep.json", &text);
    let v: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(v["world"], 4);
    assert_eq!(v["bandwidth_result"], false);
    assert!(v["not_bandwidth"]
        .as_str()
        .unwrap()
        .contains("emulated hosts"));
    let rows = v["rows"].as_array().unwrap();
    let bytes: Vec<u64> = rows.iter().map(|r| r["bytes"].as_u64().unwrap()).collect();
    assert_eq!(
        bytes,
        [4 << 10, 16 << 10, 64 << 10, 256 << 10, 1 << 20, 4 << 20]
    );
    for r in rows {
        assert_eq!(
            r["count"].as_u64().unwrap() * 4,
            r["bytes"].as_u64().unwrap()
        );
        assert_eq!(r["dtype"], "f32");
        assert_eq!(r["fixed_vs_oracle"], 0, "{r}");
        assert_eq!(r["fixed_ranks_differing"], 0, "{r}");
        let busbw = r["fixed_algbw"].as_f64().unwrap() * 2.0 * 3.0 / 4.0;
        assert!((r["fixed_busbw"].as_f64().unwrap() - busbw).abs() <= 1e-9 * busbw);
    }
    let drift = rows.last().unwrap()["allreduce_vs_fixed"].as_u64().unwrap();
    assert!(
        drift > 0,
        "NCCL's ring sum of mixed magnitudes equals fixed-order"
    );

    let csv: Vec<&str> = sweep.iter().copied().chain(["--csv"]).collect();
    let o = launch(4, &default, &csv);
    assert_eq!(o.status.code(), Some(0));
    let text = String::from_utf8_lossy(&o.stdout).into_owned();
    save("sweep.csv", &text);
    let lines: Vec<&str> = text.lines().collect();
    assert!(lines[0].starts_with("size_bytes,count,type,redop,world,fixed_time_us,"));
    assert_eq!(lines.len(), 1 + 6, "{text}");
    for l in &lines[1..] {
        let cells: Vec<&str> = l.split(',').collect();
        assert_eq!(cells.len(), 14, "{l}");
        assert_eq!((cells[2], cells[3], cells[4]), ("f32", "sum", "4"));
        assert_eq!(cells[8], "0", "{l}");
        assert_eq!(cells[13], "false", "{l}");
    }
    assert!(String::from_utf8_lossy(&o.stderr).contains("NOT A BANDWIDTH RESULT"));
}

/// bf16 and f16 at W = 8: every distribution, contract, mean or not.
const HALF_TOML: &str = r#"
name = "nccl-half"
description = "bf16 and f16 cases, and NCCL's own sum in the wire dtype"

[defaults]
world = 8
arenas = [262147, 10007, 3]
seed = 5

[[sweep]]
id = "h"
dtype = ["bf16", "f16"]
distribution = ["mixed-magnitude", "uniform", "cancellation", "subnormal-heavy", "specials", "exact-integers"]
contract = ["fixed-order", "arrival-order", "pairwise-tree"]
order = ["shuffle:3"]
mean = [false, true]

[[sweep]]
id = "sum"
dtype = ["bf16", "f16", "f32"]
distribution = ["mixed-magnitude"]
contract = ["fixed-order", "nccl-allreduce"]
"#;

/// Under `launch -n 8 --emulate-hosts`, every bf16 and f16 case the CPU
/// oracle runs gives its digests (the exchange and redistribution move the
/// dtype's bytes); NCCL's own sum runs in bf16 and f16 (ncclBfloat16,
/// ncclFloat16) and differs from fixed-order's single rounding.
#[test]
fn bf16_and_f16_under_emulated_hosts_equal_the_oracle_and_nccls_sum_drifts() {
    let dir = tempfile::tempdir().unwrap();
    let exp = dir.path().join("half.toml");
    std::fs::write(&exp, HALF_TOML).unwrap();
    let out = dir.path().join("nccl.json");
    let o = launch(
        8,
        &setting("default", &[]),
        &[
            "run",
            exp.to_str().unwrap(),
            "--backend",
            "nccl",
            "--out",
            out.to_str().unwrap(),
        ],
    );
    assert!(o.status.success());
    let r = read_json(&out);
    assert_emulated(&r, 8);
    let nccl = digests_by_key(&r);
    let cpu_out = dir.path().join("cpu.json");
    let s = command(bin())
        .args(["run", exp.to_str().unwrap(), "--backend", "cpu"])
        .args(["--out", cpu_out.to_str().unwrap()])
        .stdout(Stdio::null())
        .status()
        .unwrap();
    assert!(s.success());
    let cpu = digests_by_key(&read_json(&cpu_out));
    let mut table = String::new();
    let mut compared = 0;
    for (key, d) in &nccl {
        table.push_str(&format!("{key} {}\n", d[0]));
        if key.starts_with("nccl-allreduce/") {
            continue;
        }
        assert_eq!(Some(d), cpu.get(key), "{key}: NCCL vs the CPU oracle");
        compared += 1;
    }
    save("half.txt", &table);
    // 2 dtypes x 6 distributions x 3 contracts x 2, and fixed-order of `sum`.
    assert!(compared >= 72 + 3, "only {compared} cases compared");
    for dtype in ["bf16", "f16", "f32"] {
        let control: Vec<(&String, &Vec<String>)> = nccl
            .iter()
            .filter(|(k, _)| {
                // f32 keys name no dtype.
                let named = ["bf16", "f16"]
                    .iter()
                    .find(|d| k.contains(&format!("/{d}/")));
                k.starts_with("nccl-allreduce/") && named.copied().unwrap_or("f32") == dtype
            })
            .collect();
        assert_eq!(control.len(), 1, "{dtype}: {control:?}");
        let (key, sum) = control[0];
        let fixed = &nccl[&key.replacen("nccl-allreduce/", "fixed-order/", 1)];
        // The large arena must show the drift (the small ones may not).
        assert_ne!(sum[0], fixed[0], "{key}: NCCL's sum equals fixed-order");
        eprintln!(
            "{key}: NCCL's sum {} vs fixed-order {}",
            &sum[0][..16],
            &fixed[0][..16]
        );
    }
}

/// `verify experiments/reduce-scatter.toml` against its golden under
/// `launch -n W --emulate-hosts`, report to `out`.
fn verify_scatter_goldens(world: usize, out: &Path) -> Output {
    launch(
        world,
        &setting("default", &[]),
        &[
            "verify",
            "experiments/reduce-scatter.toml",
            "--golden",
            "experiments/golden",
            "--backend",
            "nccl",
            "--out",
            out.to_str().unwrap(),
        ],
    )
}

/// The reduce-scatter goldens (W 3 and 7: the worlds they hold besides 1
/// and 64) verify under emulated hosts: fixed-order and the host contracts,
/// uneven and even lengths, n < W, empty arenas, sums and means, bf16 and
/// f16; each case reports W shard digests and no rank copies.
#[test]
fn emulated_worlds_reproduce_the_reduce_scatter_goldens() {
    let dir = tempfile::tempdir().unwrap();
    let mut table = String::new();
    for world in [3usize, 7] {
        let out = dir.path().join(format!("rs-w{world}.json"));
        let o = verify_scatter_goldens(world, &out);
        assert!(o.status.success(), "W = {world}: verify failed");
        let r = read_json(&out);
        assert_emulated(&r, world);
        let cases = r["cases"].as_array().unwrap();
        let scattered: Vec<&Value> = cases
            .iter()
            .filter(|c| c["params"]["collective"] == "reduce-scatter")
            .collect();
        assert!(
            scattered.len() >= 10,
            "W = {world}: {} cases",
            scattered.len()
        );
        for c in &scattered {
            for a in c["arenas"].as_array().unwrap() {
                assert_eq!(a["shard_sha256"].as_array().unwrap().len(), world, "{c}");
                assert!(a["rank_sha256"].as_array().unwrap().is_empty(), "{c}");
            }
        }
        let line = format!(
            "launch W={world}: {} reduce-scatter cases equal the goldens\n",
            scattered.len()
        );
        eprint!("{line}");
        table += &line;
    }
    save("reduce-scatter-goldens.txt", &table);
}

const SCATTER_W8_TOML: &str = r#"
name = "rs8"
description = "reduce-scatter at W = 8 on NCCL against the CPU oracle, and NCCL's own"

[defaults]
world = 8
collective = "reduce-scatter"
seed = 3
distribution = "mixed-magnitude"
order = "descending"

[[sweep]]
id = "ours"
arenas = [[100003, 5, 0], [65536, 64]]
contract = ["fixed-order", "arrival-order", "pairwise-tree"]
mean = [false, true]
dtype = ["f32", "bf16", "f16"]

[[sweep]]
id = "nccl"
contract = ["nccl-allreduce"]
arenas = [[65536, 64], [100003]]
mean = [false, true]
dtype = ["f32", "bf16", "f16"]
"#;

/// At W = 8 under emulated hosts, every reduce-scatter the CPU oracle runs
/// gives its arena, shard and chunk digests on NCCL (f32, bf16, f16; uneven
/// lengths, n < W, empty). NCCL's own reduce-scatter runs where W divides
/// every length, sum and mean (ncclAvg), W shard digests each, and skips a
/// length W does not divide with the reason naming the length and W.
#[test]
fn reduce_scatter_at_w8_equals_the_oracle_and_the_control_skips_unequal_shards() {
    let dir = tempfile::tempdir().unwrap();
    let exp = dir.path().join("rs8.toml");
    std::fs::write(&exp, SCATTER_W8_TOML).unwrap();
    let cpu_out = dir.path().join("cpu.json");
    let o = command(bin())
        .args(["run", "--backend", "cpu", "--out"])
        .arg(&cpu_out)
        .arg(&exp)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let out = dir.path().join("nccl.json");
    let o = launch(
        8,
        &setting("default", &[]),
        &[
            "run",
            exp.to_str().unwrap(),
            "--backend",
            "nccl",
            "--out",
            out.to_str().unwrap(),
        ],
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stdout));
    let (cpu, nccl) = (read_json(&cpu_out), read_json(&out));
    assert_emulated(&nccl, 8);
    let by_key = |r: &Value| -> BTreeMap<String, Value> {
        r["cases"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| {
                let arenas: Vec<Value> = c["arenas"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|a| serde_json::json!([a["sha256"], a["shard_sha256"], a["chunk_sha256"]]))
                    .collect();
                (c["key"].as_str().unwrap().to_string(), Value::from(arenas))
            })
            .collect()
    };
    let (want, got) = (by_key(&cpu), by_key(&nccl));
    assert_eq!(want.len(), 36, "{:?}", want.keys());
    for (k, v) in &want {
        assert_eq!(got.get(k), Some(v), "{k}");
    }
    // NCCL's own: 6 ran (3 dtypes x sum/mean), 6 skipped with the reason.
    let controls: Vec<&String> = got.keys().filter(|k| !want.contains_key(*k)).collect();
    assert_eq!(controls.len(), 6, "{controls:?}");
    for c in nccl["cases"].as_array().unwrap() {
        if c["params"]["contract"] == "nccl-allreduce" {
            for a in c["arenas"].as_array().unwrap() {
                assert_eq!(a["shard_sha256"].as_array().unwrap().len(), 8, "{c}");
            }
        }
    }
    let skipped = nccl["skipped"].as_array().unwrap();
    assert_eq!(skipped.len(), 6, "{skipped:?}");
    for s in skipped {
        assert_eq!(
            s["reason"],
            "ncclReduceScatter needs equal shards: arena 0 has n = 100003, not a multiple of W = 8",
            "{s}"
        );
    }
    // Whether NCCL's reduce-scatter gave fixed-order's bits here (a fact
    // of this NCCL and card, recorded, not required).
    let digest_of = |id: &str| -> Value {
        nccl["cases"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["id"] == id)
            .map(|c| c["arenas"][0]["sha256"].clone())
            .unwrap_or(Value::Null)
    };
    let (control, fixed) = (
        digest_of("nccl[n=65536+64,mean=false,f32]"),
        digest_of("ours[n=65536+64,fixed-order,mean=false,f32]"),
    );
    assert!(
        control.is_string() && fixed.is_string(),
        "{control} {fixed}"
    );
    let line = format!(
        "launch W=8: {} reduce-scatter cases equal the CPU oracle; ncclReduceScatter f32 sum {} fixed-order's\n",
        want.len(),
        if control == fixed {
            "equals"
        } else {
            "differs from"
        }
    );
    eprint!("{line}");
    save("reduce-scatter-w8.txt", &line);
}

/// A reduce-scatter of rank files under `launch -n 4`, `expect` one file
/// per rank: each rank reads and compares only its own shard's file, and
/// rank 0's report holds all four outcomes. One element of rank 2's file
/// one ULP off: rank 2's outcome alone differs, naming its file (exit 1).
#[test]
fn per_rank_expect_files_under_launch_each_rank_checks_its_own() {
    let dir = tempfile::tempdir().unwrap();
    let n = 100_003;
    let sums: Vec<Vec<f32>> = rank_files::grads(dir.path(), 4, n)
        .iter()
        .map(|t| rank_files::rank_order_sum(t))
        .collect();
    std::fs::create_dir_all(dir.path().join("out")).unwrap();
    let write = |r: usize, edit: bool| {
        let tensors: Vec<rank_files::T> = ["b", "w"]
            .iter()
            .zip(&sums)
            .map(|(name, sum)| {
                let plan = foldprint::fold::shard_plan(sum.len(), 4).unwrap();
                let mut s = sum[plan[r].range()].to_vec();
                if edit && *name == "w" {
                    s[5] = f32::from_bits(s[5].to_bits() + 1);
                }
                rank_files::T::f32(name, &[s.len()], &s)
            })
            .collect();
        rank_files::write_safetensors(
            &dir.path().join(format!("out/rank{r}.safetensors")),
            &tensors,
        );
    };
    for r in 0..4 {
        write(r, false);
    }
    let exp = dir.path().join("pr.toml");
    std::fs::write(
        &exp,
        "name = \"pr\"\n[[case]]\nid = \"c\"\naddends = \"rank{rank}.safetensors\"\n\
         collective = \"reduce-scatter\"\nexpect = \"out/rank{rank}.safetensors\"\n",
    )
    .unwrap();
    let out = dir.path().join("r.json");
    let run = || {
        let o = launch(
            4,
            &setting("default", &[]),
            &[
                "run",
                exp.to_str().unwrap(),
                "--backend",
                "nccl",
                "--out",
                out.to_str().unwrap(),
            ],
        );
        let r = read_json(&out);
        let equal: Vec<bool> = r["cases"][0]["expect_ranks"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e["equal"].as_bool().unwrap())
            .collect();
        (o, r, equal)
    };
    let (o, r, equal) = run();
    assert_eq!(
        o.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&o.stdout)
    );
    assert_eq!(equal, [true; 4]);
    assert_emulated(&r, 4);
    write(2, true);
    let (o, r, equal) = run();
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert_eq!(o.status.code(), Some(1), "{stdout}");
    assert_eq!(equal, [true, true, false, true]);
    assert_eq!(
        r["cases"][0]["expect_ranks"][2]["path"],
        "out/rank2.safetensors"
    );
    assert!(
        stdout.contains("differs from out/rank2.safetensors: 1 element(s), up to 1 ULP"),
        "{stdout}"
    );
}

#[test]
#[ignore = "needs torchrun: run with --ignored and FOLDPRINT_TORCHRUN"]
fn torchrun_with_emulated_hosts_reproduces_the_reduce_scatter_goldens() {
    let dir = tempfile::tempdir().unwrap();
    let mut table = String::new();
    for n in [3, 7] {
        let out = dir.path().join(format!("torchrun-rs-w{n}.json"));
        let o = torchrun(
            n,
            &bin(),
            &[
                "verify",
                "experiments/reduce-scatter.toml",
                "--golden",
                "experiments/golden",
                "--backend",
                "nccl",
                "--emulate-hosts",
                "--out",
                out.to_str().unwrap(),
            ],
        );
        assert!(
            o.status.success(),
            "W={n}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        let r = read_json(&out);
        assert_emulated(&r, n);
        assert_eq!(
            r["environment"]["backend"]["launch"]["launcher"],
            "torchrun"
        );
        let cases = r["cases"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|c| c["params"]["collective"] == "reduce-scatter")
            .count();
        assert!(cases >= 10, "W={n}: {cases} reduce-scatter cases verified");
        table += &format!("torchrun W={n}: {cases} reduce-scatter cases verified\n");
    }
    eprint!("{table}");
    save("torchrun-reduce-scatter.txt", &table);
}

#[test]
#[ignore = "needs torchrun and PyTorch: FOLDPRINT_TORCHRUN and FOLDPRINT_TORCH_NCCL"]
fn pytorch_reduce_scatter_tensor_is_the_nccl_reduce_scatter_control() {
    const N: usize = 1 << 20;
    const SEED: u64 = 23;
    let nccl = torch_nccl();
    let mut table = String::new();
    for dtype in [Dtype::F32, Dtype::Bf16] {
        for world in [4usize, 8] {
            let dir = tempfile::tempdir().unwrap();
            for r in 0..world {
                let lane = foldprint::data::Lane::new(
                    foldprint::data::Distribution::MixedMagnitude,
                    SEED,
                    r as u32,
                    0,
                );
                let mut v = vec![0f32; N];
                lane.fill(0, &mut v);
                let mut bytes = Vec::with_capacity(N * dtype.bytes());
                for x in &v {
                    dtype.put_le(dtype.narrow(*x), &mut bytes);
                }
                std::fs::write(dir.path().join(format!("rank{r}.{dtype}")), bytes).unwrap();
            }
            // foldprint's control, sum and mean, with PyTorch's NCCL.
            let exp = dir.path().join("rs-parity.toml");
            std::fs::write(
                &exp,
                format!(
                    "name = \"rs-parity\"\n[defaults]\nworld = {world}\narenas = [{N}]\n\
                     distribution = \"mixed-magnitude\"\nseed = {SEED}\ndtype = \"{dtype}\"\n\
                     collective = \"reduce-scatter\"\ncontract = \"nccl-allreduce\"\n\n\
                     [[sweep]]\nid = \"p\"\nmean = [false, true]\n"
                ),
            )
            .unwrap();
            let report = dir.path().join("r.json");
            let o = torchrun_cmd(world)
                .env("FOLDPRINT_JOB_ID", "parity")
                .env("FOLDPRINT_NCCL_LIBRARY", &nccl)
                .arg("--no-python")
                .arg(bin())
                .args([
                    "run",
                    exp.to_str().unwrap(),
                    "--backend",
                    "nccl",
                    "--emulate-hosts",
                ])
                .arg("--out")
                .arg(&report)
                .output()
                .unwrap();
            assert!(
                o.status.success(),
                "foldprint {dtype} W={world}: {}",
                String::from_utf8_lossy(&o.stderr)
            );
            let r = read_json(&report);
            let shards = |mean: bool| -> Vec<String> {
                let c = r["cases"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .find(|c| c["params"]["mean"] == mean)
                    .unwrap_or_else(|| panic!("no mean={mean} case: {r}"));
                c["arenas"][0]["shard_sha256"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|d| d.as_str().unwrap().to_string())
                    .collect()
            };
            let (sum, avg) = (shards(false), shards(true));
            assert_eq!(sum.len(), world);
            for op in ["sum", "avg"] {
                let o = torchrun_cmd(world)
                    .arg("tools/torch_parity.py")
                    .arg(dir.path())
                    .arg("foldprint-parity-host")
                    .arg(dtype.name())
                    .args(["--collective", "reduce-scatter", "--op", op])
                    .output()
                    .unwrap();
                assert!(
                    o.status.success(),
                    "PyTorch {dtype} W={world} {op}: {}",
                    String::from_utf8_lossy(&o.stderr)
                );
                let torch: Vec<String> = (0..world)
                    .map(|rank| {
                        digest_of_torch_file(
                            &dir.path()
                                .join(format!("reducescatter-{op}.rank{rank}.{dtype}")),
                            dtype,
                            N / world,
                        )
                    })
                    .collect();
                let (want, other) = if op == "sum" {
                    (&sum, &avg)
                } else {
                    (&avg, &sum)
                };
                assert_eq!(
                    &torch, want,
                    "{dtype} W={world}: reduce_scatter_tensor {op} vs the control"
                );
                // Negative control: the other op's control differs on
                // every shard, and the check sees it.
                assert!(
                    torch.iter().zip(other).all(|(t, o)| t != o),
                    "{dtype} W={world}: {op} equals the other op's control"
                );
                table += &format!(
                    "{dtype} W={world} {op}: reduce_scatter_tensor == nccl-allreduce reduce-scatter control on all {world} shards ({})\n",
                    String::from_utf8_lossy(&o.stdout).trim()
                );
            }
        }
    }
    eprint!("{table}");
    save("torch-parity-reduce-scatter.txt", &table);
}

/// `bench --backend nccl --collective reduce-scatter` under emulated
/// hosts: each row times the fixed-order reduce-scatter, NCCL's and the
/// fixed-order all-reduce of the same arena, and counts the bits: the
/// fixed-order shards equal the CPU oracle's everywhere; at W = 4 (which
/// divides every size) NCCL's runs and its drift is counted, at W = 3
/// (which divides none) it is left out, not refused.
#[test]
fn the_reduce_scatter_sweep_checks_its_bits_next_to_ncclreducescatter() {
    let default = setting("default", &[]);
    let mut table = String::new();
    for world in [4usize, 3] {
        let o = launch(
            world,
            &default,
            &[
                "bench",
                "--backend",
                "nccl",
                "--collective",
                "reduce-scatter",
                "-b",
                "4K",
                "-e",
                "4M",
                "-f",
                "4",
                "-n",
                "3",
                "--json",
            ],
        );
        assert_eq!(o.status.code(), Some(0));
        let text = String::from_utf8_lossy(&o.stdout).into_owned();
        save(&format!("sweep-reduce-scatter-w{world}.json"), &text);
        let v: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(
            (v["world"].as_u64(), &v["collective"]),
            (Some(world as u64), &Value::from("reduce-scatter"))
        );
        assert_eq!(v["bandwidth_result"], false);
        let rows = v["rows"].as_array().unwrap();
        assert_eq!(rows.len(), 6);
        for r in rows {
            assert_eq!(r["fixed_vs_oracle"], 0, "{r}");
            assert!(r["fixed_ms"].as_f64().unwrap() > 0.0, "{r}");
            assert!(r["allreduce_ms"].as_f64().unwrap() > 0.0, "{r}");
            let w = world as f64;
            let busbw = r["fixed_algbw"].as_f64().unwrap() * (w - 1.0) / w;
            assert!((r["fixed_busbw"].as_f64().unwrap() - busbw).abs() <= 1e-9 * busbw);
            if world == 4 {
                assert!(r["reducescatter_ms"].as_f64().unwrap() > 0.0, "{r}");
                assert!(r["reducescatter_vs_fixed"].as_u64().is_some(), "{r}");
            } else {
                assert!(r["reducescatter_ms"].is_null(), "{r}");
                assert!(r["reducescatter_vs_fixed"].is_null(), "{r}");
            }
            table += &format!(
                "W={world} {} B: fixed-order reduce-scatter {:.1} us, ncclReduceScatter {} us, fixed-order all-reduce {:.1} us, NCCL drift {}\n",
                r["bytes"],
                r["fixed_ms"].as_f64().unwrap() * 1e3,
                r["reducescatter_ms"].as_f64().map_or("-".into(), |m| format!("{:.1}", m * 1e3)),
                r["allreduce_ms"].as_f64().unwrap() * 1e3,
                r["reducescatter_vs_fixed"]
            );
        }
    }
    eprint!("{table}");
    save("sweep-reduce-scatter.txt", &table);
}
