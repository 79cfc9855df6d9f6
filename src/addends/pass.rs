//! The one pass over a case's rank files, in the background: each file is
//! read once into memory that is kept, and each block is hashed after it
//! is read, by another thread, while the reader goes on. The backends wait
//! only for the bytes they read, block by block, so an upload runs behind
//! the reading; the SHA-256 is waited for where a digest is needed (the
//! case key, the report), so hashing a gigabyte runs behind the upload
//! and the fold instead of before them.

use super::read::Source;
use crate::digest::Sha256;
use sha2::Digest;
use std::os::unix::fs::FileExt;
use std::sync::mpsc;
use std::sync::{Arc, Condvar, Mutex, OnceLock};

/// Bytes per block: one read, one hash update, one step of progress.
const BLOCK: usize = 8 << 20;

/// A file's bytes, in one anonymous mapping of their size, aligned to
/// 2 MiB and backed by huge pages where the kernel gives them: the first
/// touch of a gigabyte of fresh 4 KiB pages costs as much as reading it.
/// The reader writes each block once, before it is published; everyone
/// else reads only what was published.
#[derive(Debug)]
struct Region {
    base: *mut u8,
    len: usize,
    map: *mut libc::c_void,
    map_len: usize,
}

// SAFETY: the mapping is plain memory owned by the region; writes (the
// reader's, to bytes not yet published) and reads (of published bytes)
// never overlap, and publishing goes through the pass's mutex or channel.
unsafe impl Send for Region {}
// SAFETY: as for `Send`: shared use only reads published bytes.
unsafe impl Sync for Region {}

const HUGE: usize = 2 << 20;

impl Region {
    fn new(len: usize) -> std::io::Result<Region> {
        if len == 0 {
            return Ok(Region {
                base: std::ptr::NonNull::dangling().as_ptr(),
                len,
                map: std::ptr::null_mut(),
                map_len: 0,
            });
        }
        let map_len = len
            .checked_add(HUGE)
            .ok_or_else(|| std::io::Error::other("too large to map"))?;
        // SAFETY: a fresh private anonymous mapping; checked below.
        let map = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                map_len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if map == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        let skip = (map as usize).next_multiple_of(HUGE) - map as usize;
        // SAFETY: `skip < HUGE`, so `base .. base + len` lies in the mapping.
        let base = unsafe { map.cast::<u8>().add(skip) };
        #[cfg(target_os = "linux")]
        // SAFETY: the range lies in this mapping; madvise only changes how
        // the kernel backs it, and failing is harmless (4 KiB pages).
        unsafe {
            libc::madvise(
                base.cast(),
                len.next_multiple_of(HUGE).min(map_len - skip),
                libc::MADV_HUGEPAGE,
            );
        }
        Ok(Region {
            base,
            len,
            map,
            map_len,
        })
    }

    /// Bytes `at .. at + n`, which must be published.
    fn part(&self, at: usize, n: usize) -> &[u8] {
        assert!(at <= self.len && n <= self.len - at);
        // SAFETY: inside the mapping (checked), zero-filled or written
        // before it was published, never written again.
        unsafe { std::slice::from_raw_parts(self.base.add(at), n) }
    }

    /// Bytes `at .. at + n` to read into.
    ///
    /// # Safety
    /// Only the pass's reader, on bytes it has not published yet.
    #[allow(clippy::mut_from_ref)]
    unsafe fn part_mut(&self, at: usize, n: usize) -> &mut [u8] {
        assert!(at <= self.len && n <= self.len - at);
        std::slice::from_raw_parts_mut(self.base.add(at), n)
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        if self.map_len > 0 {
            // SAFETY: the mapping this region made, unmapped once.
            unsafe {
                libc::munmap(self.map, self.map_len);
            }
        }
    }
}

/// The first `len` bytes of a file as the pass read them: exactly bytes
/// the digest is of.
#[derive(Debug, Clone, Copy)]
pub(super) struct Held<'a> {
    region: &'a Region,
    len: u64,
}

