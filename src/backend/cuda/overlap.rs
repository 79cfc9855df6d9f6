//! Running the parts of a backend start side by side: the device's primary
//! context on one thread while the kernel images (disk cache or NVRTC,
//! host-only) are produced on others. Each part's wall time is measured on
//! its own thread; a part that panics becomes an error naming it, never a
//! panic of the caller.

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
    a_name: &str,
    a: impl FnOnce() -> Result<A, String> + Send,
    b: impl FnOnce() -> B,
) -> SideBySide<Result<A, String>, B>
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

/// One job for [`all_at_once`]: its name (for a panic's message) and the
/// work.
pub type Job<'a, T> = (String, Box<dyn FnOnce() -> Result<T, String> + Send + 'a>);

/// Run every job on its own thread and return their results in order; a
/// job that panics gives `Err` naming it.
pub fn all_at_once<T: Send>(jobs: Vec<Job<'_, T>>) -> Vec<Result<T, String>> {
    if jobs.len() == 1 {
        // No thread for a single job; still contain a panic.
        let (name, job) = jobs.into_iter().next().expect("one job");
        return vec![std::panic::catch_unwind(std::panic::AssertUnwindSafe(job))
            .unwrap_or_else(|p| Err(panicked(&name, p.as_ref())))];
    }
    std::thread::scope(|s| {
        let handles: Vec<_> = jobs
            .into_iter()
            .map(|(name, job)| (name, s.spawn(job)))
            .collect();
        handles
            .into_iter()
            .map(|(name, h)| {
                h.join()
                    .unwrap_or_else(|p| Err(panicked(&name, p.as_ref())))
            })
            .collect()
    })
}

fn panicked(name: &str, payload: &(dyn std::any::Any + Send)) -> String {
    let what = payload
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "no message".into());
    format!("{name} panicked: {what}")
}

fn ms(since: Instant) -> f64 {
    since.elapsed().as_secs_f64() * 1e3
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    type Work = Box<dyn FnOnce() -> Result<u32, String> + Send>;

    fn sleep_then<T>(ms: u64, v: T) -> impl FnOnce() -> Result<T, String> {
        move || {
            std::thread::sleep(Duration::from_millis(ms));
            Ok(v)
        }
    }

    #[test]
    fn both_sides_run_at_the_same_time() {
        // 150 ms and 100 ms of waiting: run one after the other they take at
        // least 250 ms, side by side about 150.
        let r = side_by_side("slow", sleep_then(150, 1u32), || {
            let jobs: Vec<Job<u32>> = (0..3u32)
                .map(|i| (format!("job {i}"), Box::new(sleep_then(100, i)) as Work))
                .collect();
            all_at_once(jobs)
        });
        assert_eq!(r.a, Ok(1));
        assert_eq!(r.b, vec![Ok(0), Ok(1), Ok(2)]);
        assert!(r.a_ms >= 150.0, "{r:?}");
        // The three jobs ran together too: one after the other is >= 300.
        assert!(r.b_ms >= 100.0 && r.b_ms < 250.0, "{r:?}");
        assert!(r.both_ms >= r.a_ms.max(r.b_ms), "{r:?}");
        assert!(r.both_ms < r.a_ms + r.b_ms, "not overlapped: {r:?}");
    }

    #[test]
    fn a_panicking_side_becomes_an_error_naming_it() {
        let r = side_by_side(
            "the context thread",
            || -> Result<u32, String> { panic!("driver exploded") },
            || 7,
        );
        assert_eq!(
            r.a,
            Err("the context thread panicked: driver exploded".to_string())
        );
        assert_eq!(r.b, 7);
        // Control: the same call without the panic gives the value.
        let ok = side_by_side("the context thread", || Ok(3u32), || 7);
        assert_eq!(ok.a, Ok(3));
    }

    #[test]
    fn a_panicking_job_becomes_an_error_and_the_others_finish() {
        let n = 5;
        let jobs: Vec<Job<u32>> = vec![
            ("fold build".into(), Box::new(|| Ok(1))),
            (
                "generator build".into(),
                Box::new(move || panic!("index {n} out of range")),
            ),
            (
                "rank check build".into(),
                Box::new(|| Err("no NVRTC".into())),
            ),
        ];
        let r = all_at_once(jobs);
        assert_eq!(r[0], Ok(1));
        assert_eq!(
            r[1],
            Err("generator build panicked: index 5 out of range".to_string())
        );
        assert_eq!(r[2], Err("no NVRTC".to_string()));
        // A single job runs on the caller's thread and is contained too.
        let one: Vec<Job<u32>> = vec![("alone".into(), Box::new(|| panic!("boom")))];
        assert_eq!(all_at_once(one), vec![Err("alone panicked: boom".into())]);
    }
}
