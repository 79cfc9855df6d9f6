//! Exit codes, the command line's contract with CI, and the one mapping
//! from every way a command can fail to them: [`Failure`], which every
//! command returns. Each `match` below is exhaustive: a new error type
//! cannot reach the command line (`?` needs a `Failure` variant) and a new
//! variant does not compile until it is given a code.

use crate::audit::AuditError;
use crate::backend::BackendError;
use crate::bench::BenchError;
use crate::experiment::InputError;
use crate::gpu::error::{GpuError, GpuFault};
use crate::ranks::RankError;
use crate::report::attest::DumpMismatch;
use crate::report::golden::GoldenError;
use crate::report::ReportError;
use crate::runner::RunError;

/// What a foldprint process tells its caller.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExitCode {
    /// 0: every check held.
    Ok,
    /// 1: a check failed (a digest, a rank copy, an invariance group, a
    /// golden or a comparison differs), or nothing was checked (every case
    /// skipped, no case shared, no dump listed, a report whose own run
    /// failed): CI must never pass on an empty check, and no rerun helps,
    /// so it is a failed check rather than codes 3/4 ("no verdict, rerun").
    CheckFailed,
    /// 2: bad input: usage, a malformed experiment, a corrupt or
    /// inconsistent report, an output path that cannot be used.
    BadInput,
    /// 3: a resource is missing: GPU, driver, library, memory, disk space.
    Unavailable,
    /// 4: the infrastructure failed mid-run (NCCL error, dead peer,
    /// watchdog, rendezvous): no verdict was reached.
    Infrastructure,
    /// 128 + N: stopped by signal N (SIGINT, SIGTERM, SIGHUP) at a case
    /// boundary, nothing written.
    Interrupted(i32),
}

impl ExitCode {
    pub fn code(self) -> i32 {
        match self {
            ExitCode::Ok => 0,
            ExitCode::CheckFailed => 1,
            ExitCode::BadInput => 2,
            ExitCode::Unavailable => 3,
            ExitCode::Infrastructure => 4,
            ExitCode::Interrupted(sig) => 128 + sig,
        }
    }

    /// 0 when `ok`, else 1.
    pub fn verdict(ok: bool) -> ExitCode {
        if ok {
            ExitCode::Ok
        } else {
            ExitCode::CheckFailed
        }
    }
}

/// Typed errors that know their exit code.
pub trait HasExitCode {
    fn exit_code(&self) -> ExitCode;
}

/// Writing an output failed: a full disk or quota is a missing resource,
/// anything else (permissions, a path that cannot be used) is bad input.
pub fn io_exit_code(e: &std::io::Error) -> ExitCode {
    match e.raw_os_error() {
        Some(libc::ENOSPC) | Some(libc::EDQUOT) | Some(libc::ENOMEM) => ExitCode::Unavailable,
        // Wrappers (the temp-file crate's path errors) keep only the kind.
        _ if matches!(
            e.kind(),
            std::io::ErrorKind::OutOfMemory
                | std::io::ErrorKind::StorageFull
                | std::io::ErrorKind::QuotaExceeded
        ) =>
        {
            ExitCode::Unavailable
        }
        _ => ExitCode::BadInput,
    }
}

impl HasExitCode for crate::addends::AddendError {
    fn exit_code(&self) -> ExitCode {
        use crate::addends::AddendError as E;
        match self {
            E::Bad { .. } | E::Changed { .. } => ExitCode::BadInput,
            E::Io { .. } => ExitCode::Unavailable,
            E::NotOpened { .. } => ExitCode::Infrastructure,
        }
    }
}

impl HasExitCode for BackendError {
    fn exit_code(&self) -> ExitCode {
        match self {
            BackendError::Infrastructure { .. } => ExitCode::Infrastructure,
            BackendError::Unavailable { .. }
            | BackendError::OutOfMemory { .. }
            | BackendError::Unsupported { .. } => ExitCode::Unavailable,
            BackendError::Gpu { source, .. } => source.exit_code(),
            BackendError::Rank(e) => e.exit_code(),
            BackendError::Addends { source, .. } => source.exit_code(),
        }
    }
}

impl HasExitCode for GpuError {
    fn exit_code(&self) -> ExitCode {
        match self.fault() {
            GpuFault::OutOfMemory | GpuFault::Unavailable => ExitCode::Unavailable,
            GpuFault::Broken => ExitCode::Infrastructure,
        }
    }
}

impl HasExitCode for RunError {
    fn exit_code(&self) -> ExitCode {
        match self {
            RunError::Backend(b) => b.exit_code(),
            RunError::Dump { source, .. } | RunError::Output { source, .. } => io_exit_code(source),
            RunError::DumpNames(_) => ExitCode::BadInput,
            RunError::Interrupted { signal, .. } => ExitCode::Interrupted(*signal),
        }
    }
}

