//! What `run`, `verify` and `golden` share at the command line: starting
//! the worker threads, and the JUnit file of a plain run. The run itself,
//! from loading to its outputs in place, is `foldprint::run`'s.

use super::args::Common;
use foldprint::exit::Failure;
use foldprint::report::Report;
type Result<T, E = Failure> = std::result::Result<T, E>;

/// Start the worker threads now, so that a machine that cannot start them
/// gets a clear error (exit 3) instead of a panic at the first parallel step.
pub(super) fn start_threads() -> Result<()> {
    // Under an address-space limit a thread can start and then abort the
    // process while setting up its signal stack: refuse before spawning.
    let threads = std::env::var("RAYON_NUM_THREADS")
        .ok()
        .and_then(|v| v.parse::<u64>().ok())
        .filter(|&t| t > 0)
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get() as u64));
    let stack = std::env::var("RUST_MIN_STACK")
        .ok()
        .and_then(|v| v.parse::<u64>().ok())
        .unwrap_or(2 << 20);
    // Each thread maps its stack plus a guard page and a signal stack.
    let need = threads.saturating_mul(stack + (64 << 10));
    if let Some(left) = foldprint::memory::address_space_left() {
        if need > left {
            return Err(Failure::Unavailable(format!(
                "cannot start worker threads: {threads} threads need {} MiB of address space, \
                     the limit (RLIMIT_AS) leaves {} MiB; lower RAYON_NUM_THREADS",
                need >> 20,
                left >> 20
            )));
        }
    }
    rayon::ThreadPoolBuilder::new()
        .build_global()
        .map_err(|e| Failure::Unavailable(format!("cannot start worker threads: {e}")))
}

pub(super) fn junit_of(common: &Common, report: &Report, problems: &[String]) -> Option<String> {
    common
        .junit
        .as_ref()
        .map(|_| foldprint::report::junit(report, &|_| Vec::new(), problems))
}
