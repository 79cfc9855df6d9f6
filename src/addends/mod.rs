//! Addends from files: a case whose ranks reduce what a training job
//! reduced, one file per rank (`grads/rank{rank}.safetensors`), instead of
//! the generator's values.
//!
//! A rank file is opened once, checked (a regular file, a valid header,
//! every byte accounted for, the same arenas as every other rank's file),
//! then read once: each block hashed as the next is read, and the bytes
//! kept, so the backends read their arenas from exactly the bytes the
//! report's digest names (files too large to keep in memory are hashed,
//! then read again with positioned reads). Before each read the open file
//! is checked against what was hashed, and a file that changed between
//! its opening and the end of the pass is refused.
//! Under NCCL with one process per rank, each rank opens only its own file
//! (as in a real job, where the others may be on other machines) and rank 0
//! learns the others' digests in the rendezvous ([`AddendFiles::complete`]).

mod format;
mod pass;
mod read;

pub use format::{Dtype, Format, Tensor};

use crate::digest::Sha256;
use crate::world_size::WorldSize;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Ranks past the last rank file looked at, to tell a gap from the end.
const GAP_LOOKAHEAD: usize = 64;

/// What a rank file is, as every report records it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileFacts {
    pub sha256: Sha256,
    pub bytes: u64,
}

/// Which rank files this process opens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    /// Every rank's (the CPU oracle, CUDA, NCCL with one process).
    AllRanks,
    /// Only `rank`'s, of `world` (NCCL with one process per rank).
    OwnRank { rank: usize, world: usize },
}

/// Why a rank file cannot be used. The path is the one the experiment
/// wrote, with the rank filled in.
#[derive(Debug, thiserror::Error)]
pub enum AddendError {
    /// Missing, unreadable, malformed, or unlike the other ranks' files.
    #[error("{path}: {message}")]
    Bad { path: String, message: String },
    /// Changed after foldprint hashed it: its digest would not describe
    /// the bytes reduced.
    #[error(
        "{path}: changed after foldprint hashed it ({what}); run again on files nobody is writing"
    )]
    Changed { path: String, what: String },
    /// A read the operating system refused mid-run.
    #[error("{path}: cannot read tensor `{tensor}`: {source}")]
    Io {
        path: String,
        tensor: String,
        #[source]
        source: std::io::Error,
    },
    /// Asked for a rank whose file this process did not open.
    #[error("rank {rank}'s file {path} is not open in this process")]
    NotOpened { rank: usize, path: String },
}

/// One arena as the files hold it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ArenaSpec {
    /// The tensor's name (`array` for an npy file).
    pub name: String,
    pub dtype: Dtype,
    pub shape: Vec<u64>,
    pub len: usize,
}

/// One rank's file, as reports record it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RankFileParams {
    /// As the experiment wrote it, with the rank filled in.
    pub path: String,
    pub sha256: Sha256,
    pub bytes: u64,
}

/// A case's addend files in its report: enough to tell whether two
/// reports reduced the same inputs, not where they were.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AddendParams {
    /// The `addends` value as written.
    pub template: String,
    pub format: Format,
    /// The arenas, in the case's order.
    pub arenas: Vec<ArenaSpec>,
    /// One per rank, in rank order.
    pub files: Vec<RankFileParams>,
    /// [`identity`] of the above: what the case key holds.
    pub identity: Sha256,
}

impl AddendParams {
    /// Whether `identity` is the one its fields give.
    pub fn identity_holds(&self) -> bool {
        let facts: Vec<FileFacts> = self
            .files
            .iter()
            .map(|f| FileFacts {
                sha256: f.sha256,
                bytes: f.bytes,
            })
            .collect();
        identity(self.format, &self.arenas, &facts) == self.identity
    }
}

/// The inputs' identity: format, arenas and every rank file's digest and
/// size in rank order; never a path, so the same files elsewhere compare.
/// A tensor name is escaped (docs/SPEC.md §6), so no name can pass for
/// another arena's fields: the text has one reading.
pub fn identity(format: Format, arenas: &[ArenaSpec], files: &[FileFacts]) -> Sha256 {
    let mut text = format!("foldprint addends 1\n{}\n", format.name());
    for a in arenas {
        let shape: Vec<String> = a.shape.iter().map(|d| d.to_string()).collect();
        text.push_str(&format!(
            "arena\t{}\t{}\t{}\t{}\n",
            escaped(&a.name, &[]),
            a.dtype,
            shape.join("x"),
            a.len
        ));
    }
    for f in files {
        text.push_str(&format!("file\t{}\t{}\n", f.sha256, f.bytes));
    }
    Sha256::of(text.as_bytes())
}

/// `name` with each backslash, tab and newline written `\\`, `\t`, `\n`
/// (and each of `also` after a backslash): a name without them is itself,
/// and no two names are written alike.
fn escaped<'a>(name: &'a str, also: &[char]) -> std::borrow::Cow<'a, str> {
    if !name.contains(|c| matches!(c, '\\' | '\t' | '\n') || also.contains(&c)) {
        return name.into();
    }
    let mut out = String::with_capacity(name.len() + 8);
    for c in name.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\t' => out.push_str("\\t"),
            '\n' => out.push_str("\\n"),
            c if also.contains(&c) => {
                out.push('\\');
                out.push(c);
            }
            c => out.push(c),
        }
    }
    out.into()
}

/// A file's identity on disk when it was hashed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Stamp {
    dev: u64,
    ino: u64,
    size: u64,
    mtime_ns: i128,
    ctime_ns: i128,
}

impl Stamp {
    fn of(file: &std::fs::File) -> std::io::Result<Stamp> {
        use std::os::unix::fs::MetadataExt;
        let m = file.metadata()?;
        let ns = |s: i64, n: i64| i128::from(s) * 1_000_000_000 + i128::from(n);
        Ok(Stamp {
            dev: m.dev(),
            ino: m.ino(),
            size: m.len(),
            mtime_ns: ns(m.mtime(), m.mtime_nsec()),
            ctime_ns: ns(m.ctime(), m.ctime_nsec()),
        })
    }
}

/// A rank file this process opened: its descriptor, kept open, and its
/// tensors in the case's arena order.
#[derive(Debug)]
struct Opened {
    file: std::fs::File,
    stamp: Stamp,
    tensors: Vec<Tensor>,
}

/// A file's bytes as its pass kept them, from its first byte: every byte
/// read so far, which are never written again while the files live.
#[derive(Debug, Clone, Copy)]
pub struct Kept<'a> {
    /// The bytes read so far, from the file's start.
    pub bytes: &'a [u8],
    /// Where the tensor's first element lies among them.
    pub tensor: usize,
}

#[derive(Debug, Clone)]
struct RankFile {
    /// As written, rank filled in.
    shown: String,
    facts: Option<FileFacts>,
    opened: Option<Arc<Opened>>,
    /// The file's one pass: the bytes the tensors are read from (never the
    /// file again), and their digest once hashed.
    pass: Option<Arc<pass::Pass>>,
}

