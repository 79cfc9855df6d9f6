//! The CPU oracle against straight-line folds and the spec's generator
//! vectors, the host's CUDA driver discovery (no GPU needed), and the
//! library's module graph (no import cycle).
//!
//! One test binary per area, so `cargo test` links the library a few times
//! instead of once per file.

mod cpu_oracle;
mod host_driver;
mod imports;
mod world_limit;
