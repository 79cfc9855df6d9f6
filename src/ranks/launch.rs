//! `foldprint launch -n N`: start N local ranks with foldprint's rank
//! variables, a free rendezvous port and a fresh job token; when one rank
//! fails, give the others a moment to report their own view, stop them,
//! and report which rank failed first.
//!
//! With emulated hosts every rank gets its own `NCCL_HOSTID`, so NCCL
//! treats each process as a separate node and runs several ranks on one
//! GPU over its network transport (sockets on loopback). That is NCCL's
//! real inter-node code path, but never a bandwidth measurement.
//!
//! A program started with `--exec` also gets torchrun's variables, equal to
//! foldprint's own, so a PyTorch script runs under `launch` unchanged.

use super::RankError;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// More ranks than this is a typo, not a job.
pub const MAX_RANKS: usize = 1024;

/// Set in every rank of an emulated-hosts launch; the NCCL backend reports it.
pub const EMULATED_HOSTS_VAR: &str = "FOLDPRINT_EMULATED_HOSTS";

/// Which host id each rank gets under emulation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum HostIds {
    /// Rank r is host r.
    Ascending,
    /// Rank r is host N-1-r: NCCL orders hosts by their id, so this changes
    /// the topology it builds without changing any rank.
    Reversed,
}

/// Several ranks per GPU, each its own emulated host.
#[derive(Debug, Clone)]
pub struct Emulation {
    /// GPUs the ranks are spread over, round-robin (at least 1).
    pub gpus: usize,
    pub host_ids: HostIds,
}

pub struct LaunchSpec {
    pub ranks: usize,
    pub program: OsString,
    pub args: Vec<OsString>,
    /// Let every rank print to stdout, each line of every rank's stdout and
    /// stderr prefixed `[rank R] ` (default: rank 0's stdout only, and
    /// every rank's stderr, as the ranks write them).
    pub all_stdout: bool,
    /// Also set torchrun's variables (`RANK`, `WORLD_SIZE`, `LOCAL_RANK`,
    /// `LOCAL_WORLD_SIZE`, `MASTER_ADDR`, `MASTER_PORT`), for programs
    /// written for torchrun.
    pub torchrun_vars: bool,
    /// After the first failure, how long the others may take to exit on
    /// their own (a live rank notices a dead peer and says so) before SIGTERM.
    pub settle: Duration,
    /// How long the others get between SIGTERM and SIGKILL.
    pub grace: Duration,
    pub emulate: Option<Emulation>,
    /// Route each rank's NCCL log to a file (`NCCL_DEBUG=INFO`, INIT and
    /// NET only) so the report can say which transports NCCL chose.
    pub nccl_logs: bool,
}

#[derive(Debug)]
pub struct Outcome {
    /// Exit code of the job: 0, or the first failing rank's code (a rank
    /// killed by a signal counts as an infrastructure failure, 4).
    pub code: i32,
    pub first_failure: Option<(usize, String)>,
    /// How every other rank ended, in rank order, when one failed.
    pub others: Vec<(usize, String)>,
    /// Where the ranks' NCCL logs were kept (only after a failure).
    pub kept_logs: Option<PathBuf>,
    /// `NCCL WARN` lines from those logs, for the user's terminal.
    pub warnings: Vec<String>,
    /// The signal (SIGINT, SIGTERM, SIGHUP) that made the launcher stop
    /// every rank.
    pub interrupted: Option<i32>,
}

/// A fresh random token (also each directory rendezvous attempt's name).
pub(crate) fn token() -> String {
    let mut bytes = [0u8; 16];
    if let Ok(mut f) = std::fs::File::open("/dev/urandom") {
        let _ = std::io::Read::read_exact(&mut f, &mut bytes);
    }
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    bytes[..8]
        .iter_mut()
        .zip(t.as_nanos().to_le_bytes())
        .for_each(|(b, x)| *b ^= x);
    hex::encode(bytes)
}

fn describe(s: ExitStatus) -> (i32, String) {
    use std::os::unix::process::ExitStatusExt;
    match (s.code(), s.signal()) {
        (Some(c), _) => (c, format!("exit code {c}")),
        (None, Some(sig)) => (4, format!("killed by signal {sig}")),
        _ => (4, "unknown status".into()),
    }
}

