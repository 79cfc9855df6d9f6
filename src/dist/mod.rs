//! The thin glue every multi-process NCCL program needs, kept free of CUDA
//! so it is tested on any machine: who am I (`launcher`), how the NCCL
//! unique id and the case agreement travel (`rendezvous`), how a stuck
//! collective is bounded (`watchdog`), and a local launcher (`launch`).

pub mod job;
pub mod launch;
pub mod launcher;
pub mod rendezvous;
pub mod watchdog;

#[derive(Debug, thiserror::Error)]
pub enum DistError {
    #[error("rank discovery: {0}")]
    Env(String),
    #[error("rendezvous ({role}): {message}")]
    Rendezvous { role: String, message: String },
    #[error("ranks disagree on the work: {0}")]
    Disagree(String),
    #[error("launch: {0}")]
    Launch(String),
}
