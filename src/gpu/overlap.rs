//! Running the two parts of a backend start side by side: the device's
//! primary context on its own thread while the kernel images (disk cache or
//! NVRTC, host-only) are produced on the calling thread. Each part's wall
//! time is measured on its own thread; a part that panics becomes an error
//! naming it, never a panic of the caller.

use super::error::GpuError;
use std::time::Instant;

/// What [`side_by_side`] gave: both results and the wall times.
#[derive(Debug)]
pub struct SideBySide<A, B> {
    pub a: A,
    pub b: B,
    /// Wall time of `a`, measured on its thread, in ms.
    pub a_ms: f64,
    /// Wall time of `b`, measured on its thread, in ms.
    pub b_ms: f64,
    /// Wall time from before either started until both had finished, in ms.
    pub both_ms: f64,
}

/// Run `a` on a new thread and `b` on this one, and wait for both. A panic
/// in `a` comes back as `Err` naming `a_name`; `b` runs on the calling
/// thread, so it must not panic (callers pass code that returns errors).
pub fn side_by_side<A, B>(
    a_name: &'static str,
    a: impl FnOnce() -> Result<A, GpuError> + Send,
    b: impl FnOnce() -> B,
) -> SideBySide<Result<A, GpuError>, B>
where
    A: Send,
{
    let started = Instant::now();
    std::thread::scope(|s| {
        let handle = s.spawn(move || {
            let t = Instant::now();
            let r = a();
            (r, ms(t))
        });
        let t = Instant::now();
        let b = b();
        let b_ms = ms(t);
        let (a, a_ms) = match handle.join() {
            Ok((r, a_ms)) => (r, a_ms),
            Err(payload) => (Err(panicked(a_name, payload.as_ref())), 0.0),
        };
        SideBySide {
            a,
            b,
            a_ms,
            b_ms,
            both_ms: ms(started),
        }
    })
}

fn panicked(name: &'static str, payload: &(dyn std::any::Any + Send)) -> GpuError {
    let what = payload
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned());
    GpuError::panicked(name, what)
}

fn ms(since: Instant) -> f64 {
    since.elapsed().as_secs_f64() * 1e3
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn sleep_then<T>(ms: u64, v: T) -> impl FnOnce() -> Result<T, GpuError> {
        move || {
            std::thread::sleep(Duration::from_millis(ms));
            Ok(v)
        }
    }

    #[test]
    fn both_sides_run_at_the_same_time() {
        // 150 ms and 100 ms of waiting: one after the other they take at
        // least 250 ms, side by side about 150.
        let r = side_by_side("slow", sleep_then(150, 1u32), || {
            std::thread::sleep(Duration::from_millis(100));
            2u32
        });
        assert_eq!(*r.a.as_ref().unwrap(), 1);
        assert_eq!(r.b, 2);
        assert!(r.a_ms >= 150.0 && r.b_ms >= 100.0, "{r:?}");
        assert!(r.both_ms >= r.a_ms.max(r.b_ms), "{r:?}");
        assert!(r.both_ms < r.a_ms + r.b_ms, "not overlapped: {r:?}");
    }

    #[test]
    fn a_panicking_side_becomes_an_error_naming_it() {
        let r = side_by_side(
            "the context thread",
            || -> Result<u32, GpuError> { panic!("driver exploded") },
            || 7,
        );
        assert_eq!(
            r.a.unwrap_err().to_string(),
            "the context thread panicked: driver exploded"
        );
        assert_eq!(r.b, 7);
        // Control: the same call without the panic gives the value.
        let ok = side_by_side("the context thread", || Ok(3u32), || 7);
        assert_eq!(ok.a.unwrap(), 3);
    }
}