impl RankFile {
    /// The file's digest and size: known, or waited for from its pass
    /// (`None` if the pass failed; reading the file says why).
    fn facts(&self) -> Option<FileFacts> {
        self.facts.or_else(|| {
            let p = self.pass.as_ref()?;
            Some(FileFacts {
                sha256: p.digest().ok()?,
                bytes: self.opened.as_ref()?.stamp.size,
            })
        })
    }
}

/// A failed pass, said of the file.
fn pass_failed(shown: &str, e: pass::PassError) -> AddendError {
    match e {
        pass::PassError::Bad(m) => bad(shown, m),
        pass::PassError::Changed => AddendError::Changed {
            path: shown.into(),
            what: "after it was opened, before its one read ended".into(),
        },
    }
}

/// The rank files of a case: what each rank's arenas are read from.
#[derive(Debug, Clone)]
pub struct AddendFiles {
    template: String,
    /// What a relative template is relative to (the experiment's directory).
    base: PathBuf,
    format: Format,
    arenas: Vec<ArenaSpec>,
    files: Vec<RankFile>,
}

impl PartialEq for AddendFiles {
    fn eq(&self, other: &Self) -> bool {
        self.template == other.template
            && self.format == other.format
            && self.arenas == other.arenas
            && self.files.len() == other.files.len()
            && self
                .files
                .iter()
                .zip(&other.files)
                .all(|(a, b)| a.shown == b.shown && a.facts() == b.facts())
    }
}

fn bad(path: &str, message: impl Into<String>) -> AddendError {
    AddendError::Bad {
        path: path.into(),
        message: message.into(),
    }
}

impl AddendFiles {
    /// Open the rank files `template` names (`{rank}` replaced by each
    /// rank), relative paths taken from `base` (the experiment file's
    /// directory). `tensors` picks and orders the arenas of a safetensors
    /// file (default: all of them, sorted by name). `world`, when the
    /// experiment sets it, is the number of rank files there must be;
    /// otherwise it is the number there are.
    pub fn open(
        template: &str,
        base: &Path,
        tensors: Option<&[String]>,
        world: Option<WorldSize>,
        scope: Scope,
    ) -> Result<AddendFiles, AddendError> {
        let world = world.map(WorldSize::get);
        if !template.contains("{rank}") {
            return Err(bad(
                template,
                "needs `{rank}` where the rank number goes: one file per rank",
            ));
        }
        let format = Format::of(template)
            .ok_or_else(|| bad(template, "name files `.safetensors` or `.npy`"))?;
        if tensors.is_some() && format == Format::Npy {
            return Err(bad(
                template,
                "`tensors` picks tensors of a safetensors file; an npy file holds one array",
            ));
        }
        let shown = |r: usize| template.replace("{rank}", &r.to_string());
        let resolve = |r: usize| -> PathBuf {
            let p = PathBuf::from(shown(r));
            if p.is_absolute() {
                p
            } else {
                base.join(p)
            }
        };
        let exists = |r: usize| std::fs::symlink_metadata(resolve(r)).is_ok();
        // A declared world and the rank files on disk must agree: a file
        // past it would be left out of the sum unseen.
        let beyond = |w: usize, what: &str| -> Result<(), AddendError> {
            if !(w..w + GAP_LOOKAHEAD).any(exists) {
                return Ok(());
            }
            let found: Vec<usize> = (0..w + GAP_LOOKAHEAD).filter(|&r| exists(r)).collect();
            Err(bad(
                template,
                format!(
                    "{what} = {w}, but {} file(s) match it ({}): \
                     the world and the rank files on disk must agree",
                    found.len(),
                    rank_list(&found)
                ),
            ))
        };
        let (world, mine): (usize, Vec<usize>) = match scope {
            Scope::OwnRank { rank, world: w } => {
                let (w, what) = match world {
                    Some(declared) => (declared, "world"),
                    None => (w, "W (the ranks launched)"),
                };
                beyond(w, what)?;
                (w, if rank < w { vec![rank] } else { Vec::new() })
            }
            Scope::AllRanks => {
                let w = match world {
                    Some(w) => w,
                    None => (0..).take_while(|&r| exists(r)).count(),
                };
                if w == 0 {
                    return Err(bad(&shown(0), "not found (the first rank file)"));
                }
                if let Some(r) = (0..w).find(|&r| !exists(r)) {
                    let found: Vec<usize> = (0..w + GAP_LOOKAHEAD).filter(|&r| exists(r)).collect();
                    return Err(bad(
                        &shown(r),
                        format!(
                            "not found: W = {w} needs a file for each of ranks 0 ..= {}; found {}",
                            w - 1,
                            if found.is_empty() {
                                "none".to_string()
                            } else {
                                rank_list(&found)
                            }
                        ),
                    ));
                }
                match world {
                    Some(w) => beyond(w, "world")?,
                    None => {
                        if let Some(r) = (w + 1..=w + GAP_LOOKAHEAD).find(|&r| exists(r)) {
                            return Err(bad(
                                &shown(w),
                                format!(
                                    "{} exists but rank {w}'s file is missing: W is the number \
                                     of rank files 0, 1, 2 ... so a gap would drop ranks",
                                    shown(r),
                                ),
                            ));
                        }
                    }
                }
                (w, (0..w).collect())
            }
        };
        let mut files: Vec<RankFile> = (0..world)
            .map(|r| RankFile {
                shown: shown(r),
                facts: None,
                opened: None,
                pass: None,
            })
            .collect();
        // Open and read every header first (cheap), then hash in parallel.
        let mut opened = Vec::new();
        for &r in &mine {
            let (file, stamp, all) = open_file(&files[r].shown, &resolve(r), format)?;
            opened.push((r, file, stamp, all));
        }
        let (reference, arenas) = match opened.first() {
            Some((r, _, _, all)) => (
                files[*r].shown.clone(),
                pick(all, tensors, &files[*r].shown)?,
            ),
            None => (String::new(), Vec::new()),
        };
        let arena_specs = arenas
            .iter()
            .map(|t| ArenaSpec {
                name: t.name.clone(),
                dtype: t.dtype,
                shape: t.shape.clone(),
                len: t.len,
            })
            .collect();
        for (r, file, stamp, all) in opened {
            let tensors = pick(&all, tensors, &files[r].shown)?;
            same_arenas(&tensors, &arenas, &files[r].shown, &reference)?;
            files[r].opened = Some(Arc::new(Opened {
                file,
                stamp,
                tensors,
            }));
        }
        Ok(AddendFiles {
            template: template.into(),
            base: base.to_path_buf(),
            format,
            arenas: arena_specs,
            files,
        })
    }

