//! Reports, goldens and audits read back: consistency checks, JSON round
//! trips, dump integrity and the audit matrix.
//!
//! One test binary per area, so `cargo test` links the library a few times
//! instead of once per file.

#[path = "../common/mod.rs"]
mod common;

mod audit;
mod expect_evidence;
mod integrity;
mod report_checks;
mod report_json;
