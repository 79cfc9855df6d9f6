//! A timer thread that bounds every blocking phase (NCCL init, each
//! collective window). When a phase overruns, it calls the abort action
//! once (for NCCL: ncclCommAbort, which unblocks the stuck call) and
//! remembers which phase fired, so the caller reports it and never destroys
//! an aborted communicator.

use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

#[derive(Default)]
struct State {
    armed: Option<(String, Instant, u64)>,
    generation: u64,
    fired: Option<String>,
    stop: bool,
}

pub struct Watchdog {
    shared: Arc<(Mutex<State>, Condvar)>,
    thread: Option<std::thread::JoinHandle<()>>,
}

/// Disarms its phase when dropped.
pub struct Guard<'a> {
    dog: &'a Watchdog,
    generation: u64,
}

impl Watchdog {
    pub fn new(on_fire: impl Fn(&str) + Send + 'static) -> Watchdog {
        let shared = Arc::new((Mutex::new(State::default()), Condvar::new()));
        let s = shared.clone();
        let thread = std::thread::spawn(move || {
            let (lock, cv) = &*s;
            let mut st = lock.lock().unwrap_or_else(|p| p.into_inner());
            loop {
                if st.stop {
                    return;
                }
                match st.armed.clone() {
                    None => st = cv.wait(st).unwrap_or_else(|p| p.into_inner()),
                    Some((phase, deadline, generation)) => {
                        let now = Instant::now();
                        if now >= deadline {
                            st.armed = None;
                            st.fired = Some(phase.clone());
                            drop(st);
                            on_fire(&phase);
                            st = lock.lock().unwrap_or_else(|p| p.into_inner());
                            let _ = generation;
                        } else {
                            st = cv
                                .wait_timeout(st, deadline - now)
                                .unwrap_or_else(|p| p.into_inner())
                                .0;
                        }
                    }
                }
            }
        });
        Watchdog {
            shared,
            thread: Some(thread),
        }
    }

    /// Arm for `phase`; the returned guard disarms it.
    pub fn guard(&self, phase: &str, timeout: Duration) -> Guard<'_> {
        let (lock, cv) = &*self.shared;
        let mut st = lock.lock().unwrap_or_else(|p| p.into_inner());
        st.generation += 1;
        let generation = st.generation;
        st.armed = Some((phase.to_string(), Instant::now() + timeout, generation));
        cv.notify_all();
        Guard {
            dog: self,
            generation,
        }
    }

    /// The phase that overran, if any did.
    pub fn fired(&self) -> Option<String> {
        self.shared
            .0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .fired
            .clone()
    }
}

impl Drop for Guard<'_> {
    fn drop(&mut self) {
        let (lock, cv) = &*self.dog.shared;
        let mut st = lock.lock().unwrap_or_else(|p| p.into_inner());
        if st.armed.as_ref().is_some_and(|a| a.2 == self.generation) {
            st.armed = None;
            cv.notify_all();
        }
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        {
            let (lock, cv) = &*self.shared;
            lock.lock().unwrap_or_else(|p| p.into_inner()).stop = true;
            cv.notify_all();
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[test]
    fn fires_once_on_an_overrun_and_names_the_phase() {
        let count = Arc::new(AtomicUsize::new(0));
        let c = count.clone();
        let dog = Watchdog::new(move |_| {
            c.fetch_add(1, Ordering::SeqCst);
        });
        {
            let _g = dog.guard("exchange of case x", Duration::from_millis(50));
            std::thread::sleep(Duration::from_millis(200));
        }
        assert_eq!(count.load(Ordering::SeqCst), 1);
        assert_eq!(dog.fired().as_deref(), Some("exchange of case x"));
    }

    #[test]
    fn does_not_fire_when_phases_finish_in_time() {
        let count = Arc::new(AtomicUsize::new(0));
        let c = count.clone();
        let dog = Watchdog::new(move |_| {
            c.fetch_add(1, Ordering::SeqCst);
        });
        for _ in 0..5 {
            let _g = dog.guard("fold", Duration::from_millis(100));
            std::thread::sleep(Duration::from_millis(10));
        }
        std::thread::sleep(Duration::from_millis(150));
        assert_eq!(count.load(Ordering::SeqCst), 0);
        assert_eq!(dog.fired(), None);
    }
}