    pub fn template(&self) -> &str {
        &self.template
    }
    /// The template as a path that works from any directory.
    pub fn resolved_template(&self) -> String {
        if Path::new(&self.template).is_absolute() {
            self.template.clone()
        } else {
            self.base.join(&self.template).display().to_string()
        }
    }
    pub fn format(&self) -> Format {
        self.format
    }
    /// The ranks: one file each.
    pub fn world(&self) -> usize {
        self.files.len()
    }
    pub fn arenas(&self) -> &[ArenaSpec] {
        &self.arenas
    }
    /// Rank `rank`'s file as the experiment wrote it.
    pub fn path(&self, rank: usize) -> &str {
        &self.files[rank].shown
    }
    /// Rank `rank`'s file as a path that works from any directory (whether
    /// this process opened it or not).
    pub fn resolved_path(&self, rank: usize) -> PathBuf {
        let p = PathBuf::from(&self.files[rank].shown);
        if p.is_absolute() {
            p
        } else {
            self.base.join(p)
        }
    }
    /// Every file this process opened, read once in the background when
    /// all of them fit in a quarter of the memory left ([`pass`]: each
    /// block hashed after it is read, the bytes kept for the backends),
    /// else hashed here and read again later. Returns before the passes
    /// end: a read waits for its file's bytes, a digest for its hash, so
    /// hashing runs behind the backends' work. Until the digests are
    /// known the case key says `pending`.
    pub fn reading(&self) -> Result<AddendFiles, AddendError> {
        self.reading_beside(0)
    }

    /// [`Self::reading`] while `kept` bytes of other files are already
    /// being read into memory (their passes have not allocated them yet,
    /// so the memory left does not show them).
    pub fn reading_beside(&self, kept: u64) -> Result<AddendFiles, AddendError> {
        use rayon::prelude::*;
        let unread = |f: &RankFile| {
            f.opened
                .clone()
                .filter(|_| f.facts.is_none() && f.pass.is_none())
        };
        let total: u64 = self
            .files
            .iter()
            .filter_map(unread)
            .map(|o| o.stamp.size)
            .sum();
        let need = total.saturating_add(kept);
        let hold = crate::memory::available_memory().map_or(need <= 1 << 30, |m| need <= m / 4);
        let mut out = self.clone();
        if hold {
            let (at, inputs): (Vec<usize>, Vec<Arc<dyn pass::Input>>) = self
                .files
                .iter()
                .enumerate()
                .filter_map(|(r, f)| Some((r, unread(f)? as Arc<dyn pass::Input>)))
                .unzip();
            for (r, p) in at.into_iter().zip(pass::start(inputs)) {
                out.files[r].pass = Some(p);
            }
        } else {
            let facts: Vec<Option<FileFacts>> = self
                .files
                .par_iter()
                .map(|f| match unread(f) {
                    Some(o) => hash_file(&f.shown, &o.file, o.stamp).map(Some),
                    None => Ok(f.facts),
                })
                .collect::<Result<_, _>>()?;
            for (f, x) in out.files.iter_mut().zip(facts) {
                f.facts = x;
            }
        }
        Ok(out)
    }

    /// [`Self::reading`], then every digest waited for: a file whose read
    /// failed, or that changed before its read ended, is refused here.
    pub fn hashed(&self) -> Result<AddendFiles, AddendError> {
        let mut out = self.reading()?;
        for f in &mut out.files {
            if let (None, Some(p), Some(o)) = (f.facts, &f.pass, &f.opened) {
                let sha256 = p.digest().map_err(|e| pass_failed(&f.shown, e))?;
                f.facts = Some(FileFacts {
                    sha256,
                    bytes: o.stamp.size,
                });
            }
        }
        Ok(out)
    }

    /// Whether rank `rank`'s file was read in one pass and is read from
    /// the bytes kept then (waits for them).
    pub fn is_held(&self, rank: usize) -> bool {
        self.files
            .get(rank)
            .and_then(|f| f.pass.as_ref())
            .is_some_and(|p| p.bytes().is_ok())
    }

    /// Waits until rank `rank`'s file is read to its end and found
    /// unchanged: what was read of it while it was still being read (a
    /// streamed upload) is then the file's. A failed read is refused.
    pub fn read_through(&self, rank: usize) -> Result<(), AddendError> {
        match self.files.get(rank) {
            Some(f) => match &f.pass {
                Some(p) => p.bytes().map(|_| ()).map_err(|e| pass_failed(&f.shown, e)),
                None => Ok(()),
            },
            None => Ok(()),
        }
    }

    /// Bytes this set's passes keep in memory.
    pub fn kept_bytes(&self) -> u64 {
        self.files
            .iter()
            .filter(|f| f.pass.is_some())
            .filter_map(|f| f.opened.as_ref())
            .map(|o| o.stamp.size)
            .sum()
    }

    /// Whether every file this process opened is hashed, or being hashed.
    pub fn is_hashed(&self) -> bool {
        self.files
            .iter()
            .all(|f| f.opened.is_none() || f.facts.is_some() || f.pass.is_some())
    }

    /// Whether every rank file's digest is known here.
    pub fn is_complete(&self) -> bool {
        self.files.iter().all(|f| f.facts().is_some())
    }
    /// This process's own file's facts (the one it opened), if one.
    pub fn own_facts(&self) -> Option<FileFacts> {
        self.files
            .iter()
            .find(|f| f.opened.is_some())
            .and_then(RankFile::facts)
    }
    /// The file the arenas were read from, as written: the first this
    /// process opened (every other rank's holds the same arenas).
    pub fn reference_path(&self) -> &str {
        self.files
            .iter()
            .find(|f| f.opened.is_some())
            .map_or(&self.template, |f| &f.shown)
    }
    /// Whether rank `rank`'s file is open here.
    pub fn is_open(&self, rank: usize) -> bool {
        self.files.get(rank).is_some_and(|f| f.opened.is_some())
    }

    /// Everyone's digests known: `facts` in rank order (what the other
    /// ranks presented in the rendezvous). A file this process hashed must
    /// match what its rank presented.
    pub fn complete(&self, facts: &[FileFacts]) -> Result<AddendFiles, AddendError> {
        if facts.len() != self.files.len() {
            return Err(bad(
                &self.template,
                format!(
                    "{} rank files, but {} ranks presented theirs",
                    self.files.len(),
                    facts.len()
                ),
            ));
        }
        let mut out = self.clone();
        for (f, given) in out.files.iter_mut().zip(facts) {
            if let Some(mine) = f.facts() {
                if mine != *given {
                    return Err(bad(
                        &f.shown,
                        "its rank presented another digest than this process read",
                    ));
                }
            }
            f.facts = Some(*given);
        }
        Ok(out)
    }

    /// The identity the case key holds, once every digest is known.
    pub fn identity(&self) -> Option<Sha256> {
        let facts: Option<Vec<FileFacts>> = self.files.iter().map(RankFile::facts).collect();
        Some(identity(self.format, &self.arenas, &facts?))
    }