impl<'a> Held<'a> {
    /// The bytes, from the file's start.
    pub(super) fn prefix(self) -> &'a [u8] {
        self.region.part(0, self.len as usize)
    }

    #[cfg(test)]
    pub(super) fn to_vec(self) -> Vec<u8> {
        self.prefix().to_vec()
    }
}

impl Source for Held<'_> {
    fn fill_at(&self, buf: &mut [u8], at: u64) -> std::io::Result<()> {
        let from = self.view(at, buf.len()).ok_or_else(|| {
            std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                "read past the bytes that were hashed",
            )
        })?;
        buf.copy_from_slice(from);
        Ok(())
    }
    fn view(&self, at: u64, len: usize) -> Option<&[u8]> {
        let end = at.checked_add(len as u64)?;
        (end <= self.len).then(|| self.region.part(at as usize, len))
    }
}

/// Why a file's pass failed: said as the file's own error would be.
#[derive(Debug, Clone)]
pub(super) enum PassError {
    /// Unreadable: the message.
    Bad(String),
    /// Changed between its opening and the end of its read.
    Changed,
}

/// How far a file's read has come.
#[derive(Debug, Default)]
struct Progress {
    /// Bytes read and published, from the start.
    filled: u64,
    /// The read's end: every byte read and the file unchanged, or why not.
    end: Option<Result<(), PassError>>,
}

/// One file's pass: its bytes as they are read, then its SHA-256 once
/// hashed.
#[derive(Debug)]
pub(super) struct Pass {
    region: Result<Region, PassError>,
    progress: Mutex<Progress>,
    moved: Condvar,
    digest: OnceLock<Result<Sha256, PassError>>,
}

impl Pass {
    fn new(len: u64) -> Pass {
        let region = usize::try_from(len)
            .map_err(|_| std::io::Error::other("larger than this machine's address space"))
            .and_then(Region::new)
            .map_err(|e| PassError::Bad(format!("cannot map {len} bytes to read it into: {e}")));
        Pass {
            region,
            progress: Mutex::default(),
            moved: Condvar::new(),
            digest: OnceLock::new(),
        }
    }

    /// Waits until `ready` says yes of the progress; the bytes read by then.
    fn wait(&self, ready: impl Fn(&Progress) -> bool) -> (u64, Option<Result<(), PassError>>) {
        let mut p = self.progress.lock().unwrap_or_else(|e| e.into_inner());
        while !ready(&p) {
            p = self.moved.wait(p).unwrap_or_else(|e| e.into_inner());
        }
        (p.filled, p.end.clone())
    }

    /// Every byte, once the read has ended with the file found unchanged.
    pub(super) fn bytes(&self) -> Result<Held<'_>, PassError> {
        let (filled, end) = self.wait(|p| p.end.is_some());
        end.unwrap_or(Ok(()))?;
        self.held(filled)
    }

    /// The bytes before `end` (and possibly more), as soon as they are
    /// read: a backend copies them up while the rest is read. The file may
    /// still fail its read later; [`Self::bytes`] says so.
    pub(super) fn upto(&self, end: u64) -> Result<Held<'_>, PassError> {
        let (filled, e) = self.wait(|p| p.filled >= end || p.end.is_some());
        if filled < end {
            // Ended short of `end`: failed, or `end` lies past the file.
            e.unwrap_or(Ok(()))?;
        }
        self.held(filled)
    }

    fn held(&self, len: u64) -> Result<Held<'_>, PassError> {
        let region = self.region.as_ref().map_err(Clone::clone)?;
        Ok(Held { region, len })
    }

    /// The SHA-256 of the bytes, once the last block is hashed.
    pub(super) fn digest(&self) -> Result<Sha256, PassError> {
        self.digest.wait().clone()
    }

    fn publish(&self, filled: u64) {
        self.progress
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .filled = filled;
        self.moved.notify_all();
    }

    fn end(&self, end: Result<(), PassError>) {
        self.progress.lock().unwrap_or_else(|e| e.into_inner()).end = Some(end);
        self.moved.notify_all();
    }
}

/// What a pass needs of an opened file: the file, its size, and whether
/// it is as it was when opened.
pub(super) trait Input: Send + Sync + 'static {
    fn file(&self) -> &std::fs::File;
    fn size(&self) -> u64;
    fn unchanged(&self) -> Result<bool, String>;
}

