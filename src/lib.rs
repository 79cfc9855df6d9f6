//! foldprint: bitwise-reproducible fixed-order float32 reduction, with
//! SHA-256 digests of the reduced arenas.
//!
//! Dataflow: [`experiment`] (TOML -> cases) -> [`backend`] (reduce) ->
//! [`digest`] (bytes -> SHA-256) -> [`report`] (JSON, compare, goldens);
//! [`run`] walks it once for a whole run, outputs included.

pub mod addends;
pub mod atomic;
pub use atomic::write as atomic_write;
pub use atomic::{check_writable, same_file};
pub mod audit;
pub mod backend;
pub mod bench;
pub mod data;
pub mod digest;
pub mod dtype;
pub mod dumpdir;
pub mod environment;
pub mod exit;
pub mod experiment;
pub mod fold;
pub mod fpenv;
pub mod gpu;
pub mod host;
pub mod input;
pub mod interrupt;
pub mod memory;
pub mod outputs;
pub mod ranks;
pub mod report;
pub mod result;
pub mod run;
pub mod runner;
pub mod sensitivity;
pub mod world_size;