    /// The block a report records (digests not known here are zero: only
    /// a rank that does not report can hold an incomplete set).
    pub fn params(&self) -> AddendParams {
        let files = self
            .files
            .iter()
            .map(|f| {
                let facts = f.facts().unwrap_or(FileFacts {
                    sha256: Sha256::default(),
                    bytes: 0,
                });
                RankFileParams {
                    path: f.shown.clone(),
                    sha256: facts.sha256,
                    bytes: facts.bytes,
                }
            })
            .collect();
        AddendParams {
            template: self.template.clone(),
            format: self.format,
            arenas: self.arenas.clone(),
            files,
            identity: self.identity().unwrap_or_default(),
        }
    }

    /// What every rank must agree on before the first collective: the
    /// format and the arenas (each rank knows them from its own file).
    pub fn layout(&self) -> String {
        let arenas: Vec<String> = self
            .arenas
            .iter()
            .map(|a| {
                let shape: Vec<String> = a.shape.iter().map(|d| d.to_string()).collect();
                // Escaped as in the identity, `,` too: two layouts are
                // equal only when their arenas are.
                format!(
                    "{}:{}[{}]",
                    escaped(&a.name, &[',']),
                    a.dtype,
                    shape.join("x")
                )
            })
            .collect();
        format!("{} {}", self.format.name(), arenas.join(","))
    }

    /// `how` on rank `rank`'s file and tensor `arena`, once the file is
    /// found unchanged since it was hashed.
    /// With `elems`, only the bytes through element `elems` (exclusive)
    /// are waited for when the file is still being read.
    fn with_tensor<T>(
        &self,
        rank: usize,
        arena: usize,
        elems: Option<usize>,
        how: impl FnOnce(&dyn read::Source, &Tensor) -> std::io::Result<T>,
    ) -> Result<T, AddendError> {
        let f = &self.files[rank];
        let o = f.opened.as_deref().ok_or_else(|| AddendError::NotOpened {
            rank,
            path: f.shown.clone(),
        })?;
        let held = match &f.pass {
            Some(p) => Some(
                match (elems, o.tensors.get(arena)) {
                    // Only the bytes up to the last element read.
                    (Some(end), Some(t)) => p.upto(
                        t.offset
                            .saturating_add(end.saturating_mul(t.dtype.bytes()) as u64),
                    ),
                    _ => p.bytes(),
                }
                .map_err(|e| pass_failed(&f.shown, e))?,
            ),
            None => None,
        };
        let held = held.as_ref().map(|b| b as &dyn read::Source);
        o.read(&f.shown, arena, "before it was read", held, how)
    }

    /// Rank `rank`'s arena `arena`, widened to float32, into `dst` (whose
    /// length is the arena's).
    pub fn read(&self, rank: usize, arena: usize, dst: &mut [f32]) -> Result<(), AddendError> {
        self.with_tensor(rank, arena, None, |file, t| read::tensor(file, t, dst))
    }

    /// Elements `first .. first + dst.len()` of rank `rank`'s arena `arena`.
    pub fn read_range(
        &self,
        rank: usize,
        arena: usize,
        first: usize,
        dst: &mut [f32],
    ) -> Result<(), AddendError> {
        self.with_tensor(rank, arena, first.checked_add(dst.len()), |file, t| {
            read::range(file, t, first, dst)
        })
    }

    /// Elements `first .. first + dst.len()` of rank `rank`'s 16-bit arena
    /// `arena` as bit patterns, not widened: the bits [`Self::read_range`]'s
    /// values narrow to (a 16-bit case holds only tensors of its own dtype).
    pub fn read_bits16_range(
        &self,
        rank: usize,
        arena: usize,
        first: usize,
        dst: &mut [u16],
    ) -> Result<(), AddendError> {
        self.with_tensor(rank, arena, first.checked_add(dst.len()), |file, t| {
            read::range_bits16(file, t, first, dst)
        })
    }

    /// Rank `rank`'s float32 arena `arena` where the one pass keeps it, to
    /// be copied from as it lies (a device pins and reads these bytes in
    /// place), once the bytes through element `end` are read. `None` when
    /// the bytes are not kept as the arena's: no pass, or not little-endian
    /// float32 on a little-endian host. The file may still fail its read
    /// or change later: [`Self::read_through`] says so.
    pub fn kept_f32(
        &self,
        rank: usize,
        arena: usize,
        end: usize,
    ) -> Result<Option<Kept<'_>>, AddendError> {
        let f = &self.files[rank];
        let (Some(o), Some(p)) = (f.opened.as_deref(), f.pass.as_deref()) else {
            return Ok(None);
        };
        let Some(t) = o.tensors.get(arena) else {
            return Ok(None);
        };
        if t.dtype != Dtype::F32 || t.big_endian || cfg!(target_endian = "big") || end > t.len {
            return Ok(None);
        }
        o.unchanged(&f.shown, "before it was read")?;
        let through = t.offset.saturating_add(end as u64 * 4);
        let held = p.upto(through).map_err(|e| pass_failed(&f.shown, e))?;
        Ok(Some(Kept {
            bytes: held.prefix(),
            tensor: t.offset as usize,
        }))
    }

    /// Rank `rank`'s values of arena `arena` at `0, stride, 2 stride ...`
    /// (`picks` of them), for the order-sensitivity measure.
    pub fn sample(
        &self,
        rank: usize,
        arena: usize,
        stride: u64,
        picks: u64,
    ) -> Result<Vec<f32>, AddendError> {
        self.with_tensor(rank, arena, None, |file, t| {
            read::sample(file, t, stride, picks)
        })
    }
}

impl Opened {
    /// `how` on tensor `arena` of this file (`shown` as the experiment
    /// wrote it), refused if the file changed since it was hashed: checked
    /// before the read (`when` says at which step) and again after it, so
    /// bytes written during the read are never reported under the digest.
    /// `held`: the bytes the one pass kept, read instead of the file.
    fn read<T>(
        &self,
        shown: &str,
        arena: usize,
        when: &str,
        held: Option<&dyn read::Source>,
        how: impl FnOnce(&dyn read::Source, &Tensor) -> std::io::Result<T>,
    ) -> Result<T, AddendError> {
        self.unchanged(shown, when)?;
        let t = &self.tensors[arena];
        let read = match held {
            Some(bytes) => how(bytes, t),
            None => how(&self.file, t),
        };
        // A read cut short by a truncation is a change too, not an I/O error.
        self.unchanged(shown, "while it was read")?;
        read.map_err(|source| AddendError::Io {
            path: shown.into(),
            tensor: t.name.clone(),
            source,
        })
    }

    /// Refused unless the open file is as it was when hashed (device,
    /// inode, size, mtime and ctime to the nanosecond).
    fn unchanged(&self, shown: &str, when: &str) -> Result<(), AddendError> {
        let now = Stamp::of(&self.file).map_err(|e| bad(shown, e.to_string()))?;
        if now != self.stamp {
            return Err(AddendError::Changed {
                path: shown.into(),
                what: when.into(),
            });
        }
        Ok(())
    }
}

