//! SIGINT, SIGTERM and SIGHUP stop a run at the next case boundary: the
//! handler only records the signal; the runner looks between cases and
//! stops without writing anything, so the previous report and dump
//! directory stay as they were.
//!
//! Once a finished run starts putting its outputs in place
//! ([`begin_commit`]), a signal no longer stops it: the renames complete,
//! so the outputs are whole, and the message says so. Before that point a
//! signal wins and nothing is written; the one atomic state decides which.
//!
//! A second signal ends the process at once, by that signal: a watcher
//! thread first removes the staging files and directories registered here
//! (`.DIR.partial-*`, temp files), then re-raises it with the default action.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicI32, AtomicU32, Ordering};

/// 0: running; > 0: that signal asked to stop; [`COMMITTING`]: outputs
/// are being put in place; [`DONE`]: they are.
static STATE: AtomicI32 = AtomicI32::new(0);
const COMMITTING: i32 = -1;
const DONE: i32 = -2;
static RECEIVED: AtomicU32 = AtomicU32::new(0);
/// Write end of the watcher's pipe (-1: no watcher).
static WAKE: AtomicI32 = AtomicI32::new(-1);
static STAGING: std::sync::Mutex<Vec<PathBuf>> = std::sync::Mutex::new(Vec::new());

fn say(msg: &[u8]) {
    // SAFETY: writing a static buffer to stderr (async-signal-safe).
    unsafe {
        libc::write(2, msg.as_ptr().cast(), msg.len());
    }
}

extern "C" fn record(sig: libc::c_int) {
    // Atomics, write(2), signal(2) and raise(3): all async-signal-safe.
    if RECEIVED.fetch_add(1, Ordering::SeqCst) == 0 {
        match first_signal(&STATE, sig) {
            Ok(_) => say(b"\nfoldprint: stopping after the case in progress; nothing will be written (signal again to stop at once)\n"),
            Err(COMMITTING) => say(b"\nfoldprint: the run has finished and its outputs are being put in place; they will be complete\n"),
            Err(DONE) => say(b"\nfoldprint: the run has finished and its outputs are in place\n"),
            Err(_) => {}
        }
        return;
    }
    if STATE.load(Ordering::SeqCst) == COMMITTING {
        // A few renames from done: stopping now could only break them.
        return;
    }
    let fd = WAKE.load(Ordering::SeqCst);
    let byte = sig as u8;
    // SAFETY: a one-byte write to our own pipe.
    if fd < 0 || unsafe { libc::write(fd, (&byte as *const u8).cast(), 1) } != 1 {
        die(sig);
    }
}

/// End the process by `sig`, the default way.
fn die(sig: libc::c_int) {
    // SAFETY: restoring the default action and raising are async-signal-safe.
    unsafe {
        libc::signal(sig, libc::SIG_DFL);
        libc::raise(sig);
    }
}

/// Install the handlers and the watcher thread (idempotent).
pub fn install() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        start_watcher();
        for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
            // SAFETY: a zeroed sigaction is valid; the handler is
            // async-signal-safe.
            unsafe {
                let mut act: libc::sigaction = std::mem::zeroed();
                act.sa_sigaction = record as *const () as libc::sighandler_t;
                act.sa_flags = libc::SA_RESTART;
                libc::sigemptyset(&mut act.sa_mask);
                libc::sigaction(sig, &act, std::ptr::null_mut());
            }
        }
    });
}

/// The thread that cleans up on a second signal; without it (no thread
/// could start) a second signal ends the process without cleaning up.
fn start_watcher() {
    let mut fds = [-1; 2];
    // SAFETY: pipe2 fills the two descriptors.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return;
    }
    let read_fd = fds[0];
    let spawned = std::thread::Builder::new()
        .name("foldprint-signals".into())
        .stack_size(64 << 10)
        .spawn(move || {
            let mut byte = 0u8;
            // SAFETY: a one-byte read from our own pipe.
            while unsafe { libc::read(read_fd, (&mut byte as *mut u8).cast(), 1) } != 1 {}
            let paths: Vec<PathBuf> = match STAGING.lock() {
                Ok(g) => g.clone(),
                Err(p) => p.into_inner().clone(),
            };
            for p in paths {
                let _ = std::fs::remove_dir_all(&p).or_else(|_| std::fs::remove_file(&p));
            }
            say(b"foldprint: stopped at once; staging files removed\n");
            die(byte as libc::c_int);
        });
    match spawned {
        Ok(_) => WAKE.store(fds[1], Ordering::SeqCst),
        // SAFETY: closing the descriptors we just made.
        Err(_) => unsafe {
            libc::close(fds[0]);
            libc::close(fds[1]);
        },
    }
}

