//! The one pass over a case's rank files, in the background: each file is
//! read once into blocks that are kept, and each block is hashed after it
//! is read, by another thread, while the reader goes on. The backends wait
//! only for the bytes; the SHA-256 is waited for where a digest is needed
//! (the case key, the report), so hashing a gigabyte runs behind the
//! upload and the fold instead of before them.

use super::read::Source;
use crate::digest::Sha256;
use sha2::Digest;
use std::os::unix::fs::FileExt;
use std::sync::mpsc;
use std::sync::{Arc, OnceLock};

/// Bytes per block: one read, one hash update.
const BLOCK: usize = 8 << 20;

/// A file's bytes as the pass read them, in blocks of [`BLOCK`] (the last
/// shorter): exactly the bytes the digest is of.
#[derive(Debug)]
pub(super) struct Blocks {
    parts: Vec<Arc<Vec<u8>>>,
    len: u64,
}

impl Blocks {
    #[cfg(test)]
    pub(super) fn to_vec(&self) -> Vec<u8> {
        self.parts.iter().flat_map(|p| p.iter().copied()).collect()
    }
}

impl Source for Blocks {
    fn fill_at(&self, buf: &mut [u8], at: u64) -> std::io::Result<()> {
        let end = at.checked_add(buf.len() as u64);
        if end.is_none_or(|e| e > self.len) {
            return Err(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                "read past the bytes that were hashed",
            ));
        }
        let mut done = 0;
        while done < buf.len() {
            let pos = at as usize + done;
            let part = &self.parts[pos / BLOCK];
            let from = &part[pos % BLOCK..];
            let n = from.len().min(buf.len() - done);
            buf[done..done + n].copy_from_slice(&from[..n]);
            done += n;
        }
        Ok(())
    }
    fn view(&self, at: u64, len: usize) -> Option<&[u8]> {
        let end = at.checked_add(len as u64)?;
        if end > self.len {
            return None;
        }
        let at = at as usize;
        self.parts
            .get(at / BLOCK)?
            .get(at % BLOCK..at % BLOCK + len)
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

/// One file's pass: its bytes once read, then its SHA-256 once hashed.
#[derive(Debug, Default)]
pub(super) struct Pass {
    bytes: OnceLock<Result<Arc<Blocks>, PassError>>,
    digest: OnceLock<Result<Sha256, PassError>>,
}

impl Pass {
    /// The bytes, once every block is read (and the file found unchanged).
    pub(super) fn bytes(&self) -> Result<&Arc<Blocks>, PassError> {
        self.bytes.wait().as_ref().map_err(Clone::clone)
    }
    /// The SHA-256 of the bytes, once the last block is hashed.
    pub(super) fn digest(&self) -> Result<Sha256, PassError> {
        self.digest.wait().clone()
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
    let passes: Vec<Arc<Pass>> = files.iter().map(|_| Arc::default()).collect();
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
                let _ = p.bytes.set(Err(why.clone()));
                let _ = p.digest.set(Err(why.clone()));
            }
        }
    }
    passes
}

/// What the reader tells the hasher.
enum Step {
    Block(Arc<Vec<u8>>),
    /// The file's last block was sent and the file is unchanged.
    End,
    /// The read failed: no digest.
    Failed(PassError),
}

fn read_lane(files: &[(Arc<dyn Input>, Arc<Pass>)], tx: &mpsc::Sender<Step>) {
    for (input, pass) in files {
        let read = read_blocks(input.as_ref(), tx);
        // A hasher gone is a thread gone: the digest slot then stays
        // empty, which only a process that is exiting can meet.
        let _ = tx.send(match &read {
            Ok(_) => Step::End,
            Err(e) => Step::Failed(e.clone()),
        });
        let _ = pass.bytes.set(read.map(Arc::new));
    }
}

fn read_blocks(input: &dyn Input, tx: &mpsc::Sender<Step>) -> Result<Blocks, PassError> {
    let len = input.size();
    let mut parts = Vec::new();
    let mut at = 0u64;
    while at < len {
        let n = (len - at).min(BLOCK as u64) as usize;
        let mut b = vec![0u8; n];
        huge_pages(&mut b);
        input
            .file()
            .read_exact_at(&mut b, at)
            .map_err(|e| PassError::Bad(format!("cannot read it: {e}")))?;
        let b = Arc::new(b);
        let _ = tx.send(Step::Block(b.clone()));
        parts.push(b);
        at += n as u64;
    }
    match input.unchanged() {
        Ok(true) => Ok(Blocks { parts, len }),
        Ok(false) => Err(PassError::Changed),
        Err(e) => Err(PassError::Bad(e)),
    }
}

fn hash_lane(rx: mpsc::Receiver<Step>, passes: &[Arc<Pass>]) {
    let mut files = passes.iter();
    let mut h = sha2::Sha256::new();
    for step in rx {
        match step {
            Step::Block(b) => h.update(&b[..]),
            Step::End | Step::Failed(_) => {
                let done = std::mem::take(&mut h);
                let digest = match step {
                    Step::Failed(e) => Err(e),
                    _ => Ok(Sha256::from_bytes(done.finalize().into())),
                };
                if let Some(p) = files.next() {
                    let _ = p.digest.set(digest);
                }
            }
        }
    }
}

/// Ask for transparent huge pages on a large fresh allocation: first-touch
/// page faults otherwise cost as much as the reading.
fn huge_pages(v: &mut [u8]) {
    const HUGE: usize = 2 << 20;
    let start = v.as_mut_ptr() as usize;
    let end = start + v.len();
    let aligned = start.next_multiple_of(HUGE);
    if end > aligned + HUGE {
        let len = (end - aligned) / HUGE * HUGE;
        // SAFETY: the range lies inside this allocation; madvise only
        // changes how the kernel backs it. Failure is harmless.
        unsafe {
            libc::madvise(aligned as *mut libc::c_void, len, libc::MADV_HUGEPAGE);
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
                // A view never crosses a block edge; within one it is the bytes.
                assert!(b.view(BLOCK as u64 - 2, 4).is_none());
                assert_eq!(
                    b.view(BLOCK as u64 + 1, 2).unwrap(),
                    &w[BLOCK + 1..BLOCK + 3]
                );
            }
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
    }
}