impl pass::Input for Opened {
    fn file(&self) -> &std::fs::File {
        &self.file
    }
    fn size(&self) -> u64 {
        self.stamp.size
    }
    fn unchanged(&self) -> Result<bool, String> {
        Ok(Stamp::of(&self.file).map_err(|e| e.to_string())? == self.stamp)
    }
}

/// Open one file of `format`: a regular file with a header foldprint reads.
fn open_file(
    shown: &str,
    path: &Path,
    format: Format,
) -> Result<(std::fs::File, Stamp, Vec<Tensor>), AddendError> {
    let (file, size) = crate::input::open_regular(path).map_err(|e| {
        bad(
            shown,
            match e.kind() {
                std::io::ErrorKind::NotFound => "not found".to_string(),
                _ => e.to_string(),
            },
        )
    })?;
    let stamp = Stamp::of(&file).map_err(|e| bad(shown, e.to_string()))?;
    let all = format::tensors(&file, size, format).map_err(|m| bad(shown, m))?;
    // The header read must be of the file that is then hashed and read.
    if Stamp::of(&file).map_err(|e| bad(shown, e.to_string()))? != stamp || stamp.size != size {
        return Err(AddendError::Changed {
            path: shown.into(),
            what: "while its header was read".into(),
        });
    }
    Ok((file, stamp, all))
}

/// The SHA-256 and size of an opened file, refused if it changed meanwhile.
fn hash_file(shown: &str, file: &std::fs::File, stamp: Stamp) -> Result<FileFacts, AddendError> {
    let sha256 =
        read::hash(file, stamp.size).map_err(|e| bad(shown, format!("cannot read it: {e}")))?;
    let now = Stamp::of(file).map_err(|e| bad(shown, e.to_string()))?;
    if now != stamp {
        return Err(AddendError::Changed {
            path: shown.into(),
            what: "while it was being hashed".into(),
        });
    }
    Ok(FileFacts {
        sha256,
        bytes: stamp.size,
    })
}

/// A framework's reduced result (`expect = "allreduced.safetensors"`):
/// one tensor per arena in the case's dtype, named as the arenas are,
/// compared bit for bit with the case's result.
#[derive(Debug)]
pub struct ExpectFile {
    shown: String,
    /// `shown` from any directory.
    resolved: PathBuf,
    facts: FileFacts,
    opened: Opened,
}

impl PartialEq for ExpectFile {
    fn eq(&self, other: &Self) -> bool {
        self.shown == other.shown && self.facts == other.facts
    }
}

impl ExpectFile {
    /// Open `written` (relative to `base`), holding the case's `arenas`
    /// in the case's `dtype` (a result is never widened or rounded to be
    /// compared: it is compared in the dtype the case reduced in).
    pub fn open(
        written: &str,
        base: &Path,
        arenas: &[ArenaSpec],
        dtype: Dtype,
    ) -> Result<ExpectFile, AddendError> {
        let format =
            Format::of(written).ok_or_else(|| bad(written, "name it `.safetensors` or `.npy`"))?;
        let p = PathBuf::from(written);
        let path = if p.is_absolute() { p } else { base.join(p) };
        let (file, stamp, all) = open_file(written, &path, format)?;
        let mut tensors = Vec::new();
        for a in arenas {
            let t = match format {
                Format::Npy => {
                    if arenas.len() != 1 {
                        return Err(bad(
                            written,
                            format!(
                                "an npy file holds one array, the case has {} arenas: use safetensors",
                                arenas.len()
                            ),
                        ));
                    }
                    all[0].clone()
                }
                Format::Safetensors => match all.iter().find(|t| t.name == a.name) {
                    Some(t) => t.clone(),
                    None => {
                        let have: Vec<&str> = all.iter().map(|t| t.name.as_str()).collect();
                        return Err(bad(
                            written,
                            format!("has no tensor `{}` (it has {})", a.name, list(&have)),
                        ));
                    }
                },
            };
            if t.dtype != dtype {
                return Err(bad(
                    written,
                    format!(
                        "tensor `{}` is {}, but the case reduces in {dtype}: a reduced result is \
                         compared in the case's dtype, bit for bit (set the case's dtype, or \
                         write the result in {dtype})",
                        t.name, t.dtype
                    ),
                ));
            }
            if t.len != a.len {
                return Err(bad(
                    written,
                    format!(
                        "tensor `{}` has {} elements, the arena {}",
                        t.name, t.len, a.len
                    ),
                ));
            }
            tensors.push(t);
        }
        let facts = hash_file(written, &file, stamp)?;
        Ok(ExpectFile {
            shown: written.into(),
            resolved: path,
            facts,
            opened: Opened {
                file,
                stamp,
                tensors,
            },
        })
    }

    /// As the experiment wrote it.
    pub fn path(&self) -> &str {
        &self.shown
    }
    /// As a path that works from any directory.
    pub fn resolved_path(&self) -> &Path {
        &self.resolved
    }
    pub fn facts(&self) -> FileFacts {
        self.facts
    }
    /// Whether it holds arenas of these lengths.
    pub fn matches(&self, lens: &[usize]) -> Result<(), String> {
        let have: Vec<usize> = self.opened.tensors.iter().map(|t| t.len).collect();
        if have == lens {
            Ok(())
        } else {
            Err(format!(
                "{} holds arenas of {have:?} elements, the case {lens:?}",
                self.shown
            ))
        }
    }
    /// The expected values of arena `arena`.
    pub fn read(&self, arena: usize) -> Result<Vec<f32>, AddendError> {
        let t = &self.opened.tensors[arena];
        let mut v = Vec::new();
        v.try_reserve_exact(t.len).map_err(|_| {
            bad(
                &self.shown,
                format!("out of memory reading tensor `{}`", t.name),
            )
        })?;
        v.resize(t.len, 0f32);
        self.opened.read(
            &self.shown,
            arena,
            "before it was compared",
            None,
            |file, t| read::tensor(file, t, &mut v),
        )?;
        Ok(v)
    }
}

/// The tensors `want` names (all, sorted by name, when it names none).
fn pick(all: &[Tensor], want: Option<&[String]>, shown: &str) -> Result<Vec<Tensor>, AddendError> {
    match want {
        None => Ok(all.to_vec()),
        Some(names) => {
            if names.is_empty() {
                return Err(bad(shown, "`tensors` is empty: name at least one tensor"));
            }
            let mut out = Vec::new();
            for (i, n) in names.iter().enumerate() {
                if names[..i].contains(n) {
                    return Err(bad(shown, format!("`tensors` names `{n}` twice")));
                }
                match all.iter().find(|t| &t.name == n) {
                    Some(t) => out.push(t.clone()),
                    None => {
                        let have: Vec<&str> = all.iter().map(|t| t.name.as_str()).collect();
                        return Err(bad(
                            shown,
                            format!("has no tensor `{n}` (it has {})", list(&have)),
                        ));
                    }
                }
            }
            Ok(out)
        }
    }
}