/// Start the passes over `files`: lanes of a reader and a hasher each
/// (half the cores, at least one), each lane taking every lanes-th file.
/// Returns at once; each file's [`Pass`] fills in as its blocks arrive.
pub(super) fn start(files: Vec<Arc<dyn Input>>) -> Vec<Arc<Pass>> {
    let passes: Vec<Arc<Pass>> = files
        .iter()
        .map(|f| Arc::new(Pass::new(f.size())))
        .collect();
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let lanes = (cores / 2).clamp(1, files.len().max(1));
    for lane in 0..lanes {
        let mine: Vec<(Arc<dyn Input>, Arc<Pass>)> = (lane..files.len())
            .step_by(lanes)
            .map(|i| (files[i].clone(), passes[i].clone()))
            .collect();
        let (tx, rx) = mpsc::channel::<Step>();
        let lane_passes: Vec<Arc<Pass>> = mine.iter().map(|(_, p)| p.clone()).collect();
        let hashing = lane_passes.clone();
        let started = std::thread::Builder::new()
            .name("foldprint-hash".into())
            .spawn(move || hash_lane(rx, &hashing))
            .and_then(|_| {
                std::thread::Builder::new()
                    .name("foldprint-read".into())
                    .spawn(move || read_lane(&mine, &tx))
            });
        // No thread, no pass: every file of the lane says why (a slot the
        // hasher already filled keeps its value).
        if let Err(e) = started {
            let why = PassError::Bad(format!("cannot start a thread to read it: {e}"));
            for p in &lane_passes {
                p.end(Err(why.clone()));
                let _ = p.digest.set(Err(why.clone()));
            }
        }
    }
    passes
}

/// What the reader tells the hasher.
enum Step {
    /// Bytes `at .. at + n` of the lane's current file are read.
    Block(usize, usize),
    /// The file's last block was sent and the file is unchanged.
    End,
    /// The read failed: no digest.
    Failed(PassError),
}

fn read_lane(files: &[(Arc<dyn Input>, Arc<Pass>)], tx: &mpsc::Sender<Step>) {
    for (input, pass) in files {
        let read = read_blocks(input.as_ref(), pass, tx);
        // A hasher gone is a thread gone: the digest slot then stays
        // empty, which only a process that is exiting can meet.
        let _ = tx.send(match &read {
            Ok(()) => Step::End,
            Err(e) => Step::Failed(e.clone()),
        });
        pass.end(read);
    }
}

fn read_blocks(input: &dyn Input, pass: &Pass, tx: &mpsc::Sender<Step>) -> Result<(), PassError> {
    let region = pass.region.as_ref().map_err(Clone::clone)?;
    let len = region.len;
    let mut at = 0;
    while at < len {
        let n = (len - at).min(BLOCK);
        // SAFETY: this lane is the file's only reader, and `at ..` is not
        // published yet.
        let into = unsafe { region.part_mut(at, n) };
        input
            .file()
            .read_exact_at(into, at as u64)
            .map_err(|e| PassError::Bad(format!("cannot read it: {e}")))?;
        at += n;
        pass.publish(at as u64);
        let _ = tx.send(Step::Block(at - n, n));
    }
    match input.unchanged() {
        Ok(true) => Ok(()),
        Ok(false) => Err(PassError::Changed),
        Err(e) => Err(PassError::Bad(e)),
    }
}

/// How far behind the rest of the process the pass's hashing threads run
/// (nice steps). A file's digest is waited for only where a digest is
/// needed, last in a case; the reading, the upload and the hash of the
/// reduced arena are waited for first. Measured on 16 cores: with eight
/// hashers at the same priority, rank 0's arena hashed its first 32 MiB
/// three times slower than alone (docs/BENCHMARKS.md).
const HASHER_NICE: libc::c_int = 10;

