//! How much memory this process may still allocate: the least of what the
//! kernel says is available (MemAvailable), what the address-space limit
//! leaves (RLIMIT_AS, `ulimit -v`), and what the cgroup leaves (v2
//! `memory.max`, v1 `memory.limit_in_bytes`, up the hierarchy). Checking
//! only MemAvailable lets a case abort in the allocator under a limit.

/// Bytes this process can still allocate, and which limit says so.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Headroom {
    pub bytes: u64,
    /// `host memory`, `address space (RLIMIT_AS)` or `cgroup memory`.
    pub what: &'static str,
}

pub fn headroom() -> Option<Headroom> {
    least(mem_available(), address_space_left(), cgroup_left())
}

/// [`headroom`]'s bytes, for callers that need no reason.
pub fn available_memory() -> Option<u64> {
    headroom().map(|h| h.bytes)
}

/// The tightest of the three readings; a reading of `None` sets no limit.
fn least(host: Option<u64>, address_space: Option<u64>, cgroup: Option<u64>) -> Option<Headroom> {
    [
        (host, "host memory"),
        (address_space, "address space (RLIMIT_AS)"),
        (cgroup, "cgroup memory"),
    ]
    .into_iter()
    .filter_map(|(b, what)| b.map(|bytes| Headroom { bytes, what }))
    .min_by_key(|h| h.bytes)
}

fn mem_available() -> Option<u64> {
    let info = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = info.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// RLIMIT_AS less the address space already mapped (VmSize); `None`
/// without a limit.
pub fn address_space_left() -> Option<u64> {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes into the struct we pass.
    if unsafe { libc::getrlimit(libc::RLIMIT_AS, &mut lim) } != 0
        || lim.rlim_cur == libc::RLIM_INFINITY
    {
        return None;
    }
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmSize:"))?;
    let used = line.split_whitespace().nth(1)?.parse::<u64>().ok()? * 1024;
    Some(lim.rlim_cur.saturating_sub(used))
}

fn read_u64(path: &std::path::Path) -> Option<u64> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

/// The tightest (limit - usage) over this process's cgroup and its parents.
fn cgroup_left() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    cgroup_left_in(&text, std::path::Path::new("/sys/fs/cgroup"))
}

/// [`cgroup_left`] for a `/proc/self/cgroup` text and a cgroup mount root.
fn cgroup_left_in(text: &str, mount: &std::path::Path) -> Option<u64> {
    let mut best: Option<u64> = None;
    for line in text.lines() {
        let mut parts = line.splitn(3, ':');
        let (_, controllers, rel) = (parts.next()?, parts.next()?, parts.next()?);
        let (root, limit_file, usage_file) = if controllers.is_empty() {
            (mount.to_path_buf(), "memory.max", "memory.current")
        } else if controllers.split(',').any(|c| c == "memory") {
            (
                mount.join("memory"),
                "memory.limit_in_bytes",
                "memory.usage_in_bytes",
            )
        } else {
            continue;
        };
        let root_len = root.as_os_str().len();
        let mut dir = root.join(rel.trim_start_matches('/'));
        loop {
            // "max" (v2) does not parse: no limit at this level.
            if let (Some(limit), Some(usage)) = (
                read_u64(&dir.join(limit_file)),
                read_u64(&dir.join(usage_file)),
            ) {
                let left = limit.saturating_sub(usage);
                best = Some(best.map_or(left, |b| b.min(left)));
            }
            if dir.as_os_str().len() <= root_len || !dir.pop() {
                break;
            }
        }
    }
    best
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cgroup_limits_are_read_up_the_hierarchy() {
        let root = tempfile::tempdir().unwrap();
        let put = |rel: &str, file: &str, text: &str| {
            let d = root.path().join(rel);
            std::fs::create_dir_all(&d).unwrap();
            std::fs::write(d.join(file), text).unwrap();
        };
        // v2: the job's own group has no limit ("max"); its parent has one.
        put("job.slice", "memory.max", "1000000\n");
        put("job.slice", "memory.current", "400000\n");
        put("job.slice/run", "memory.max", "max\n");
        put("job.slice/run", "memory.current", "300000\n");
        assert_eq!(
            cgroup_left_in("0::/job.slice/run\n", root.path()),
            Some(600_000)
        );
        // No limit anywhere: nothing to say.
        assert_eq!(cgroup_left_in("0::/other\n", root.path()), None);
        // v1: the memory controller's hierarchy.
        put("memory/x", "memory.limit_in_bytes", "5000\n");
        put("memory/x", "memory.usage_in_bytes", "1000\n");
        assert_eq!(
            cgroup_left_in("4:cpu:/x\n3:memory:/x\n", root.path()),
            Some(4000)
        );
    }

    #[test]
    fn headroom_is_the_least_of_the_limits() {
        // Fixed readings: live ones (MemAvailable) move between two reads.
        let h = least(Some(900), Some(500), Some(700)).unwrap();
        assert_eq!((h.bytes, h.what), (500, "address space (RLIMIT_AS)"));
        let h = least(Some(900), None, Some(700)).unwrap();
        assert_eq!((h.bytes, h.what), (700, "cgroup memory"));
        let h = least(Some(300), Some(500), None).unwrap();
        assert_eq!((h.bytes, h.what), (300, "host memory"));
        assert_eq!(least(None, None, None), None);
        // The live reading exists on Linux.
        assert!(headroom().is_some());
    }
}
