//! SIGINT, SIGTERM and SIGHUP stop a run at the next case boundary: the
//! handler only records the signal; the runner looks between cases and
//! stops without writing anything, so the previous report and dump
//! directory stay as they were. The handler is one-shot: a second signal
//! of the same kind ends the process the default way.

use std::sync::atomic::{AtomicI32, Ordering};

static PENDING: AtomicI32 = AtomicI32::new(0);

extern "C" fn record(sig: libc::c_int) {
    // An atomic store and a write(2): both async-signal-safe.
    PENDING.store(sig, Ordering::SeqCst);
    let msg = b"\nfoldprint: stopping after the case in progress; nothing will be written (signal again to stop at once)\n";
    // SAFETY: writing a static buffer to stderr.
    unsafe {
        libc::write(2, msg.as_ptr().cast(), msg.len());
    }
}

/// Install the handlers (idempotent).
pub fn install() {
    for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
        // SAFETY: a zeroed sigaction is valid; the handler is
        // async-signal-safe (an atomic store and a write).
        unsafe {
            let mut act: libc::sigaction = std::mem::zeroed();
            act.sa_sigaction = record as *const () as libc::sighandler_t;
            act.sa_flags = libc::SA_RESETHAND | libc::SA_RESTART;
            libc::sigemptyset(&mut act.sa_mask);
            libc::sigaction(sig, &act, std::ptr::null_mut());
        }
    }
}

/// The signal that asked this process to stop, if any.
pub fn pending() -> Option<i32> {
    match PENDING.load(Ordering::SeqCst) {
        0 => None,
        s => Some(s),
    }
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