/// Signal a rank's whole process group (the rank leads its own group), so
/// wrappers such as `env` or `timeout` and whatever they started go too.
fn signal_group(c: &Child, sig: libc::c_int) {
    // SAFETY: plain kill(2) on the group of a child we spawned and have not reaped.
    unsafe {
        libc::kill(-(c.id() as libc::pid_t), sig);
    }
}

/// The first of SIGINT, SIGTERM, SIGHUP that reached the launcher (0: none).
static STOP: std::sync::atomic::AtomicI32 = std::sync::atomic::AtomicI32::new(0);

extern "C" fn on_stop(sig: libc::c_int) {
    // An atomic store is all a signal handler may safely do here.
    let _ = STOP.compare_exchange(
        0,
        sig,
        std::sync::atomic::Ordering::SeqCst,
        std::sync::atomic::Ordering::SeqCst,
    );
}

/// Ranks run in their own process groups, so a Ctrl-C at the terminal
/// reaches only the launcher: catch it and stop the ranks ourselves.
fn catch_stop_signals() {
    for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
        // SAFETY: installing a handler that only stores to an atomic.
        unsafe {
            libc::signal(
                sig,
                on_stop as extern "C" fn(libc::c_int) as libc::sighandler_t,
            );
        }
    }
}

/// SIGTERM everyone, wait up to `grace`, then SIGKILL; returns how each ended.
fn terminate(children: &mut Vec<(usize, Child)>, grace: Duration) -> Vec<(usize, String)> {
    for (_, c) in children.iter() {
        signal_group(c, libc::SIGTERM);
    }
    let until = Instant::now() + grace;
    while Instant::now() < until
        && children
            .iter_mut()
            .any(|(_, c)| matches!(c.try_wait(), Ok(None)))
    {
        std::thread::sleep(Duration::from_millis(20));
    }
    let mut ended = Vec::new();
    for (r, c) in children.iter_mut() {
        let what = match c.try_wait() {
            Ok(Some(s)) => format!("{}, after SIGTERM", describe(s).1),
            _ => {
                signal_group(c, libc::SIGKILL);
                let _ = c.kill();
                let _ = c.wait();
                "killed (SIGKILL) after the grace period".to_string()
            }
        };
        ended.push((*r, what));
    }
    children.clear();
    ended
}

/// The host id of rank `r` under emulation: unique per job and rank.
pub fn host_id(job: &str, r: usize, ranks: usize, order: HostIds) -> String {
    let h = match order {
        HostIds::Ascending => r,
        HostIds::Reversed => ranks - 1 - r,
    };
    format!("foldprint-{}-host{h:04}", &job[..job.len().min(8)])
}

/// A private directory for the ranks' NCCL logs.
fn log_dir(job: &str) -> Result<PathBuf, RankError> {
    use std::os::unix::fs::DirBuilderExt;
    let dir = std::env::temp_dir().join(format!("foldprint-launch-{job}"));
    std::fs::DirBuilder::new()
        .mode(0o700)
        .create(&dir)
        .map_err(|e| RankError::Launch(format!("creating {}: {e}", dir.display())))?;
    Ok(dir)
}

/// Whether any rank wrote to its NCCL log (a CPU run writes none).
fn has_logs(dir: &Path) -> bool {
    std::fs::read_dir(dir).is_ok_and(|entries| {
        entries
            .flatten()
            .any(|e| e.metadata().is_ok_and(|m| m.len() > 0))
    })
}

/// The `NCCL WARN` lines of every log in `dir`, rank order, at most `max`.
fn warnings(dir: &Path, ranks: usize, max: usize) -> Vec<String> {
    let mut out = Vec::new();
    for r in 0..ranks {
        let Ok(text) = std::fs::read_to_string(dir.join(format!("nccl.rank{r}.log"))) else {
            continue;
        };
        for l in text.lines().filter(|l| l.contains("NCCL WARN")) {
            if out.len() == max {
                return out;
            }
            out.push(format!("rank {r}: {}", l.trim()));
        }
    }
    out
}

/// Whether rank arguments select the NCCL backend (`--backend nccl` or
/// `--backend=nccl`), whose ranks need a GPU each.
pub fn ranks_need_gpus(args: &[OsString]) -> bool {
    args.windows(2)
        .any(|w| w[0] == "--backend" && w[1] == "nccl")
        || args.iter().any(|a| a == "--backend=nccl")
}