/// The signal that asked this process to stop, if any.
pub fn pending() -> Option<i32> {
    match STATE.load(Ordering::SeqCst) {
        s if s > 0 => Some(s),
        _ => None,
    }
}

/// The point of no return of a run: from here a signal no longer stops
/// it. `Err(signal)` when one came first: then nothing may be written.
pub fn begin_commit() -> Result<(), i32> {
    begin_commit_on(&STATE)
}

/// The one transition a first signal makes: running -> stopping.
/// `Ok` when it stops the run (nothing will be written), else the state
/// it found.
fn first_signal(state: &AtomicI32, sig: i32) -> Result<i32, i32> {
    state.compare_exchange(0, sig, Ordering::SeqCst, Ordering::SeqCst)
}

fn begin_commit_on(state: &AtomicI32) -> Result<(), i32> {
    match state.compare_exchange(0, COMMITTING, Ordering::SeqCst, Ordering::SeqCst) {
        Err(sig) if sig > 0 => Err(sig),
        _ => Ok(()),
    }
}

/// The outputs are in place (or failed): a first signal stops nothing any
/// more, a second one ends the process.
pub fn end_commit() {
    let _ = STATE.compare_exchange(COMMITTING, DONE, Ordering::SeqCst, Ordering::SeqCst);
}

/// A staging file or directory, removed if a second signal ends the process.
pub fn register_staging(path: &Path) {
    let mut g = STAGING.lock().unwrap_or_else(|p| p.into_inner());
    g.push(path.to_path_buf());
}

pub fn unregister_staging(path: &Path) {
    let mut g = STAGING.lock().unwrap_or_else(|p| p.into_inner());
    g.retain(|p| p != path);
}

/// `SIGINT`, `SIGTERM` ... for messages.
pub fn signal_name(sig: i32) -> String {
    match sig {
        libc::SIGINT => "SIGINT".into(),
        libc::SIGTERM => "SIGTERM".into(),
        libc::SIGHUP => "SIGHUP".into(),
        s => format!("signal {s}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_signal_before_the_commit_stops_it_and_after_it_is_ignored() {
        let state = AtomicI32::new(0);
        assert_eq!(first_signal(&state, libc::SIGINT), Ok(0));
        assert_eq!(begin_commit_on(&state), Err(libc::SIGINT));

        let state = AtomicI32::new(0);
        assert_eq!(begin_commit_on(&state), Ok(()));
        assert_eq!(first_signal(&state, libc::SIGINT), Err(COMMITTING));
        assert_eq!(state.load(Ordering::SeqCst), COMMITTING);
    }

    /// The race of item 5: a signal and the commit at the same moment.
    /// Exactly one wins: either the signal said "nothing will be written"
    /// and the commit is refused, or the commit goes ahead and the signal
    /// says the outputs are being put in place. Never both, never neither.
    #[test]
    fn signal_and_commit_racing_never_both_win() {
        let (mut stopped, mut committed) = (0, 0);
        for _ in 0..2000 {
            let state = AtomicI32::new(0);
            let go = std::sync::Barrier::new(2);
            let (sig, commit) = std::thread::scope(|s| {
                let a = s.spawn(|| {
                    go.wait();
                    first_signal(&state, libc::SIGINT)
                });
                go.wait();
                let c = begin_commit_on(&state);
                (a.join().unwrap(), c)
            });
            match (sig, commit) {
                (Ok(0), Err(s)) if s == libc::SIGINT => stopped += 1,
                (Err(COMMITTING), Ok(())) => committed += 1,
                other => panic!("signal and commit both or neither won: {other:?}"),
            }
        }
        assert_eq!(stopped + committed, 2000);
    }
}
