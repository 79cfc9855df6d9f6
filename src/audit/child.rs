//! The audit's children: `foldprint run --json --out DIR/report.json ...`
//! in a directory of their own, with a wall-clock limit, keeping all of
//! stdout and stderr (read on threads, so neither pipe can fill and stall
//! it) and a `command.sh` that repeats the run. Each configuration is one
//! child (its library links first on `LD_LIBRARY_PATH`); so is the CPU
//! oracle.

use super::matrix::{Config, Matrix};
use super::pins;
use super::read::{self, Digests};
use super::result::{blank_outcome, ConfigOutcome, Status};
use super::workdir::WorkArea;
use super::{AuditError, Options};
use crate::report::Report;
use std::collections::BTreeMap;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Variable naming the NCCL file the NCCL backend opens first.
const NCCL_OVERRIDE: &str = "FOLDPRINT_NCCL_LIBRARY";

/// How a child ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ending {
    Exited(i32),
    Signal(i32),
    /// Killed by the audit after the matrix's `timeout_s`.
    TimedOut,
    /// Could not be started at all.
    SpawnFailed(String),
    /// The audit was asked to stop by this signal: passed on to the child,
    /// which was then waited for (killed after [`GRACE`]).
    Interrupted(i32),
}

/// How long a child may take to stop after a forwarded signal (it stops
/// at its next case boundary) before it is killed.
const GRACE: Duration = Duration::from_secs(10);

impl std::fmt::Display for Ending {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Ending::Exited(c) => write!(f, "exit {c}"),
            Ending::Signal(s) => write!(f, "killed by signal {s}"),
            Ending::TimedOut => f.write_str("timed out (killed)"),
            Ending::SpawnFailed(e) => write!(f, "could not start: {e}"),
            Ending::Interrupted(s) => write!(
                f,
                "stopped: the audit got {}",
                crate::interrupt::signal_name(*s)
            ),
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
            Ok(None) if crate::interrupt::pending().is_some() => {
                let sig = crate::interrupt::pending().unwrap_or(libc::SIGTERM);
                stop(&mut child, sig);
                break Ending::Interrupted(sig);
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

/// Pass `sig` on to `child` and reap it; kill it if it has not stopped
/// within [`GRACE`], so that no child outlives the audit.
fn stop(child: &mut std::process::Child, sig: i32) {
    if let Ok(pid) = libc::pid_t::try_from(child.id()) {
        // SAFETY: signalling our own child, not yet reaped (so the pid is
        // still ours).
        unsafe {
            libc::kill(pid, sig);
        }
    }
    let t = Instant::now();
    while t.elapsed() < GRACE {
        match child.try_wait() {
            Ok(None) => std::thread::sleep(Duration::from_millis(20)),
            _ => return,
        }
    }
    let _ = child.kill();
    let _ = child.wait();
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

/// Quote for a POSIX shell, for the kept `command.sh`.
fn shell_quote(s: &str) -> String {
    if !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_./=:,+@%".contains(c))
    {
        s.to_string()
    } else {
        format!("'{}'", s.replace('\'', "'\\''"))
    }
}

/// One `foldprint run` to start in `dir`.
pub(super) struct Launch<'a> {
    pub dir: &'a Path,
    pub exe: &'a Path,
    /// `run` and its flags; `--out DIR/report.json`, `--` and the
    /// experiment paths are added.
    pub args: Vec<String>,
    pub experiments: &'a [PathBuf],
    /// Set for the child on top of the audit's own environment.
    pub env: &'a BTreeMap<String, String>,
    /// Removed from the child's environment.
    pub remove: &'a [&'a str],
    pub timeout: Duration,
}

/// A finished child.
pub(super) struct Launched {
    /// The program and its arguments.
    pub command: Vec<String>,
    pub output: Output,
    /// `report.json`, or `stdout.txt` when the child wrote no report file.
    pub report: PathBuf,
}

impl Launch<'_> {
    /// Write `command.sh`, run the child, keep `stdout.txt` and
    /// `stderr.txt` beside it. Errors are the work directory's.
    pub fn run(self) -> std::io::Result<Launched> {
        let mut argv = self.args;
        // The report goes to a file: libraries such as NCCL (NCCL_DEBUG)
        // may print to the child's stdout. Stdout stays the fallback.
        let report_path = self.dir.join("report.json");
        let _ = std::fs::remove_file(&report_path);
        argv.insert(1, "--out".into());
        argv.insert(2, report_path.display().to_string());
        argv.push("--".into());
        argv.extend(self.experiments.iter().map(|p| p.display().to_string()));
        let command: Vec<String> = std::iter::once(self.exe.display().to_string())
            .chain(argv.iter().cloned())
            .collect();
        let script: String = self
            .env
            .iter()
            .map(|(k, v)| format!("{k}={} ", shell_quote(v)))
            .chain(command.iter().map(|a| format!("{} ", shell_quote(a))))
            .collect();
        std::fs::write(
            self.dir.join("command.sh"),
            format!("{}\n", script.trim_end()),
        )?;

        let mut cmd = Command::new(self.exe);
        cmd.args(&argv).envs(self.env);
        for name in self.remove {
            cmd.env_remove(name);
        }
        let output = run(cmd, self.timeout);
        let stdout_path = self.dir.join("stdout.txt");
        std::fs::write(&stdout_path, &output.stdout)?;
        std::fs::write(self.dir.join("stderr.txt"), &output.stderr)?;
        let report = if report_path.is_file() {
            report_path
        } else {
            stdout_path
        };
        Ok(Launched {
            command,
            output,
            report,
        })
    }
}