/// Rank 0's ports: (foldprint's rendezvous, torchrun's store). With
/// torchrun's variables the store gets a free port P and the rendezvous
/// P + 1, the layout foldprint's ranks assume under torchrun itself, so
/// PyTorch's store and a foldprint rendezvous in the same job never meet.
fn free_ports(torchrun_vars: bool) -> Result<(u16, Option<u16>), RankError> {
    use std::net::TcpListener;
    let bind = |port: u16| TcpListener::bind(("127.0.0.1", port));
    let err = |e: std::io::Error| RankError::Launch(format!("finding a free port: {e}"));
    if !torchrun_vars {
        let port = bind(0).and_then(|l| l.local_addr()).map_err(err)?.port();
        return Ok((port, None));
    }
    for _ in 0..64 {
        let store = bind(0).map_err(err)?;
        let p = store.local_addr().map_err(err)?.port();
        if let Some(next) = p.checked_add(1) {
            if bind(next).is_ok() {
                return Ok((next, Some(p)));
            }
        }
    }
    Err(RankError::Launch(
        "finding a free port: no two adjacent free ports on 127.0.0.1 in 64 tries".into(),
    ))
}

/// Copy a rank's output to ours, line by line, each line prefixed and
/// written whole under the stream's lock, so lines of different ranks never
/// mix. A last line without a newline gets one. After our own stream fails
/// (a closed pipe) the rank's output is still drained, so it never blocks.
fn forward(src: impl std::io::Read, prefix: String, to_stderr: bool) {
    use std::io::{BufRead, Write};
    let mut src = std::io::BufReader::new(src);
    let mut line = Vec::new();
    let mut open = true;
    loop {
        line.clear();
        match src.read_until(b'\n', &mut line) {
            Ok(0) => break,
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(_) => break,
        }
        if !open {
            continue;
        }
        let mut out = Vec::with_capacity(prefix.len() + line.len() + 1);
        out.extend_from_slice(prefix.as_bytes());
        out.extend_from_slice(&line);
        if !line.ends_with(b"\n") {
            out.push(b'\n');
        }
        let written = if to_stderr {
            let mut e = std::io::stderr().lock();
            e.write_all(&out).and_then(|()| e.flush())
        } else {
            let mut o = std::io::stdout().lock();
            o.write_all(&out).and_then(|()| o.flush())
        };
        open = written.is_ok();
    }
}

/// The threads forwarding the ranks' output, and how to wait for them.
struct Forwarders {
    done: std::sync::mpsc::Receiver<()>,
    tell: std::sync::mpsc::Sender<()>,
    running: usize,
}

impl Forwarders {
    fn new() -> Forwarders {
        let (tell, done) = std::sync::mpsc::channel();
        Forwarders {
            done,
            tell,
            running: 0,
        }
    }

    /// Forward rank `r`'s piped stdout and stderr.
    fn start(&mut self, r: usize, c: &mut Child) {
        let out = c
            .stdout
            .take()
            .map(|p| (Box::new(p) as Box<dyn std::io::Read + Send>, false));
        let err = c
            .stderr
            .take()
            .map(|p| (Box::new(p) as Box<dyn std::io::Read + Send>, true));
        for (pipe, to_stderr) in out.into_iter().chain(err) {
            let tell = self.tell.clone();
            let prefix = format!("[rank {r}] ");
            self.running += 1;
            std::thread::spawn(move || {
                forward(pipe, prefix, to_stderr);
                let _ = tell.send(());
            });
        }
    }

    /// Wait until every rank's output is copied; a process the ranks left
    /// behind may hold a pipe open, so give up `grace` after the last rank.
    fn finish(self, grace: Duration) {
        let until = Instant::now() + grace;
        for _ in 0..self.running {
            let left = until.saturating_duration_since(Instant::now());
            if self.done.recv_timeout(left).is_err() {
                return;
            }
        }
    }
}

