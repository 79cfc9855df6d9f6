//! foldprint: bitwise-reproducible fixed-order float32 reduction, with
//! SHA-256 digests of the reduced arenas.
//!
//! Dataflow: [`experiment`] (TOML -> cases) -> [`backend`] (reduce) ->
//! [`digest`] (bytes -> SHA-256) -> [`report`] (JSON, compare, goldens).

pub mod data;
pub mod experiment;
pub mod fold;
pub mod backend;
pub mod digest;
pub mod report;
pub mod sensitivity;
mod atomic;
pub mod env;
pub mod runner;
