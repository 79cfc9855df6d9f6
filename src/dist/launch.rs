//! `foldprint launch -n N`: start N local ranks with foldprint's rank
//! variables, a free rendezvous port and a fresh job token; when one rank
//! fails, stop the others and report which rank failed first.

use super::DistError;
use std::ffi::OsString;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

pub struct LaunchSpec {
    pub ranks: usize,
    pub program: OsString,
    pub args: Vec<OsString>,
    /// Let every rank print to stdout (default: rank 0 only).
    pub all_stdout: bool,
    /// How long the others get between SIGTERM and SIGKILL.
    pub grace: Duration,
}

#[derive(Debug)]
pub struct Outcome {
    /// Exit code of the job: 0, or the first failing rank's code.
    pub code: i32,
    pub first_failure: Option<(usize, String)>,
}

fn token() -> String {
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
        (None, Some(sig)) => (128 + sig, format!("killed by signal {sig}")),
        _ => (1, "unknown status".into()),
    }
}

fn terminate(children: &mut [(usize, Child)], grace: Duration) {
    for (_, c) in children.iter() {
        // SAFETY: plain kill(2) on a child we spawned and have not reaped.
        unsafe {
            libc::kill(c.id() as libc::pid_t, libc::SIGTERM);
        }
    }
    let until = Instant::now() + grace;
    while Instant::now() < until
        && children
            .iter_mut()
            .any(|(_, c)| matches!(c.try_wait(), Ok(None)))
    {
        std::thread::sleep(Duration::from_millis(20));
    }
    for (_, c) in children.iter_mut() {
        let _ = c.kill();
        let _ = c.wait();
    }
}

pub fn launch(spec: &LaunchSpec) -> Result<Outcome, DistError> {
    if spec.ranks == 0 {
        return Err(DistError::Launch("-n must be at least 1".into()));
    }
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map_err(|e| DistError::Launch(format!("finding a free port: {e}")))?
        .port();
    let job = token();
    let mut children = Vec::with_capacity(spec.ranks);
    for r in 0..spec.ranks {
        let mut cmd = Command::new(&spec.program);
        cmd.args(&spec.args)
            .env("FOLDPRINT_RANK", r.to_string())
            .env("FOLDPRINT_WORLD_SIZE", spec.ranks.to_string())
            .env("FOLDPRINT_LOCAL_RANK", r.to_string())
            .env("FOLDPRINT_MASTER_ADDR", "127.0.0.1")
            .env("FOLDPRINT_MASTER_PORT", port.to_string())
            .env("FOLDPRINT_JOB_TOKEN", &job);
        if r > 0 && !spec.all_stdout {
            cmd.stdout(Stdio::null());
        }
        match cmd.spawn() {
            Ok(c) => children.push((r, c)),
            Err(e) => {
                terminate(&mut children, spec.grace);
                return Err(DistError::Launch(format!(
                    "starting rank {r} ({:?}): {e}",
                    spec.program
                )));
            }
        }
    }
    let mut running = children;
    let mut first_failure = None;
    let mut code = 0;
    while !running.is_empty() {
        let mut i = 0;
        while i < running.len() {
            match running[i].1.try_wait() {
                Ok(Some(status)) => {
                    let (rank, _) = running.swap_remove(i);
                    if !status.success() && first_failure.is_none() {
                        let (c, what) = describe(status);
                        code = c;
                        first_failure = Some((rank, what));
                        terminate(&mut running, spec.grace);
                        running.clear();
                    }
                }
                Ok(None) => i += 1,
                Err(e) => {
                    return Err(DistError::Launch(format!(
                        "waiting for rank {}: {e}",
                        running[i].0
                    )))
                }
            }
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    Ok(Outcome {
        code,
        first_failure,
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
            grace: Duration::from_millis(500),
        }
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
}