/// Ranks as runs: `ranks 0 ..= 3`, `ranks 0 ..= 2, 5`, `rank 4`.
fn rank_list(ranks: &[usize]) -> String {
    let mut runs: Vec<String> = Vec::new();
    let mut i = 0;
    while i < ranks.len() {
        let mut j = i;
        while j + 1 < ranks.len() && ranks[j + 1] == ranks[j] + 1 {
            j += 1;
        }
        runs.push(if j == i {
            ranks[i].to_string()
        } else {
            format!("{} ..= {}", ranks[i], ranks[j])
        });
        i = j + 1;
    }
    let plural = if ranks.len() == 1 { "rank" } else { "ranks" };
    format!("{plural} {}", runs.join(", "))
}

fn list(names: &[&str]) -> String {
    const SHOWN: usize = 8;
    let mut s: Vec<String> = names.iter().take(SHOWN).map(|n| format!("`{n}`")).collect();
    if names.len() > SHOWN {
        s.push(format!("and {} more", names.len() - SHOWN));
    }
    s.join(", ")
}

/// A rank file's arenas must be the reference file's: the same names,
/// element types and shapes (the order then follows from `pick`).
fn same_arenas(
    mine: &[Tensor],
    reference: &[Tensor],
    here: &str,
    ref_path: &str,
) -> Result<(), AddendError> {
    for t in mine {
        match reference.iter().find(|x| x.name == t.name) {
            None => {
                return Err(bad(
                    here,
                    format!("has tensor `{}`, which {ref_path} lacks", t.name),
                ))
            }
            Some(x) if x.dtype != t.dtype || x.shape != t.shape => {
                return Err(bad(
                    here,
                    format!(
                        "tensor `{}` is {}{:?} here but {}{:?} in {ref_path}",
                        t.name, t.dtype, t.shape, x.dtype, x.shape
                    ),
                ))
            }
            Some(_) => {}
        }
    }
    if let Some(x) = reference
        .iter()
        .find(|x| !mine.iter().any(|t| t.name == x.name))
    {
        return Err(bad(
            here,
            format!("lacks tensor `{}`, which {ref_path} has", x.name),
        ));
    }
    Ok(())
}

/// Test support: an npy 1.0 file of float32 values, for this module's
/// tests and the experiment loader's.
#[cfg(test)]
pub(crate) fn write_npy_f32(path: &Path, values: &[f32]) {
    let mut dict = format!(
        "{{'descr': '<f4', 'fortran_order': False, 'shape': ({},), }}",
        values.len()
    );
    while (10 + dict.len() + 1) % 64 != 0 {
        dict.push(' ');
    }
    dict.push('\n');
    let mut b = b"\x93NUMPY\x01\x00".to_vec();
    b.extend_from_slice(&(dict.len() as u16).to_le_bytes());
    b.extend_from_slice(dict.as_bytes());
    for v in values {
        b.extend_from_slice(&v.to_le_bytes());
    }
    std::fs::write(path, b).unwrap();
}

#[cfg(test)]
mod tests {
    use super::write_npy_f32 as npy;
    use super::*;

    /// Float16 bits widen as docs/SPEC.md defines, a signalling NaN's
    /// payload kept (it is not quieted on the way in), subnormals exact.
    #[test]
    fn float16_files_widen_exactly_nan_payloads_included() {
        let dir = tempfile::tempdir().unwrap();
        let bits: [u16; 4] = [0x7C01, 0xFE03, 0x0001, 0x3C00];
        let mut dict = "{'descr': '<f2', 'fortran_order': False, 'shape': (4,), }".to_string();
        while !(10 + dict.len() + 1).is_multiple_of(64) {
            dict.push(' ');
        }
        dict.push('\n');
        let mut b = b"\x93NUMPY\x01\x00".to_vec();
        b.extend_from_slice(&(dict.len() as u16).to_le_bytes());
        b.extend_from_slice(dict.as_bytes());
        for h in bits {
            b.extend_from_slice(&h.to_le_bytes());
        }
        std::fs::write(dir.path().join("h0.npy"), b).unwrap();
        let f = AddendFiles::open("h{rank}.npy", dir.path(), None, None, Scope::AllRanks)
            .unwrap()
            .hashed()
            .unwrap();
        assert_eq!(f.arenas()[0].dtype, Dtype::F16);
        let mut v = [0f32; 4];
        f.read(0, 0, &mut v).unwrap();
        assert_eq!(
            v.map(f32::to_bits),
            [0x7F80_2000, 0xFFC0_6000, 0x3380_0000, 0x3F80_0000]
        );
    }

    fn three(dir: &Path) {
        for r in 0..3 {
            npy(&dir.join(format!("r{r}.npy")), &[r as f32, 0.5, -2.0]);
        }
    }

    /// [`three`], opened and hashed.
    fn three_hashed(dir: &Path) -> AddendFiles {
        three(dir);
        AddendFiles::open("r{rank}.npy", dir, None, None, Scope::AllRanks)
            .unwrap()
            .hashed()
            .unwrap()
    }

    #[test]
    fn kept_float32_bytes_are_the_files_and_only_those_read() {
        let dir = tempfile::tempdir().unwrap();
        let f = three_hashed(dir.path());
        if cfg!(target_endian = "big") {
            // The stored little-endian bytes are not the arena's here.
            assert!(f.kept_f32(2, 0, 3).unwrap().is_none());
            return;
        }
        let k = f.kept_f32(2, 0, 3).unwrap().expect("kept by the pass");
        let file = std::fs::read(dir.path().join("r2.npy")).unwrap();
        assert_eq!(k.bytes, &file[..]);
        let vals: Vec<u32> = k.bytes[k.tensor..]
            .chunks_exact(4)
            .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect();
        assert_eq!(vals, [2.0f32, 0.5, -2.0].map(f32::to_bits));
        // Past the tensor's end: not the arena's bytes.
        assert!(f.kept_f32(2, 0, 4).unwrap().is_none());
        // Control: read without the pass (hashed, not kept), nothing is lent.
        let cold =
            AddendFiles::open("r{rank}.npy", dir.path(), None, None, Scope::AllRanks).unwrap();
        assert!(cold.kept_f32(2, 0, 3).unwrap().is_none());
        // A file changed since its opening lends nothing.
        npy_after_tick(&dir.path().join("r1.npy"), &[7.0, 0.5, -2.0]);
        let e = f.kept_f32(1, 0, 3).unwrap_err();
        assert!(matches!(e, AddendError::Changed { .. }), "{e}");
    }

    fn npy_after_tick(path: &Path, values: &[f32]) {
        std::thread::sleep(std::time::Duration::from_millis(20));
        npy(path, values);
    }

