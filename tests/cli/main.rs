//! The command line as users run it: each module starts the foldprint binary
//! (or its commands) and checks what it prints, writes and exits with.
//!
//! One test binary per area, so `cargo test` links the library a few times
//! instead of once per file.

#[path = "../common/mod.rs"]
mod common;

mod commands;
mod exit_codes;
mod hostile_inputs;
mod hostile_peers;
mod inputs;
mod launchers;
mod launchers_setup;
mod messages;
mod outputs;
mod plot;
mod progress;
mod rank_files;
mod readme;
mod reduce_scatter;
mod sixteen_bit;
mod verdicts;
