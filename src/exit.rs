//! Exit codes, the command line's contract with CI, and the one mapping
//! from every typed error of the library to them. Each `match` below is
//! exhaustive: a new error variant does not compile until it is given a
//! code.

use crate::audit::AuditError;
use crate::backend::BackendError;
use crate::experiment::InputError;
use crate::gpu::error::{GpuError, GpuFault};
use crate::ranks::RankError;
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

impl HasExitCode for BackendError {
    fn exit_code(&self) -> ExitCode {
        match self {
            BackendError::Infrastructure { .. } => ExitCode::Infrastructure,
            BackendError::Unavailable { .. }
            | BackendError::OutOfMemory { .. }
            | BackendError::Unsupported { .. } => ExitCode::Unavailable,
            BackendError::Gpu { source, .. } => source.exit_code(),
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
            RankError::Env(_)
            | RankError::Rendezvous { .. }
            | RankError::Disagree(_)
            | RankError::Launch(_) => ExitCode::Infrastructure,
        }
    }
}

/// The exit code of an error chain: the first typed error in it decides;
/// an error of no known type is bad input.
pub fn of_error(e: &(dyn std::error::Error + 'static)) -> ExitCode {
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = cur {
        if let Some(code) = of_typed(err) {
            return code;
        }
        cur = err.source();
    }
    ExitCode::BadInput
}

/// The exit code of `err` if it is one of the library's typed errors.
pub fn of_typed(err: &(dyn std::error::Error + 'static)) -> Option<ExitCode> {
    if let Some(e) = err.downcast_ref::<RunError>() {
        return Some(e.exit_code());
    }
    if let Some(e) = err.downcast_ref::<BackendError>() {
        return Some(e.exit_code());
    }
    if let Some(e) = err.downcast_ref::<InputError>() {
        return Some(e.exit_code());
    }
    if let Some(e) = err.downcast_ref::<ReportError>() {
        return Some(e.exit_code());
    }
    if let Some(e) = err.downcast_ref::<AuditError>() {
        return Some(e.exit_code());
    }
    if let Some(e) = err.downcast_ref::<RankError>() {
        return Some(e.exit_code());
    }
    if let Some(e) = err.downcast_ref::<GpuError>() {
        return Some(e.exit_code());
    }
    None
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
        assert_eq!(of_error(&infra), ExitCode::Infrastructure);
        let oom = BackendError::OutOfMemory {
            case: "c".into(),
            what: "host memory",
            needed: 2,
            available: 1,
        };
        assert_eq!(of_error(&oom), ExitCode::Unavailable);
        let full = ReportError::Write {
            path: "r.json".into(),
            source: std::io::Error::from_raw_os_error(libc::ENOSPC),
        };
        assert_eq!(of_error(&full), ExitCode::Unavailable);
        let denied = ReportError::Write {
            path: "r.json".into(),
            source: std::io::Error::from_raw_os_error(libc::EACCES),
        };
        assert_eq!(of_error(&denied), ExitCode::BadInput);
        assert_eq!(
            of_error(&RankError::Disagree("plan".into())),
            ExitCode::Infrastructure
        );
    }

    #[test]
    fn matrices_and_experiments_share_one_input_error() {
        let bad = "experiments = [\"e.toml\"]\n[[config]]\nname = \"a\"\nbackend = 3\n";
        let e = crate::audit::parse(std::path::Path::new("m.toml"), bad, &|_| None).unwrap_err();
        assert!(matches!(e, InputError::Invalid { line: 4, .. }), "{e}");
        assert_eq!(of_error(&e), ExitCode::BadInput);
        let shown = e.to_string();
        assert!(shown.starts_with("m.toml:4:11: "), "{shown}");
        // Through the audit's error, unchanged.
        let a = AuditError::from(e);
        assert_eq!(a.to_string(), shown);
        assert_eq!(of_error(&a), ExitCode::BadInput);
        let x = crate::experiment::parse(std::path::Path::new("x.toml"), "name = 3\n").unwrap_err();
        assert_eq!(of_error(&AuditError::from(x)), ExitCode::BadInput);
        assert_eq!(
            of_error(&AuditError::Oracle("exit 3".into())),
            ExitCode::Unavailable
        );
    }
}