    #[test]
    fn a_file_changed_after_it_was_hashed_is_never_read() {
        let dir = tempfile::tempdir().unwrap();
        let f = three_hashed(dir.path());
        let mut v = [0f32; 3];
        f.read(1, 0, &mut v).unwrap();
        assert_eq!(v.map(f32::to_bits), [1.0f32, 0.5, -2.0].map(f32::to_bits));
        // Same size, other bytes, written after the hash.
        std::thread::sleep(std::time::Duration::from_millis(20));
        npy(&dir.path().join("r1.npy"), &[7.0, 0.5, -2.0]);
        let e = f.read(1, 0, &mut v).unwrap_err();
        assert!(
            matches!(&e, AddendError::Changed { path, .. } if path == "r1.npy"),
            "{e}"
        );
        // Control: rank 2's file, untouched, still reads.
        f.read(2, 0, &mut v).unwrap();
    }

    /// Overwrite `path`'s float32 values in place (same size, new mtime).
    fn scribble(path: &Path) {
        use std::os::unix::fs::FileExt;
        // Past the filesystem's timestamp tick, so the write shows in mtime.
        std::thread::sleep(std::time::Duration::from_millis(20));
        let f = std::fs::OpenOptions::new().write(true).open(path).unwrap();
        let len = f.metadata().unwrap().len();
        f.write_all_at(&7.0f32.to_le_bytes(), len - 12).unwrap();
    }

    #[test]
    fn bytes_written_while_a_file_is_read_are_never_reported() {
        let dir = tempfile::tempdir().unwrap();
        let f = three_hashed(dir.path());
        let o = f.files[1].opened.as_deref().unwrap();
        let read = |file: &dyn read::Source, t: &Tensor| -> std::io::Result<Vec<f32>> {
            let mut v = vec![0f32; t.len];
            read::tensor(file, t, &mut v)?;
            Ok(v)
        };
        // Control: nothing written, the read stands.
        let v = o
            .read("r1.npy", 0, "before it was read", None, read)
            .unwrap();
        assert_eq!(v, [1.0, 0.5, -2.0]);
        // A write landing after the check before the read, while it reads:
        // the values read may be the new ones, so they are refused.
        let path = dir.path().join("r1.npy");
        let e = o
            .read("r1.npy", 0, "before it was read", None, |file, t| {
                scribble(&path);
                read(file, t)
            })
            .unwrap_err();
        assert!(
            matches!(&e, AddendError::Changed { path, what } if path == "r1.npy" && what == "while it was read"),
            "{e}"
        );
        // The same for a framework's result (`expect`), through its reader.
        let arenas = f.arenas().to_vec();
        let expect = ExpectFile::open("r2.npy", dir.path(), &arenas, Dtype::F32).unwrap();
        assert_eq!(expect.read(0).unwrap(), [2.0, 0.5, -2.0]);
        let path = dir.path().join("r2.npy");
        let e = expect
            .opened
            .read("r2.npy", 0, "before it was compared", None, |file, t| {
                scribble(&path);
                read(file, t)
            })
            .unwrap_err();
        assert!(matches!(&e, AddendError::Changed { .. }), "{e}");
        assert!(matches!(expect.read(0), Err(AddendError::Changed { .. })));
    }

    /// The one pass: the digest is the SHA-256 of exactly the bytes the
    /// tensors are then read from, and a file changed between its opening
    /// and the end of its read is refused.
    #[test]
    fn one_pass_reads_what_it_hashed_and_refuses_a_file_changed_since_opening() {
        let dir = tempfile::tempdir().unwrap();
        let f = three_hashed(dir.path());
        for r in 0..3 {
            assert!(f.is_held(r), "rank {r}'s file read in one pass");
            let on_disk = std::fs::read(dir.path().join(format!("r{r}.npy"))).unwrap();
            let facts = f.files[r].facts().unwrap();
            assert_eq!(facts.sha256, Sha256::of(&on_disk));
            assert_eq!(facts.bytes, on_disk.len() as u64);
            let held = f.files[r].pass.as_ref().unwrap().bytes().unwrap();
            assert_eq!(held.to_vec(), on_disk);
            let mut v = [0f32; 3];
            f.read(r, 0, &mut v).unwrap();
            assert_eq!(v.map(f32::to_bits), [r as f32, 0.5, -2.0].map(f32::to_bits));
        }
        // Opened, then written before the pass: refused, never hashed.
        let opened =
            AddendFiles::open("r{rank}.npy", dir.path(), None, None, Scope::AllRanks).unwrap();
        scribble(&dir.path().join("r2.npy"));
        let e = opened.hashed().unwrap_err();
        assert!(
            matches!(&e, AddendError::Changed { path, .. } if path == "r2.npy"),
            "{e}"
        );
        // Control: opened after the write, the same files pass.
        let again = AddendFiles::open("r{rank}.npy", dir.path(), None, None, Scope::AllRanks)
            .unwrap()
            .hashed()
            .unwrap();
        assert_ne!(again.identity(), f.identity());
        // The bytes kept are all a read may see: a tensor past them is an
        // I/O error, not bytes from the file.
        let held: &[u8] = &[1, 2, 3];
        let mut buf = [0u8; 2];
        assert!(read::Source::fill_at(&held, &mut buf, 2).is_err());
        read::Source::fill_at(&held, &mut buf, 1).unwrap();
        assert_eq!(buf, [2, 3]);
    }

    /// Files that would not fit beside what other sets keep are hashed
    /// where they lie and read again later, not kept (control: with
    /// nothing else kept they are).
    #[test]
    fn a_set_that_would_not_fit_beside_the_others_is_not_kept() {
        let dir = tempfile::tempdir().unwrap();
        three(dir.path());
        let open =
            || AddendFiles::open("r{rank}.npy", dir.path(), None, None, Scope::AllRanks).unwrap();
        let kept = open().reading_beside(0).unwrap();
        assert!(kept.is_held(0) && kept.kept_bytes() > 0);
        let full = open().reading_beside(u64::MAX / 2).unwrap();
        assert!(!full.is_held(0) && full.kept_bytes() == 0 && full.is_complete());
        assert_eq!(full.identity(), kept.identity());
        let mut v = [0f32; 3];
        full.read(1, 0, &mut v).unwrap();
        assert_eq!(v.map(f32::to_bits), [1f32, 0.5, -2.0].map(f32::to_bits));
    }

