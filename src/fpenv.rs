//! The calling thread's floating-point mode while the host computes a
//! reduction. The oracle's float32 adds follow IEEE 754's defaults: round to
//! nearest-even, subnormals kept. A thread's mode is shared with everything
//! else in the process: PyTorch's `set_flush_denormal(True)`, a fast-math
//! library, or a JIT compiler can leave flush-to-zero set, and the oracle
//! would then flush subnormal sums without a word. Inside [`IeeeMode`] the
//! thread has the default mode; the caller's comes back when it drops.
//!
//! Only x86-64 (MXCSR: FTZ, DAZ, rounding) and aarch64 (FPCR: FZ, FZ16,
//! rounding) have such per-thread switches that a library may flip; on the
//! other targets the guard does nothing.

/// The mode bits this guard clears.
#[cfg(target_arch = "x86_64")]
const NON_IEEE: u64 = (1 << 15) | (0b11 << 13) | (1 << 6); // FTZ, RC, DAZ
#[cfg(target_arch = "aarch64")]
const NON_IEEE: u64 = (1 << 24) | (0b11 << 22) | (1 << 19); // FZ, RMode, FZ16

#[cfg(target_arch = "x86_64")]
fn read() -> u64 {
    let mut csr: u32 = 0;
    // SAFETY: stores this thread's MXCSR into a local.
    unsafe { core::arch::asm!("stmxcsr [{}]", in(reg) &mut csr, options(nostack)) };
    u64::from(csr)
}

#[cfg(target_arch = "x86_64")]
fn write(bits: u64) {
    let csr = bits as u32;
    // SAFETY: loads a value read from MXCSR with mode bits changed; the
    // exception masks are kept, so no trap is enabled. It may touch memory
    // as far as the compiler knows, so loads of the values to add do not
    // move across the change of mode.
    unsafe { core::arch::asm!("ldmxcsr [{}]", in(reg) &csr, options(nostack)) };
}

#[cfg(target_arch = "aarch64")]
fn read() -> u64 {
    let fpcr: u64;
    // SAFETY: reads this thread's FPCR.
    unsafe { core::arch::asm!("mrs {}, fpcr", out(reg) fpcr, options(nomem, nostack)) };
    fpcr
}

#[cfg(target_arch = "aarch64")]
fn write(bits: u64) {
    // SAFETY: writes back FPCR with only mode bits changed; trap enables
    // are kept as they were. Not `nomem`: loads of the values to add must
    // not move across the change of mode.
    unsafe { core::arch::asm!("msr fpcr, {}", in(reg) bits, options(nostack)) };
}

/// Whether this thread computes in a mode other than IEEE 754's default
/// (flushing subnormals, or rounding other than to nearest-even).
pub fn is_altered() -> bool {
    #[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
    {
        read() & NON_IEEE != 0
    }
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    {
        false
    }
}

/// IEEE 754's default mode on this thread until dropped; then the mode the
/// thread had before. Not `Send`: the mode belongs to the thread.
#[must_use = "the mode reverts when the guard drops"]
pub struct IeeeMode {
    #[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
    saved: u64,
    _thread_bound: std::marker::PhantomData<*const ()>,
}

impl IeeeMode {
    pub fn enter() -> Self {
        #[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
        {
            let saved = read();
            if saved & NON_IEEE != 0 {
                write(saved & !NON_IEEE);
            }
            IeeeMode {
                saved,
                _thread_bound: std::marker::PhantomData,
            }
        }
        #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
        IeeeMode {
            _thread_bound: std::marker::PhantomData,
        }
    }
}

impl Drop for IeeeMode {
    fn drop(&mut self) {
        #[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
        if read() != self.saved {
            write(self.saved);
        }
    }
}

/// Test support: leave IEEE 754's default mode on this thread, as a
/// library that changes the mode would: every bit the guard clears set,
/// so subnormals flush and rounding goes toward zero.
#[cfg(all(test, any(target_arch = "x86_64", target_arch = "aarch64")))]
pub(crate) fn leave_ieee_mode_on_this_thread() {
    write(read() | NON_IEEE);
}

#[cfg(all(test, any(target_arch = "x86_64", target_arch = "aarch64")))]
mod tests {
    use super::*;
    use std::hint::black_box;

    /// The smallest subnormal doubled: 0 when the thread flushes. The sum
    /// goes through `black_box` so that it is made where it is asked for,
    /// not moved across a change of mode.
    fn tiny_sum() -> u32 {
        black_box(black_box(f32::from_bits(1)) + black_box(f32::from_bits(1))).to_bits()
    }

    /// 1/3 in float32: ...AAAB to nearest, ...AAAA toward zero.
    fn third() -> u32 {
        black_box(black_box(1.0f32) / black_box(3.0f32)).to_bits()
    }

    #[test]
    fn the_guard_keeps_subnormals_and_gives_the_mode_back() {
        std::thread::spawn(|| {
            assert!(!is_altered());
            assert_eq!(tiny_sum(), 2);
            leave_ieee_mode_on_this_thread();
            // Negative control: the mode really flushes and rounds toward
            // zero here.
            assert!(is_altered());
            assert_eq!(tiny_sum(), 0);
            assert_eq!(third(), 0x3EAA_AAAA);
            {
                let _ieee = IeeeMode::enter();
                assert!(!is_altered());
                assert_eq!(tiny_sum(), 2);
                assert_eq!(third(), 0x3EAA_AAAB);
            }
            assert!(is_altered(), "the caller's mode comes back");
            assert_eq!(tiny_sum(), 0);
        })
        .join()
        .unwrap();
    }
}