/// Run one configuration's child and read its report.
pub(super) fn run_config(
    m: &Matrix,
    c: &Config,
    baseline: bool,
    work: &WorkArea,
    opts: &Options,
) -> Result<(ConfigOutcome, Digests), AuditError> {
    let dir = work.root.join(&c.name);
    let io = |source: std::io::Error| AuditError::WorkDir {
        path: dir.clone(),
        source,
    };
    std::fs::create_dir(&dir).map_err(io)?;
    let mut o = blank_outcome(c, baseline, Status::CouldNotRun);
    o.env = c.env.clone();
    let requests = c.requests();
    if !requests.is_empty() {
        let libdir = dir.join("lib");
        if libdir.to_string_lossy().contains(':') {
            return Err(io(std::io::Error::other(
                "the path holds ':', which LD_LIBRARY_PATH cannot carry",
            )));
        }
        o.links = pins::make_link_dir(&libdir, &requests).map_err(io)?;
        let inherited = c
            .env
            .get("LD_LIBRARY_PATH")
            .cloned()
            .or_else(|| std::env::var("LD_LIBRARY_PATH").ok())
            .filter(|v| !v.is_empty());
        let first = libdir.display().to_string();
        o.env.insert(
            "LD_LIBRARY_PATH".into(),
            match inherited {
                Some(rest) => format!("{first}:{rest}"),
                None => first,
            },
        );
    }
    // The NCCL backend opens this file before any bare name: an inherited
    // value would override the requested library.
    let remove: &[&str] = if c.nccl.is_some() && !c.env.contains_key(NCCL_OVERRIDE) {
        &[NCCL_OVERRIDE]
    } else {
        &[]
    };
    let done = Launch {
        dir: &dir,
        exe: &opts.exe,
        args: c.run_args(),
        experiments: &m.experiments,
        env: &o.env,
        remove,
        timeout: m.timeout,
    }
    .run()
    .map_err(io)?;
    let out = done.output;
    if let Ending::Interrupted(signal) = out.ending {
        return Err(AuditError::Interrupted { signal });
    }
    o.command = done.command;
    if !work.temporary {
        o.kept = Some(dir.display().to_string());
    }
    o.ending = out.ending.to_string();
    o.duration_s = out.duration.as_secs_f64();
    o.stderr_tail = tail(&out.stderr, 20);
    if let Ending::Exited(code) = out.ending {
        o.exit_code = Some(code);
    }
    let mut d = Digests::default();
    match out.ending {
        Ending::Exited(code @ (0 | 1)) => {
            match Report::read(&done.report)
                .map_err(|e| e.to_string())
                .and_then(|r| read::read_report(c, &r, &mut o, &mut d).map(|()| r))
            {
                Ok(r) => {
                    o.status = if code == 0 && r.summary.ok {
                        Status::Ok
                    } else {
                        Status::ChecksFailed
                    };
                }
                Err(e) => {
                    o.error = Some(format!(
                        "exit {code} without a usable report on stdout ({e})"
                    ));
                }
            }
        }
        Ending::Exited(2) => {
            o.status = Status::Rejected;
            o.error = Some("the run rejected its arguments or experiments (exit 2)".into());
        }
        Ending::Exited(3) => {
            o.error = Some("this machine cannot run it (exit 3)".into());
        }
        ref e @ Ending::TimedOut => {
            o.error = Some(format!(
                "{e} after {} s (matrix `timeout_s`)",
                m.timeout.as_secs()
            ));
        }
        ref e => o.error = Some(e.to_string()),
    }
    Ok((o, d))
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
    fn shell_quoting_round_trips_plain_and_odd_words() {
        assert_eq!(shell_quote("/a/b.so"), "/a/b.so");
        assert_eq!(shell_quote("a b"), "'a b'");
        assert_eq!(shell_quote("it's"), "'it'\\''s'");
        assert_eq!(shell_quote(""), "''");
    }

    #[test]
    fn tail_keeps_the_last_lines() {
        assert_eq!(tail(b"a\nb\nc\n", 2), "b\nc");
        assert_eq!(tail(b"", 2), "");
    }
}