pub fn launch(spec: &LaunchSpec) -> Result<Outcome, RankError> {
    if spec.ranks == 0 {
        return Err(RankError::LaunchSize("-n must be at least 1".into()));
    }
    if spec.ranks > MAX_RANKS {
        return Err(RankError::LaunchSize(format!(
            "-n {} is more than {MAX_RANKS} local ranks",
            spec.ranks
        )));
    }
    let (port, store_port) = free_ports(spec.torchrun_vars)?;
    let job = token();
    // Keep NCCL's own account of the transports it chose, per rank, unless
    // the user already routes NCCL's log somewhere.
    let logs = match spec.nccl_logs
        && std::env::var_os("NCCL_DEBUG").is_none()
        && std::env::var_os("NCCL_DEBUG_FILE").is_none()
    {
        true => Some(log_dir(&job)?),
        false => None,
    };
    catch_stop_signals();
    let mut children = Vec::with_capacity(spec.ranks);
    let mut forwarders = Forwarders::new();
    for r in 0..spec.ranks {
        let mut cmd = Command::new(&spec.program);
        std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
        let local = spec.emulate.as_ref().map_or(r, |e| r % e.gpus.max(1));
        cmd.args(&spec.args)
            .env("FOLDPRINT_RANK", r.to_string())
            .env("FOLDPRINT_WORLD_SIZE", spec.ranks.to_string())
            .env("FOLDPRINT_LOCAL_RANK", local.to_string())
            .env("FOLDPRINT_MASTER_ADDR", "127.0.0.1")
            .env("FOLDPRINT_MASTER_PORT", port.to_string())
            .env("FOLDPRINT_JOB_TOKEN", &job)
            // Inherited launchers' variables (a Slurm job's, torchrun's)
            // disagree with these: say whose to believe.
            .env(crate::ranks::discover::LAUNCHER_VAR, "foldprint");
        if let Some(store) = store_port {
            // torchrun's names for the same rank, world and local rank.
            cmd.env("RANK", r.to_string())
                .env("WORLD_SIZE", spec.ranks.to_string())
                .env("LOCAL_RANK", local.to_string())
                .env("LOCAL_WORLD_SIZE", spec.ranks.to_string())
                .env("MASTER_ADDR", "127.0.0.1")
                .env("MASTER_PORT", store.to_string());
        }
        if let Some(e) = &spec.emulate {
            cmd.env("NCCL_HOSTID", host_id(&job, r, spec.ranks, e.host_ids))
                .env(
                    EMULATED_HOSTS_VAR,
                    format!("{} ranks on {} GPU(s)", spec.ranks, e.gpus),
                );
        }
        if let Some(dir) = &logs {
            cmd.env("NCCL_DEBUG", "INFO")
                .env("NCCL_DEBUG_SUBSYS", "INIT,NET")
                .env("NCCL_DEBUG_FILE", dir.join(format!("nccl.rank{r}.log")));
        }
        if spec.all_stdout {
            cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
        } else if r > 0 {
            cmd.stdout(Stdio::null());
        }
        match cmd.spawn() {
            Ok(mut c) => {
                forwarders.start(r, &mut c);
                children.push((r, c));
            }
            Err(e) => {
                terminate(&mut children, spec.grace);
                if let Some(dir) = &logs {
                    let _ = std::fs::remove_dir_all(dir);
                }
                return Err(RankError::Launch(format!(
                    "starting rank {r} ({:?}): {e}",
                    spec.program
                )));
            }
        }
    }
    let mut running = children;
    let mut first_failure = None;
    let mut others = Vec::new();
    let mut code = 0;
    let mut settle_until = None;
    let mut interrupted = None;
    while !running.is_empty() {
        let mut i = 0;
        while i < running.len() {
            match running[i].1.try_wait() {
                Ok(Some(status)) => {
                    let (rank, _) = running.swap_remove(i);
                    let (c, what) = describe(status);
                    if first_failure.is_none() && !status.success() {
                        code = c;
                        first_failure = Some((rank, what));
                        settle_until = Some(Instant::now() + spec.settle);
                    } else if first_failure.is_some() {
                        others.push((rank, what));
                    }
                }
                Ok(None) => i += 1,
                Err(e) => {
                    if let Some(dir) = &logs {
                        let _ = std::fs::remove_dir_all(dir);
                    }
                    return Err(RankError::Launch(format!(
                        "waiting for rank {}: {e}",
                        running[i].0
                    )));
                }
            }
        }
        if settle_until.is_some_and(|t| Instant::now() >= t) {
            others.extend(terminate(&mut running, spec.grace));
        }
        let sig = STOP.load(std::sync::atomic::Ordering::SeqCst);
        if sig != 0 && !running.is_empty() {
            others.extend(terminate(&mut running, spec.grace));
            interrupted = Some(sig);
            if first_failure.is_none() {
                code = 128 + sig;
            }
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    forwarders.finish(spec.grace);
    others.sort();
    let (mut kept_logs, mut warns) = (None, Vec::new());
    if let Some(dir) = logs {
        // Kept only when there is something to read in it.
        if (first_failure.is_some() || interrupted.is_some()) && has_logs(&dir) {
            warns = warnings(&dir, spec.ranks, 12);
            kept_logs = Some(dir);
        } else {
            let _ = std::fs::remove_dir_all(&dir);
        }
    }
    Ok(Outcome {
        code,
        first_failure,
        others,
        kept_logs,
        warnings: warns,
        interrupted,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sh(script: &str, ranks: usize) -> LaunchSpec {
        LaunchSpec {
            ranks,
            program: "sh".into(),
            args: vec!["-c".into(), script.into()],
            all_stdout: false,
            torchrun_vars: false,
            settle: Duration::from_millis(300),
            grace: Duration::from_millis(500),
            emulate: None,
            nccl_logs: false,
        }
    }

    #[test]
    fn only_the_nccl_backend_needs_gpus() {
        let need =
            |args: &[&str]| ranks_need_gpus(&args.iter().map(OsString::from).collect::<Vec<_>>());
        assert!(need(&["run", "--backend", "nccl", "e.toml"]));
        assert!(need(&["run", "--backend=nccl", "e.toml"]));
        assert!(!need(&["run", "--backend", "cpu", "e.toml"]));
        assert!(!need(&["run", "--backend=cuda", "--out", "nccl", "nccl"]));
        assert!(!need(&[
            "run",
            "--backend",
            "auto",
            "--junit",
            "--backend=nccl.xml"
        ]));
        assert!(!need(&[]));
    }

    #[test]
    fn all_ranks_succeed_with_their_variables() {
        let o = launch(&sh("test \"$FOLDPRINT_WORLD_SIZE\" = 3 && test -n \"$FOLDPRINT_JOB_TOKEN\" && test \"$FOLDPRINT_RANK\" -lt 3", 3)).unwrap();
        assert_eq!(o.code, 0);
        assert!(o.first_failure.is_none());
    }

    #[test]
    fn one_failing_rank_stops_the_others_quickly() {
        let t = Instant::now();
        let o = launch(&sh(
            "if [ \"$FOLDPRINT_RANK\" = 2 ]; then exit 7; fi; sleep 30",
            4,
        ))
        .unwrap();
        assert_eq!(o.code, 7);
        assert_eq!(o.first_failure.as_ref().map(|f| f.0), Some(2));
        assert!(t.elapsed() < Duration::from_secs(10), "{:?}", t.elapsed());
    }

    #[test]
    fn emulated_hosts_give_each_rank_its_own_host_id_and_gpus_round_robin() {
        let dir = tempfile::tempdir().unwrap();
        let script = format!(
            "echo \"$FOLDPRINT_LOCAL_RANK $NCCL_HOSTID ${EMULATED_HOSTS_VAR}\" > {}/$FOLDPRINT_RANK",
            dir.path().display()
        );
        let mut spec = sh(&script, 5);
        spec.emulate = Some(Emulation {
            gpus: 2,
            host_ids: HostIds::Ascending,
        });
        assert_eq!(launch(&spec).unwrap().code, 0);
        let lines: Vec<String> = (0..5)
            .map(|r| std::fs::read_to_string(dir.path().join(r.to_string())).unwrap())
            .collect();
        let mut ids = std::collections::BTreeSet::new();
        for (r, l) in lines.iter().enumerate() {
            let f: Vec<&str> = l.split_whitespace().collect();
            assert_eq!(f[0], (r % 2).to_string(), "{l}");
            assert!(f[1].ends_with(&format!("host{r:04}")), "{l}");
            assert!(l.contains("5 ranks on 2 GPU(s)"), "{l}");
            ids.insert(f[1].to_string());
        }
        assert_eq!(ids.len(), 5, "host ids must be distinct: {lines:?}");
        // Negative control: without emulation no host id is set and the
        // local rank is the rank.
        spec.emulate = None;
        assert_eq!(launch(&spec).unwrap().code, 0);
        let l = std::fs::read_to_string(dir.path().join("3")).unwrap();
        assert_eq!(l.split_whitespace().collect::<Vec<_>>(), ["3"], "{l}");
    }

    #[test]
    fn reversed_host_ids_mirror_the_ascending_ones() {
        let job = "0123456789abcdef";
        for r in 0..7 {
            assert_eq!(
                host_id(job, r, 7, HostIds::Reversed),
                host_id(job, 6 - r, 7, HostIds::Ascending)
            );
        }
        assert_ne!(
            host_id(job, 0, 7, HostIds::Reversed),
            host_id(job, 0, 7, HostIds::Ascending)
        );
    }

    #[test]
    fn a_rank_killed_by_a_signal_is_an_infrastructure_failure_and_the_others_may_say_so() {
        let mut spec = sh(
            "if [ \"$FOLDPRINT_RANK\" = 1 ]; then kill -9 $$; fi; sleep 0.5; exit 4",
            3,
        );
        spec.settle = Duration::from_secs(5);
        let t = Instant::now();
        let o = launch(&spec).unwrap();
        assert_eq!(o.code, 4);
        let (rank, what) = o.first_failure.unwrap();
        assert_eq!(rank, 1);
        assert!(what.contains("signal 9"), "{what}");
        assert_eq!(
            o.others,
            vec![
                (0, "exit code 4".to_string()),
                (2, "exit code 4".to_string())
            ]
        );
        assert!(t.elapsed() < Duration::from_secs(4), "{:?}", t.elapsed());
    }

    #[test]
    fn too_many_ranks_are_refused_before_anything_starts() {
        let e = launch(&sh("true", MAX_RANKS + 1)).unwrap_err().to_string();
        assert!(e.contains("more than 1024"), "{e}");
    }

    #[test]
    fn nccl_logs_are_kept_with_their_warnings_only_after_a_failure() {
        if std::env::var_os("NCCL_DEBUG").is_some() || std::env::var_os("NCCL_DEBUG_FILE").is_some()
        {
            panic!("unset NCCL_DEBUG and NCCL_DEBUG_FILE to run this test");
        }
        let mut spec = sh(
            "echo \"host:1:2 [0] NCCL INFO Using network Socket\" > \"$NCCL_DEBUG_FILE\"; \
             [ \"$NCCL_DEBUG\" = INFO ] || exit 9; \
             if [ \"$FOLDPRINT_RANK\" = 2 ]; then echo \"host:1:2 [0] NCCL WARN peer gone\" >> \"$NCCL_DEBUG_FILE\"; exit 4; fi",
            3,
        );
        spec.nccl_logs = true;
        let ok = launch(&sh("true", 2)).unwrap();
        assert!(ok.kept_logs.is_none());
        let o = launch(&spec).unwrap();
        assert_eq!(o.code, 4);
        let dir = o.kept_logs.expect("logs are kept after a failure");
        assert_eq!(o.warnings.len(), 1, "{:?}", o.warnings);
        assert!(o.warnings[0].starts_with("rank 2: ") && o.warnings[0].contains("peer gone"));
        std::fs::remove_dir_all(dir).unwrap();
        // A successful job leaves no log directory behind.
        let t = tempfile::tempdir().unwrap();
        let mark = t.path().join("where");
        let mut spec = sh(
            &format!("dirname \"$NCCL_DEBUG_FILE\" > {}", mark.display()),
            1,
        );
        spec.nccl_logs = true;
        let o = launch(&spec).unwrap();
        assert_eq!(o.code, 0);
        assert!(o.kept_logs.is_none());
        let used = std::fs::read_to_string(&mark).unwrap();
        assert!(used.contains("foldprint-launch-"), "{used}");
        assert!(!std::path::Path::new(used.trim()).exists(), "{used}");
    }

    #[test]
    fn stopping_a_rank_stops_what_it_started_too() {
        // A rank that is a wrapper (sh) around a long child: the whole
        // process group goes, so no grandchild outlives the job.
        let dir = tempfile::tempdir().unwrap();
        let pidfile = dir.path().join("grandchild");
        let script = format!(
            "if [ \"$FOLDPRINT_RANK\" = 1 ]; then exit 3; fi; sleep 60 & echo $! > {}; wait",
            pidfile.display()
        );
        let o = launch(&sh(&script, 2)).unwrap();
        assert_eq!(o.code, 3);
        let pid: i32 = std::fs::read_to_string(&pidfile)
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        std::thread::sleep(Duration::from_millis(200));
        // SAFETY: signal 0 only asks whether the process exists.
        let alive = unsafe { libc::kill(pid, 0) } == 0
            && !std::fs::read_to_string(format!("/proc/{pid}/stat"))
                .unwrap_or_default()
                .contains(") Z ");
        assert!(!alive, "the rank's child {pid} outlived the job");
    }
}