    /// The 16-bit upload's bits are what narrowing the read values gives,
    /// on every pattern of both dtypes, across ranks and from an offset;
    /// the stored bytes alone differ on a signalling NaN (negative control).
    #[test]
    fn bits16_ranges_are_the_narrowed_values_on_every_pattern() {
        for (name, dtype) in [("BF16", Dtype::Bf16), ("F16", Dtype::F16)] {
            let dir = tempfile::tempdir().unwrap();
            let n = 1usize << 16;
            for r in 0..3u16 {
                let bytes: Vec<u8> = (0..n)
                    .flat_map(|h| (h as u16).wrapping_add(r * 7).to_le_bytes())
                    .collect();
                let mut header = format!(
                    "{{\"a\":{{\"dtype\":\"{name}\",\"shape\":[{n}],\"data_offsets\":[0,{}]}}}}",
                    bytes.len()
                );
                while header.len() % 8 != 0 {
                    header.push(' ');
                }
                let mut file = (header.len() as u64).to_le_bytes().to_vec();
                file.extend_from_slice(header.as_bytes());
                file.extend_from_slice(&bytes);
                std::fs::write(dir.path().join(format!("s{r}.safetensors")), file).unwrap();
            }
            let f = AddendFiles::open(
                "s{rank}.safetensors",
                dir.path(),
                None,
                None,
                Scope::AllRanks,
            )
            .unwrap()
            .hashed()
            .unwrap();
            for r in 0..3 {
                let first = 5 * r;
                let mut values = vec![0f32; n - first];
                f.read_range(r, 0, first, &mut values).unwrap();
                let mut bits = vec![0u16; n - first];
                f.read_bits16_range(r, 0, first, &mut bits).unwrap();
                for (k, (v, b)) in values.iter().zip(&bits).enumerate() {
                    assert_eq!(dtype.narrow(*v) as u16, *b, "{name} rank {r} element {k}");
                }
                let stored: Vec<u16> = (first..n)
                    .map(|h| (h as u16).wrapping_add(r as u16 * 7))
                    .collect();
                assert_ne!(stored, bits, "{name}: signalling NaNs are carried quiet");
            }
            // A float32 tensor has no 16-bit bits to give.
            let g = three_hashed(dir.path());
            assert!(g.read_bits16_range(0, 0, 0, &mut [0u16; 1]).is_err());
        }
    }

    #[test]
    fn a_rank_with_its_own_file_sees_files_past_the_world() {
        let dir = tempfile::tempdir().unwrap();
        three(dir.path());
        let own = |rank, world, declared: Option<usize>| {
            AddendFiles::open(
                "r{rank}.npy",
                dir.path(),
                None,
                declared.map(|w| WorldSize::new(w).unwrap()),
                Scope::OwnRank { rank, world },
            )
        };
        // Three files, two ranks launched: rank 2's file would be left out.
        let e = own(0, 2, None).unwrap_err().to_string();
        assert!(
            e.contains("W (the ranks launched) = 2, but 3 file(s) match it (ranks 0 ..= 2)"),
            "{e}"
        );
        let e = own(1, 3, Some(2)).unwrap_err().to_string();
        assert!(e.contains("world = 2, but 3 file(s)"), "{e}");
        // Control: the world the files give.
        assert!(own(1, 3, None).unwrap().is_open(1));
        assert!(own(0, 2, Some(3)).is_ok());
    }

    #[test]
    fn no_tensor_name_can_pass_for_another_arena() {
        let arena = |name: &str| ArenaSpec {
            name: name.into(),
            dtype: Dtype::F32,
            shape: vec![1],
            len: 1,
        };
        let files = [FileFacts {
            sha256: Sha256::of(b"x"),
            bytes: 4,
        }];
        let id = |names: &[&str]| {
            let arenas: Vec<ArenaSpec> = names.iter().map(|n| arena(n)).collect();
            identity(Format::Safetensors, &arenas, &files)
        };
        // Read unescaped, both are the lines of arenas p, q and r.
        let a = id(&["p\tf32\t1\t1\narena\tq", "r"]);
        let b = id(&["p", "q\tf32\t1\t1\narena\tr"]);
        assert_ne!(a, b);
        assert_eq!(a, id(&["p\tf32\t1\t1\narena\tq", "r"]));
        // A backslash is escaped too, so an escape cannot be spelt.
        assert_ne!(id(&["a\\tb"]), id(&["a\tb"]));
        // A plain name is itself: the identity of ordinary files is unchanged.
        let plain = "foldprint addends 1\nsafetensors\narena\tw.0\tf32\t1\t1\nfile\t";
        let text = format!("{plain}{}\t4\n", files[0].sha256);
        assert_eq!(id(&["w.0"]), Sha256::of(text.as_bytes()));
        // The layout every NCCL rank presents has one reading as well.
        let layout = |names: &[&str]| {
            let mut f = AddendFiles::open(
                "r{rank}.npy",
                Path::new("/"),
                None,
                Some(WorldSize::ONE),
                Scope::OwnRank { rank: 5, world: 1 },
            )
            .unwrap_or_else(|e| panic!("{e}"));
            f.arenas = names.iter().map(|n| arena(n)).collect();
            f.layout()
        };
        assert_ne!(layout(&["x:f32[1],y", "z"]), layout(&["x", "y:f32[1],z"]));
        assert_eq!(layout(&["w", "b"]), "npy w:f32[1],b:f32[1]");
    }

    #[test]
    fn a_rank_that_opened_only_its_own_file_learns_the_others_digests() {
        let dir = tempfile::tempdir().unwrap();
        three(dir.path());
        let all = AddendFiles::open("r{rank}.npy", dir.path(), None, None, Scope::AllRanks)
            .unwrap()
            .hashed()
            .unwrap();
        let own = Scope::OwnRank { rank: 1, world: 3 };
        let mine = AddendFiles::open("r{rank}.npy", dir.path(), None, None, own)
            .unwrap()
            .hashed()
            .unwrap();
        assert!(mine.is_open(1) && !mine.is_open(0) && !mine.is_open(2));
        assert!(!mine.is_complete() && mine.identity().is_none());
        assert_eq!(mine.own_facts(), all.files[1].facts());
        let facts: Vec<FileFacts> = all.files.iter().map(|f| f.facts().unwrap()).collect();
        let done = mine.complete(&facts).unwrap();
        assert_eq!(done.identity(), all.identity());
        assert!(done.identity().is_some());
        // A rank presenting another digest for the file this one read.
        let mut wrong = facts.clone();
        wrong[1].bytes += 1;
        assert!(mine.complete(&wrong).is_err());
        // Another rank's file cannot be read here.
        let mut v = [0f32; 3];
        assert!(matches!(
            mine.read(0, 0, &mut v),
            Err(AddendError::NotOpened { rank: 0, .. })
        ));
    }

    #[test]
    fn the_identity_follows_the_bytes_not_the_paths() {
        let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        three(a.path());
        three(b.path());
        let open = |d: &Path, t: &str| {
            AddendFiles::open(t, d, None, None, Scope::AllRanks)
                .unwrap()
                .hashed()
                .unwrap()
                .identity()
        };
        assert_eq!(open(a.path(), "r{rank}.npy"), open(b.path(), "r{rank}.npy"));
        npy(&b.path().join("r2.npy"), &[2.0, 0.5, -2.5]);
        assert_ne!(open(a.path(), "r{rank}.npy"), open(b.path(), "r{rank}.npy"));
    }
}