/// Let this thread yield to the process's others when cores are short:
/// [`HASHER_NICE`] above the thread's nice value, at most 19 (a higher
/// nice value is always allowed; failing leaves it as it was).
fn behind_the_rest() {
    #[cfg(target_os = "linux")]
    // SAFETY: plain system calls about this thread only (on Linux a
    // thread id names one thread for PRIO_PROCESS).
    unsafe {
        let tid = libc::syscall(libc::SYS_gettid) as libc::id_t;
        *libc::__errno_location() = 0;
        let now = libc::getpriority(libc::PRIO_PROCESS, tid);
        if *libc::__errno_location() == 0 {
            libc::setpriority(libc::PRIO_PROCESS, tid, (now + HASHER_NICE).min(19));
        }
    }
}

fn hash_lane(rx: mpsc::Receiver<Step>, passes: &[Arc<Pass>]) {
    behind_the_rest();
    let mut files = passes.iter();
    let mut current = files.next();
    let mut h = sha2::Sha256::new();
    for step in rx {
        match step {
            Step::Block(at, n) => {
                // A block is only sent from a region that exists.
                if let Some(Ok(region)) = current.map(|p| &p.region) {
                    h.update(region.part(at, n));
                }
            }
            Step::End | Step::Failed(_) => {
                let done = std::mem::take(&mut h);
                let digest = match step {
                    Step::Failed(e) => Err(e),
                    _ => Ok(Sha256::from_bytes(done.finalize().into())),
                };
                if let Some(p) = current {
                    let _ = p.digest.set(digest);
                }
                current = files.next();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Mem(std::fs::File, u64);
    impl Input for Mem {
        fn file(&self) -> &std::fs::File {
            &self.0
        }
        fn size(&self) -> u64 {
            self.1
        }
        fn unchanged(&self) -> Result<bool, String> {
            Ok(true)
        }
    }

    /// Files of several blocks, more files than lanes: every file's bytes
    /// and digest are its own, across block edges and in lane order.
    #[test]
    fn every_file_gets_its_own_bytes_and_digest() {
        let dir = tempfile::tempdir().unwrap();
        let sizes = [
            0,
            1,
            BLOCK - 1,
            BLOCK,
            BLOCK + 3,
            2 * BLOCK + 17,
            5,
            3 * BLOCK,
        ];
        let mut inputs: Vec<Arc<dyn Input>> = Vec::new();
        let mut want = Vec::new();
        for (i, &n) in sizes.iter().enumerate() {
            let bytes: Vec<u8> = (0..n).map(|k| (k * 7 + i * 13 + k / 251) as u8).collect();
            let p = dir.path().join(format!("f{i}"));
            std::fs::write(&p, &bytes).unwrap();
            inputs.push(Arc::new(Mem(std::fs::File::open(&p).unwrap(), n as u64)));
            want.push(bytes);
        }
        let passes = start(inputs);
        for (p, w) in passes.iter().zip(&want) {
            assert_eq!(p.digest().unwrap(), Sha256::of(w));
            let b = p.bytes().unwrap();
            assert_eq!(b.to_vec(), *w);
            // Across a block edge, and past the end (an error).
            if w.len() > BLOCK + 2 {
                let mut buf = [0u8; 4];
                b.fill_at(&mut buf, BLOCK as u64 - 2).unwrap();
                assert_eq!(buf[..], w[BLOCK - 2..BLOCK + 2]);
            }
            let mut one = [0u8; 1];
            assert!(b.fill_at(&mut one, w.len() as u64).is_err());
            assert!(b.view(w.len() as u64, 1).is_none());
            // An empty view at the very end, even on a block edge, is no panic.
            b.view(w.len() as u64, 0);
            if w.len() > BLOCK + 2 {
                // One piece of memory: a view may cross a block edge.
                assert_eq!(
                    b.view(BLOCK as u64 - 2, 4).unwrap(),
                    &w[BLOCK - 2..BLOCK + 2]
                );
            }
            // As far as a file goes, `upto` gives the bytes read by then.
            let part = p.upto(w.len() as u64).unwrap();
            assert_eq!(part.view(0, w.len()).unwrap(), &w[..]);
        }
        // Negative control: the digests differ between files.
        assert_ne!(passes[2].digest().unwrap(), passes[3].digest().unwrap());
    }

    /// A file shorter than its stamp says: both slots say why, neither
    /// waits forever.
    #[test]
    fn a_short_file_fails_both_slots() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("short");
        std::fs::write(&p, [1u8; 10]).unwrap();
        let passes = start(vec![Arc::new(Mem(std::fs::File::open(&p).unwrap(), 20))]);
        assert!(matches!(passes[0].bytes(), Err(PassError::Bad(_))));
        assert!(matches!(passes[0].digest(), Err(PassError::Bad(_))));
        // What was never read is never given: past the short end, `upto`
        // says why instead of waiting.
        assert!(matches!(passes[0].upto(15), Err(PassError::Bad(_))));
    }

    /// A read held back at its end (the unchanged check): `upto` gives
    /// every byte read by then, while `bytes` and the digest wait for the
    /// end.
    #[test]
    fn upto_answers_before_the_read_ends() {
        struct Gated(std::fs::File, u64, Mutex<bool>, Condvar);
        impl Input for Gated {
            fn file(&self) -> &std::fs::File {
                &self.0
            }
            fn size(&self) -> u64 {
                self.1
            }
            fn unchanged(&self) -> Result<bool, String> {
                // The end of the read waits for the gate.
                let mut open = self.2.lock().unwrap();
                while !*open {
                    open = self.3.wait(open).unwrap();
                }
                Ok(true)
            }
        }
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("two-blocks");
        let w: Vec<u8> = (0..BLOCK + 100).map(|k| (k % 253) as u8).collect();
        std::fs::write(&p, &w).unwrap();
        let gated = Arc::new(Gated(
            std::fs::File::open(&p).unwrap(),
            w.len() as u64,
            Mutex::new(false),
            Condvar::new(),
        ));
        let passes = start(vec![gated.clone()]);
        // Every byte is read, but the read has not ended: `upto` answers.
        let first = passes[0].upto(w.len() as u64).unwrap();
        assert_eq!(first.view(0, w.len()).unwrap(), &w[..]);
        assert!(
            passes[0].digest.get().is_none(),
            "the end is still held back"
        );
        // Meanwhile the lane's hasher runs behind the reader.
        #[cfg(target_os = "linux")]
        {
            let nice = threads_nice();
            let of = |name: &str| -> Vec<i64> {
                nice.iter()
                    .filter(|(n, _)| n == name)
                    .map(|(_, v)| *v)
                    .collect()
            };
            let (hash, read) = (of("foldprint-hash"), of("foldprint-read"));
            assert!(!hash.is_empty() && !read.is_empty(), "{nice:?}");
            // Every reader has the process's nice value; every hasher is
            // HASHER_NICE behind it (the field read is the nice value: the
            // two differ unless the process already runs at the bottom).
            let base = read[0];
            assert!(read.iter().all(|&v| v == base), "{nice:?}");
            let behind = (base + i64::from(HASHER_NICE)).min(19);
            assert!(hash.iter().all(|&v| v == behind), "{nice:?}");
            assert!(base == 19 || behind != base);
        }
        *gated.2.lock().unwrap() = true;
        gated.3.notify_all();
        assert_eq!(passes[0].bytes().unwrap().to_vec(), w);
        assert_eq!(passes[0].digest().unwrap(), Sha256::of(&w));
    }

    /// Each thread of this process with its name and nice value, from
    /// /proc (the nice value is the stat line's 19th field).
    #[cfg(target_os = "linux")]
    fn threads_nice() -> Vec<(String, i64)> {
        let mut out = Vec::new();
        for task in std::fs::read_dir("/proc/self/task").unwrap().flatten() {
            let Ok(stat) = std::fs::read_to_string(task.path().join("stat")) else {
                continue; // a thread that ended meanwhile
            };
            let (Some(open), Some(close)) = (stat.find('('), stat.rfind(')')) else {
                continue;
            };
            let name = stat[open + 1..close].to_string();
            let fields: Vec<&str> = stat[close + 1..].split_whitespace().collect();
            if let Some(n) = fields.get(16).and_then(|f| f.parse().ok()) {
                out.push((name, n));
            }
        }
        out
    }
}