impl HasExitCode for crate::run::Error {
    fn exit_code(&self) -> ExitCode {
        use crate::run::Error as E;
        match self {
            E::Input(e) => e.exit_code(),
            E::Rank(e) => e.exit_code(),
            E::Backend(e) => e.exit_code(),
            E::Run(e) => e.exit_code(),
            E::Emulation(_) => ExitCode::BadInput,
            E::Presented(e) => e.exit_code(),
            E::HashingThread => ExitCode::Unavailable,
            E::Locking(e) => e.exit_code(),
            E::Interrupted { signal, .. } => ExitCode::Interrupted(*signal),
            E::RankChecks(_) => ExitCode::CheckFailed,
        }
    }
}

impl HasExitCode for InputError {
    fn exit_code(&self) -> ExitCode {
        match self {
            InputError::Io { .. } | InputError::Invalid { .. } | InputError::File { .. } => {
                ExitCode::BadInput
            }
        }
    }
}

impl HasExitCode for ReportError {
    fn exit_code(&self) -> ExitCode {
        match self {
            // Out of memory reading a file: a missing resource, not bad input.
            ReportError::Io { source, .. } if source.kind() == std::io::ErrorKind::OutOfMemory => {
                ExitCode::Unavailable
            }
            ReportError::Io { .. }
            | ReportError::Malformed { .. }
            | ReportError::Version { .. }
            | ReportError::Inconsistent { .. }
            | ReportError::Dump { .. } => ExitCode::BadInput,
            ReportError::Write { source, .. } => io_exit_code(source),
        }
    }
}

impl HasExitCode for AuditError {
    fn exit_code(&self) -> ExitCode {
        match self {
            AuditError::Input(e) => e.exit_code(),
            AuditError::WorkDir { .. } | AuditError::Oracle(_) => ExitCode::Unavailable,
            AuditError::Keep { .. } | AuditError::Write { .. } => ExitCode::BadInput,
            AuditError::Interrupted { signal } => ExitCode::Interrupted(*signal),
        }
    }
}

impl HasExitCode for RankError {
    fn exit_code(&self) -> ExitCode {
        match self {
            RankError::Rendezvous { .. } | RankError::Disagree(_) | RankError::Launch(_) => {
                ExitCode::Infrastructure
            }
            // A launcher's variable that is malformed, out of range or
            // contradicted by another launcher's: the job's setup, not a
            // rerun.
            RankError::Env(_) | RankError::LaunchSize(_) | RankError::FilesDiffer(_) => {
                ExitCode::BadInput
            }
            RankError::Placement(_) => ExitCode::Unavailable,
            RankError::Interrupted(sig) => ExitCode::Interrupted(*sig),
        }
    }
}

impl HasExitCode for GoldenError {
    fn exit_code(&self) -> ExitCode {
        match self {
            // No golden to compare with is a failed check: CI must not pass.
            GoldenError::Missing { .. } | GoldenError::WrongExperiment { .. } => {
                ExitCode::CheckFailed
            }
            GoldenError::NanPolicy { .. } => ExitCode::BadInput,
            GoldenError::Read(e) => e.exit_code(),
        }
    }
}

impl HasExitCode for BenchError {
    fn exit_code(&self) -> ExitCode {
        match self {
            // A pool that cannot start: threads or address space are short.
            BenchError::ThreadPool(_) => ExitCode::Unavailable,
            BenchError::Backend(e) => e.exit_code(),
            BenchError::Case(_) => ExitCode::BadInput,
            BenchError::Io(_) => ExitCode::Unavailable,
            BenchError::Addends(e) => e.exit_code(),
        }
    }
}

impl HasExitCode for DumpMismatch {
    fn exit_code(&self) -> ExitCode {
        match self {
            DumpMismatch::Unreadable(_) => ExitCode::BadInput,
            DumpMismatch::Contradicts(_) => ExitCode::CheckFailed,
            DumpMismatch::OutOfMemory(_) => ExitCode::Unavailable,
        }
    }
}

