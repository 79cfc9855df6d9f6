//! Ranks as processes: the glue every multi-process NCCL run needs, kept
//! free of CUDA so it is tested on any machine. Which rank this process is
//! (`discover`), which device it uses and whether it emulates a host
//! (`placement`), the job's identity and rank 0's address (`job`), how the
//! NCCL unique id and the case agreement travel (`rendezvous`; its wire and
//! the proofs of the job token in `handshake`), how a stuck
//! collective is bounded (`watchdog`), the local launcher that starts
//! one process per rank (`launch`), and the world of one run as a value,
//! built from these in steps (`world`).

pub mod discover;
mod handshake;
pub mod job;
pub mod launch;
pub mod placement;
pub mod rendezvous;
pub mod watchdog;
pub mod world;

#[derive(Debug, thiserror::Error)]
pub enum RankError {
    /// A launcher variable that is malformed, out of range or contradicted
    /// by another launcher's, or a rendezvous address rank 0 cannot listen
    /// on (bad input: the job's setup, not a rerun).
    #[error("launcher variables: {0}")]
    Env(String),
    #[error("rendezvous ({role}): {message}")]
    Rendezvous { role: String, message: String },
    #[error("ranks disagree on the work: {0}")]
    Disagree(String),
    /// The ranks' own rank files hold different arenas (bad input: the
    /// files, not the machinery).
    #[error("{0}")]
    FilesDiffer(String),
    #[error("launch: {0}")]
    Launch(String),
    /// `launch` was asked for a world it will not start (bad input).
    #[error("launch: {0}")]
    LaunchSize(String),
    /// This rank has no device to run on here (refused before the rendezvous).
    #[error("{0}")]
    Placement(String),
    /// A signal (a launcher stopping the job) ended a rendezvous wait.
    #[error("stopped by {} during the rendezvous", crate::interrupt::signal_name(*.0))]
    Interrupted(i32),
}
