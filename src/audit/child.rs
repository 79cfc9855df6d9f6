//! Run one configuration's child process with a wall-clock limit, keeping
//! all of its stdout and stderr (read on threads, so neither pipe can fill
//! and stall it).

use std::io::Read;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// How a child ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ending {
    Exited(i32),
    Signal(i32),
    /// Killed by the audit after the matrix's `timeout_s`.
    TimedOut,
    /// Could not be started at all.
    SpawnFailed(String),
}

impl std::fmt::Display for Ending {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Ending::Exited(c) => write!(f, "exit {c}"),
            Ending::Signal(s) => write!(f, "killed by signal {s}"),
            Ending::TimedOut => f.write_str("timed out (killed)"),
            Ending::SpawnFailed(e) => write!(f, "could not start: {e}"),
        }
    }
}

pub struct Output {
    pub ending: Ending,
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
    pub duration: Duration,
}

fn drain(pipe: Option<impl Read + Send + 'static>) -> std::thread::JoinHandle<Vec<u8>> {
    std::thread::spawn(move || {
        let mut buf = Vec::new();
        if let Some(mut p) = pipe {
            let _ = p.read_to_end(&mut buf);
        }
        buf
    })
}

/// Run `cmd` (stdin closed) and wait at most `timeout`.
pub fn run(mut cmd: Command, timeout: Duration) -> Output {
    let start = Instant::now();
    let mut child = match cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
    {
        Ok(c) => c,
        Err(e) => {
            return Output {
                ending: Ending::SpawnFailed(e.to_string()),
                stdout: Vec::new(),
                stderr: Vec::new(),
                duration: start.elapsed(),
            }
        }
    };
    let out = drain(child.stdout.take());
    let err = drain(child.stderr.take());
    let ending = loop {
        match child.try_wait() {
            Ok(Some(status)) => {
                use std::os::unix::process::ExitStatusExt;
                break match (status.code(), status.signal()) {
                    (Some(c), _) => Ending::Exited(c),
                    (None, Some(s)) => Ending::Signal(s),
                    (None, None) => Ending::Exited(-1),
                };
            }
            Ok(None) if start.elapsed() >= timeout => {
                let _ = child.kill();
                let _ = child.wait();
                break Ending::TimedOut;
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(20)),
            Err(e) => {
                let _ = child.kill();
                let _ = child.wait();
                break Ending::SpawnFailed(format!("waiting for it: {e}"));
            }
        }
    };
    Output {
        ending,
        stdout: out.join().unwrap_or_default(),
        stderr: err.join().unwrap_or_default(),
        duration: start.elapsed(),
    }
}

/// The last `lines` lines of `text` (at most 4000 bytes of them).
pub fn tail(text: &[u8], lines: usize) -> String {
    let s = String::from_utf8_lossy(text);
    let all: Vec<&str> = s.trim_end().lines().collect();
    let mut t = all[all.len().saturating_sub(lines)..].join("\n");
    if t.len() > 4000 {
        let mut cut = t.len() - 4000;
        while !t.is_char_boundary(cut) {
            cut += 1;
        }
        t = format!("...{}", &t[cut..]);
    }
    t
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exit_codes_output_and_timeouts() {
        let mut c = Command::new("sh");
        c.args(["-c", "echo out; echo err >&2; exit 3"]);
        let o = run(c, Duration::from_secs(10));
        assert_eq!(o.ending, Ending::Exited(3));
        assert_eq!(o.stdout, b"out\n");
        assert_eq!(o.stderr, b"err\n");

        let mut c = Command::new("sleep");
        c.arg("10");
        let o = run(c, Duration::from_millis(200));
        assert_eq!(o.ending, Ending::TimedOut);
        assert!(o.duration < Duration::from_secs(5));

        let o = run(Command::new("/no/such/program"), Duration::from_secs(1));
        assert!(matches!(o.ending, Ending::SpawnFailed(_)));
    }

    #[test]
    fn tail_keeps_the_last_lines() {
        assert_eq!(tail(b"a\nb\nc\n", 2), "b\nc");
        assert_eq!(tail(b"", 2), "");
    }
}