/// Every way a foldprint command can fail. The library's typed errors are
/// carried as they are; the rest are what the command line itself refuses
/// or runs out of.
#[derive(Debug, thiserror::Error)]
pub enum Failure {
    #[error(transparent)]
    Run(Box<RunError>),
    /// A whole run's ([`crate::run`]).
    #[error(transparent)]
    Lifecycle(Box<crate::run::Error>),
    #[error(transparent)]
    Backend(Box<BackendError>),
    #[error(transparent)]
    Gpu(Box<GpuError>),
    #[error(transparent)]
    Input(#[from] InputError),
    #[error(transparent)]
    Report(#[from] ReportError),
    #[error(transparent)]
    Golden(Box<GoldenError>),
    #[error(transparent)]
    Dump(#[from] DumpMismatch),
    #[error(transparent)]
    Audit(#[from] AuditError),
    #[error(transparent)]
    Rank(#[from] RankError),
    #[error(transparent)]
    Addends(#[from] crate::addends::AddendError),
    #[error(transparent)]
    Bench(Box<BenchError>),
    /// A file could not be read or written; the message is in `context`
    /// around it.
    #[error(transparent)]
    Io(#[from] std::io::Error),
    /// JSON the command builds for printing (never a user's input).
    #[error("building JSON output: {0}")]
    Json(#[from] serde_json::Error),
    /// An argument, a path or a combination the command refuses (exit 2).
    #[error("{0}")]
    Refused(String),
    /// A check failed, or nothing was checked (exit 1).
    #[error("{0}")]
    CheckFailed(String),
    /// Something this machine lacks: threads, address space, a GPU (exit 3).
    #[error("{0}")]
    Unavailable(String),
    /// Stopped by signal `signal` before anything was written.
    #[error("{message}")]
    Interrupted { signal: i32, message: String },
    /// What was being done when `source` failed; the code is the source's.
    #[error("{context}")]
    Context {
        context: String,
        #[source]
        source: Box<Failure>,
    },
}

// The larger errors are boxed, so a `Result<_, Failure>` stays small.
macro_rules! boxed_from {
    ($($variant:ident($t:ty)),*) => {$(
        impl From<$t> for Failure {
            fn from(e: $t) -> Self {
                Failure::$variant(Box::new(e))
            }
        }
    )*};
}
boxed_from!(
    Run(RunError),
    Lifecycle(crate::run::Error),
    Backend(BackendError),
    Gpu(GpuError),
    Golden(GoldenError),
    Bench(BenchError)
);

impl HasExitCode for Failure {
    fn exit_code(&self) -> ExitCode {
        match self {
            Failure::Run(e) => e.exit_code(),
            Failure::Lifecycle(e) => e.exit_code(),
            Failure::Backend(e) => e.exit_code(),
            Failure::Addends(e) => e.exit_code(),
            Failure::Gpu(e) => e.exit_code(),
            Failure::Input(e) => e.exit_code(),
            Failure::Report(e) => e.exit_code(),
            Failure::Golden(e) => e.exit_code(),
            Failure::Dump(e) => e.exit_code(),
            Failure::Audit(e) => e.exit_code(),
            Failure::Rank(e) => e.exit_code(),
            Failure::Bench(e) => e.exit_code(),
            Failure::Io(e) => io_exit_code(e),
            Failure::Json(_) | Failure::Refused(_) => ExitCode::BadInput,
            Failure::CheckFailed(_) => ExitCode::CheckFailed,
            Failure::Unavailable(_) => ExitCode::Unavailable,
            Failure::Interrupted { signal, .. } => ExitCode::Interrupted(*signal),
            Failure::Context { source, .. } => source.exit_code(),
        }
    }
}

impl Failure {
    /// The message as printed: each cause once, joined with `: ` (an I/O
    /// error a message already quotes is not repeated).
    pub fn message(&self) -> String {
        let mut out = String::new();
        let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(self);
        while let Some(err) = cur {
            let s = err.to_string();
            if !s.is_empty() && !out.contains(&s) {
                if !out.is_empty() {
                    out.push_str(": ");
                }
                out.push_str(&s);
            }
            cur = err.source();
        }
        out
    }
}

/// `context` for results whose error is a [`Failure`] or becomes one, and
/// for options (a missing value is refused input).
pub trait Context<T> {
    fn context(self, what: impl Into<String>) -> Result<T, Failure>;
    fn with_context<S: Into<String>>(self, what: impl FnOnce() -> S) -> Result<T, Failure>;
}

impl<T, E: Into<Failure>> Context<T> for Result<T, E> {
    fn context(self, what: impl Into<String>) -> Result<T, Failure> {
        self.with_context(|| what)
    }
    fn with_context<S: Into<String>>(self, what: impl FnOnce() -> S) -> Result<T, Failure> {
        self.map_err(|e| Failure::Context {
            context: what().into(),
            source: Box::new(e.into()),
        })
    }
}

impl<T> Context<T> for Option<T> {
    fn context(self, what: impl Into<String>) -> Result<T, Failure> {
        self.ok_or_else(|| Failure::Refused(what.into()))
    }
    fn with_context<S: Into<String>>(self, what: impl FnOnce() -> S) -> Result<T, Failure> {
        self.ok_or_else(|| Failure::Refused(what().into()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_are_the_documented_ones() {
        assert_eq!(ExitCode::Ok.code(), 0);
        assert_eq!(ExitCode::CheckFailed.code(), 1);
        assert_eq!(ExitCode::BadInput.code(), 2);
        assert_eq!(ExitCode::Unavailable.code(), 3);
        assert_eq!(ExitCode::Infrastructure.code(), 4);
        assert_eq!(ExitCode::Interrupted(libc::SIGINT).code(), 130);
        assert_eq!(ExitCode::Interrupted(libc::SIGTERM).code(), 143);
    }

    #[test]
    fn typed_errors_map_through_wrappers() {
        let infra = RunError::Backend(BackendError::Infrastructure {
            case: "c".into(),
            phase: "allreduce".into(),
            message: "peer died".into(),
        });
        assert_eq!(Failure::from(infra).exit_code(), ExitCode::Infrastructure);
        let oom = BackendError::OutOfMemory {
            case: "c".into(),
            what: "host memory",
            needed: 2,
            available: 1,
            inputs: String::new(),
        };
        assert_eq!(Failure::from(oom).exit_code(), ExitCode::Unavailable);
        let full = ReportError::Write {
            path: "r.json".into(),
            source: std::io::Error::from_raw_os_error(libc::ENOSPC),
        };
        assert_eq!(Failure::from(full).exit_code(), ExitCode::Unavailable);
        let denied = ReportError::Write {
            path: "r.json".into(),
            source: std::io::Error::from_raw_os_error(libc::EACCES),
        };
        assert_eq!(Failure::from(denied).exit_code(), ExitCode::BadInput);
        assert_eq!(
            Failure::from(RankError::Disagree("plan".into())).exit_code(),
            ExitCode::Infrastructure
        );
    }

    #[test]
    fn matrices_and_experiments_share_one_input_error() {
        let bad = "experiments = [\"e.toml\"]\n[[config]]\nname = \"a\"\nbackend = 3\n";
        let e = crate::audit::parse(std::path::Path::new("m.toml"), bad, &|_| None).unwrap_err();
        assert!(matches!(e, InputError::Invalid { line: 4, .. }), "{e}");
        assert_eq!(e.exit_code(), ExitCode::BadInput);
        let shown = e.to_string();
        assert!(shown.starts_with("m.toml:4:11: "), "{shown}");
        // Through the audit's error, unchanged.
        let a = AuditError::from(e);
        assert_eq!(a.to_string(), shown);
        assert_eq!(Failure::from(a).exit_code(), ExitCode::BadInput);
        let x = crate::experiment::parse(std::path::Path::new("x.toml"), "name = 3\n").unwrap_err();
        assert_eq!(
            Failure::from(AuditError::from(x)).exit_code(),
            ExitCode::BadInput
        );
        assert_eq!(
            Failure::from(AuditError::Oracle("exit 3".into())).exit_code(),
            ExitCode::Unavailable
        );
    }

    #[test]
    fn context_keeps_the_code_of_what_it_wraps() {
        // Each code through two layers of context, so a wrapper that fell
        // back to one default would be seen.
        let cases: Vec<(Failure, ExitCode)> = vec![
            (Failure::Unavailable("no GPU".into()), ExitCode::Unavailable),
            (
                Failure::CheckFailed("differs".into()),
                ExitCode::CheckFailed,
            ),
            (
                Failure::Interrupted {
                    signal: libc::SIGTERM,
                    message: "stopped".into(),
                },
                ExitCode::Interrupted(libc::SIGTERM),
            ),
            (
                std::io::Error::from_raw_os_error(libc::ENOSPC).into(),
                ExitCode::Unavailable,
            ),
            (
                RankError::LaunchSize("-n must be at least 1".into()).into(),
                ExitCode::BadInput,
            ),
            (
                RankError::Launch("starting rank 1".into()).into(),
                ExitCode::Infrastructure,
            ),
        ];
        for (f, code) in cases {
            let wrapped: Result<(), Failure> = Err(f);
            let e = wrapped
                .context("inner")
                .with_context(|| "outer")
                .unwrap_err();
            assert_eq!(e.exit_code(), code, "{}", e.message());
            assert!(e.message().starts_with("outer: inner: "), "{}", e.message());
        }
        assert_eq!(
            None::<()>.context("missing").unwrap_err().exit_code(),
            ExitCode::BadInput
        );
    }

    #[test]
    fn goldens_and_dumps_have_their_own_codes() {
        let missing = GoldenError::Missing {
            experiment: "smoke".into(),
            experiment_path: "smoke.toml".into(),
            dir: "golden".into(),
            path: "golden/smoke.json".into(),
        };
        assert_eq!(Failure::from(missing).exit_code(), ExitCode::CheckFailed);
        assert_eq!(
            Failure::from(DumpMismatch::Contradicts("x".into())).exit_code(),
            ExitCode::CheckFailed
        );
        assert_eq!(
            Failure::from(DumpMismatch::OutOfMemory("x".into())).exit_code(),
            ExitCode::Unavailable
        );
        assert_eq!(
            Failure::from(DumpMismatch::Unreadable("x".into())).exit_code(),
            ExitCode::BadInput
        );
    }
}
