//! Experiments: TOML files of defaults, explicit cases and sweeps, parsed
//! strictly (unknown keys rejected) and expanded into validated [`Case`]s.
//! Every error names the file, the line and column, and the field.

mod case;
mod order;
mod schema;

pub use case::{shard_lens, Addends, Case, CaseBuilder, CaseError, CaseParams, MAX_ROUNDS};
pub use order::DeliveryOrder;

use crate::addends::{AddendFiles, ExpectFile, Scope};
use crate::data::Distribution;
use crate::dtype::Dtype;
use crate::fold::{Collective, Contract};
use crate::world_size::WorldSize;
use schema::{RawCase, RawExperiment, RawParams, RawSweep};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use toml::Spanned;

/// Most cases one file may expand to.
pub const MAX_CASES: usize = 4096;
pub use crate::world_size::MAX_WORLD;
/// Largest addend volume of one case (W x total length x 4 bytes): 1 TiB.
pub const MAX_CASE_BYTES: u64 = 1 << 40;

/// A bad input file: unreadable, or wrong at a file:line:column. Both
/// experiment files and audit matrices report their problems with it.
#[derive(Debug, thiserror::Error)]
pub enum InputError {
    #[error("{path}: cannot read: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}:{line}:{column}: {message}")]
    Invalid {
        path: PathBuf,
        line: usize,
        column: usize,
        message: String,
    },
    #[error("{path}: {message}")]
    File { path: PathBuf, message: String },
}

impl InputError {
    /// An error at byte `offset` of `text`, the contents of `path`.
    pub(crate) fn at(path: &Path, text: &str, offset: usize, message: impl Into<String>) -> Self {
        let (line, column) = line_col(text, offset);
        InputError::Invalid {
            path: path.to_path_buf(),
            line,
            column,
            message: message.into(),
        }
    }
}

/// `addends`, `tensors` and `world` as a case gives them.
type RankFilesKey = (String, Option<Vec<String>>, Option<WorldSize>);

/// The rank files and expected results one experiment file names, each
/// opened (and hashed) once however many cases name it.
struct FileCache {
    base: PathBuf,
    scope: Scope,
    rank_files: HashMap<RankFilesKey, Arc<AddendFiles>>,
    expects: HashMap<(String, Vec<String>, Dtype), Arc<ExpectFile>>,
}

impl FileCache {
    fn new(experiment: &Path, scope: Scope) -> FileCache {
        let base = experiment
            .parent()
            .map(Path::to_path_buf)
            .unwrap_or_default();
        FileCache {
            base,
            scope,
            rank_files: HashMap::new(),
            expects: HashMap::new(),
        }
    }

    /// The one rank whose files this process holds (one process per rank).
    fn own_rank(&self) -> Option<usize> {
        match self.scope {
            Scope::AllRanks => None,
            Scope::OwnRank { rank, .. } => Some(rank),
        }
    }

    /// Whether this process writes the report (and so compares `expect`).
    fn reports(&self) -> bool {
        match self.scope {
            Scope::AllRanks => true,
            Scope::OwnRank { rank, .. } => rank == 0,
        }
    }

    fn rank_files(
        &mut self,
        template: &str,
        tensors: Option<&[String]>,
        world: Option<WorldSize>,
    ) -> Result<Arc<AddendFiles>, crate::addends::AddendError> {
        let key = (template.to_string(), tensors.map(<[String]>::to_vec), world);
        if let Some(f) = self.rank_files.get(&key) {
            return Ok(f.clone());
        }
        let f = Arc::new(AddendFiles::open(
            template, &self.base, tensors, world, self.scope,
        )?);
        self.rank_files.insert(key, f.clone());
        Ok(f)
    }

    fn expect(
        &mut self,
        path: &str,
        arenas: &[crate::addends::ArenaSpec],
        dtype: Dtype,
    ) -> Result<Arc<ExpectFile>, crate::addends::AddendError> {
        let key = (
            path.to_string(),
            arenas.iter().map(|a| a.name.clone()).collect(),
            dtype,
        );
        if let Some(f) = self.expects.get(&key) {
            return Ok(f.clone());
        }
        let f = Arc::new(ExpectFile::open(path, &self.base, arenas, dtype)?);
        self.expects.insert(key, f.clone());
        Ok(f)
    }
}

/// The experiments with every rank file this process opened hashed (each
/// set once, the sets one after another, each set's files in parallel).
/// Cases whose keys only the digests tell apart are checked again.
pub fn hash_rank_files(experiments: &[Experiment]) -> Result<Vec<Experiment>, InputError> {
    let out = with_rank_files(experiments, AddendFiles::hashed)?;
    for e in &out {
        unique_keys(&e.path, &e.cases)?;
    }
    Ok(out)
}

/// The experiments with every rank file this process opened being read
/// and hashed in the background ([`AddendFiles::reading`]): a backend
/// reads the bytes as soon as they are in, the digests are waited for
/// where a key is needed. Only an experiment with several sets of rank
/// files, whose cases' keys the digests may yet make equal, waits for its
/// digests here; [`rank_files_read`] names any file whose pass failed.
pub fn read_rank_files(experiments: &[Experiment]) -> Result<Vec<Experiment>, InputError> {
    // The sets are read side by side: each one's memory check counts what
    // the ones before it will keep.
    let mut kept = 0u64;
    let out = with_rank_files(experiments, |s| {
        let r = s.reading_beside(kept)?;
        kept = kept.saturating_add(r.kept_bytes());
        Ok(r)
    })?;
    for e in &out {
        if rank_file_sets(std::slice::from_ref(e)).len() > 1 {
            rank_files_read(std::slice::from_ref(e))?;
            unique_keys(&e.path, &e.cases)?;
        }
    }
    Ok(out)
}

/// Every background pass ended: the first rank file whose read failed or
/// that changed before its read ended, with its experiment.
pub fn rank_files_read(experiments: &[Experiment]) -> Result<(), InputError> {
    for s in rank_file_sets(experiments) {
        s.hashed().map_err(|e| in_experiment(experiments, &s, e))?;
    }
    Ok(())
}

/// An error of rank-file set `s`, said with the experiment file naming it.
fn in_experiment(
    experiments: &[Experiment],
    s: &Arc<AddendFiles>,
    e: crate::addends::AddendError,
) -> InputError {
    InputError::File {
        path: experiments
            .iter()
            .find(|x| {
                x.cases
                    .iter()
                    .filter_map(Case::files)
                    .any(|f| Arc::ptr_eq(f, s))
            })
            .map(|x| x.path.clone())
            .unwrap_or_default(),
        message: e.to_string(),
    }
}

/// `experiments` with each rank-file set not yet hashed passed through
/// `how` (one set after another).
fn with_rank_files(
    experiments: &[Experiment],
    mut how: impl FnMut(&AddendFiles) -> Result<AddendFiles, crate::addends::AddendError>,
) -> Result<Vec<Experiment>, InputError> {
    let sets = rank_file_sets(experiments);
    let mut done = Vec::with_capacity(sets.len());
    for s in &sets {
        done.push(if s.is_hashed() {
            s.clone()
        } else {
            Arc::new(how(s).map_err(|e| in_experiment(experiments, s, e))?)
        });
    }
    Ok(with_sets(experiments, &sets, &done))
}

/// `experiments` with each rank-file set of `old` replaced by the one at
/// the same place in `new`.
fn with_sets(
    experiments: &[Experiment],
    old: &[Arc<AddendFiles>],
    new: &[Arc<AddendFiles>],
) -> Vec<Experiment> {
    experiments
        .iter()
        .map(|e| {
            let mut e = e.clone();
            e.cases = e
                .cases
                .into_iter()
                .map(|c| match c.files() {
                    Some(f) => match old.iter().position(|s| Arc::ptr_eq(s, f)) {
                        Some(i) => c.with_files(new[i].clone()),
                        None => c,
                    },
                    None => c,
                })
                .collect();
            e
        })
        .collect()
}

/// Every distinct set of rank files the experiments name, in the order
/// they first appear: the order each NCCL rank presents its own file's
/// digest in the rendezvous.
pub fn rank_file_sets(experiments: &[Experiment]) -> Vec<Arc<AddendFiles>> {
    let mut sets: Vec<Arc<AddendFiles>> = Vec::new();
    for f in experiments
        .iter()
        .flat_map(|e| &e.cases)
        .filter_map(Case::files)
    {
        if !sets.iter().any(|s| Arc::ptr_eq(s, f)) {
            sets.push(f.clone());
        }
    }
    sets
}

/// Every file a run of `experiments` reads, each once, with what it is (for
/// a message): the experiment files, every rank's file of each set (opened
/// by this process or not) and the `expect` files. No output may be one.
pub fn input_files(experiments: &[Experiment]) -> Vec<(String, PathBuf)> {
    let mut out: Vec<(String, PathBuf)> = experiments
        .iter()
        .map(|e| ("the experiment".to_string(), e.path.clone()))
        .collect();
    for set in rank_file_sets(experiments) {
        for rank in 0..set.world() {
            out.push((format!("rank {rank}'s file"), set.resolved_path(rank)));
        }
    }
    let mut expects: Vec<&Arc<ExpectFile>> = Vec::new();
    for e in experiments.iter().flat_map(|e| &e.cases).flat_map(|c| {
        c.expect()
            .into_iter()
            .chain(c.expect_ranks())
            .chain(c.expect_own().map(|(_, f)| f))
    }) {
        if !expects.iter().any(|x| Arc::ptr_eq(x, e)) {
            expects.push(e);
            out.push((
                "the expect file".to_string(),
                e.resolved_path().to_path_buf(),
            ));
        }
    }
    out
}

/// The experiments with every rank file's digest known, from what each
/// rank presented in the rendezvous (`presented[rank]`: that rank's own
/// file of each set of [`rank_file_sets`], in that order).
pub fn complete_rank_files(
    experiments: &[Experiment],
    presented: &[Vec<Option<crate::addends::FileFacts>>],
) -> Result<Vec<Experiment>, crate::addends::AddendError> {
    let sets = rank_file_sets(experiments);
    let mut done: Vec<Arc<AddendFiles>> = Vec::with_capacity(sets.len());
    for (i, set) in sets.iter().enumerate() {
        if set.world() != presented.len() {
            // Its cases are not of this world and are skipped.
            done.push(set.clone());
            continue;
        }
        let mut facts = Vec::with_capacity(presented.len());
        for (rank, inputs) in presented.iter().enumerate() {
            match inputs.get(i).copied().flatten() {
                Some(f) => facts.push(f),
                None => {
                    return Err(crate::addends::AddendError::Bad {
                        path: set.path(rank).to_string(),
                        message: format!("rank {rank} presented no digest of its rank file"),
                    })
                }
            }
        }
        done.push(Arc::new(set.complete(&facts)?));
    }
    Ok(with_sets(experiments, &sets, &done))
}

/// A parsed, expanded, validated experiment file.
#[derive(Debug, Clone)]
pub struct Experiment {
    pub name: String,
    pub description: String,
    pub path: PathBuf,
    /// SHA-256 of the file's bytes: ties a report to the exact text.
    pub sha256: crate::digest::Sha256,
    pub cases: Vec<Case>,
}

/// 1-based line and column of a byte offset in `text` (for TOML spans).
pub(crate) fn line_col(text: &str, offset: usize) -> (usize, usize) {
    let offset = offset.min(text.len());
    let before = &text[..offset];
    let line = before.matches('\n').count() + 1;
    let column = before.rfind('\n').map_or(offset, |nl| offset - nl - 1) + 1;
    (line, column)
}

struct Source<'a> {
    path: &'a Path,
    text: &'a str,
}

impl Source<'_> {
    fn line_col(&self, offset: usize) -> (usize, usize) {
        line_col(self.text, offset)
    }

    fn at(&self, span: std::ops::Range<usize>, message: impl Into<String>) -> InputError {
        InputError::at(self.path, self.text, span.start, message)
    }
}

/// The key a value at byte `pos` belongs to: the nearest `key =` before it
/// on its line, or on an earlier line when the value spans several.
fn field_at(text: &str, pos: usize) -> Option<String> {
    let before = text.get(..pos.min(text.len()))?;
    for line in before.lines().rev().take(64) {
        let line = line.split('#').next().unwrap_or("");
        if let Some((key, _)) = line.split_once('=') {
            let key = key.trim().trim_matches('"');
            if !key.is_empty()
                && key
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || "_-.".contains(c))
            {
                return Some(key.to_string());
            }
        }
        let t = line.trim();
        if t.starts_with('[') && t.ends_with(']') && !t.contains(',') {
            return None; // a table header: the value is not under a key
        }
    }
    None
}

/// Whether a TOML/serde message already says which field it is about.
fn names_a_field(message: &str) -> bool {
    message.contains("field `") || message.contains("duplicate key")
}

/// "not valid UTF-8" with the line and column of the first bad byte.
fn utf8_error(path: &Path, bytes: &[u8], e: &std::str::Utf8Error) -> InputError {
    let (line, column, message) = utf8_where(bytes, e);
    InputError::Invalid {
        path: path.to_path_buf(),
        line,
        column,
        message,
    }
}

/// Line, column and description of the first invalid UTF-8 byte.
pub(crate) fn utf8_where(bytes: &[u8], e: &std::str::Utf8Error) -> (usize, usize, String) {
    let at = e.valid_up_to();
    // The valid prefix is text, so its lines and columns are meaningful.
    let text = std::str::from_utf8(&bytes[..at]).unwrap_or_default();
    let (line, column) = line_col(text, at);
    let message = format!("not valid UTF-8 (byte 0x{:02x} at offset {at})", bytes[at]);
    (line, column, message)
}

/// The text of an input file written by hand (an experiment or an audit
/// matrix): a regular file, capped in size, valid UTF-8.
pub(crate) fn read_text(path: &Path) -> Result<String, InputError> {
    let bytes =
        crate::input::read_capped(path, crate::input::MAX_EXPERIMENT_BYTES).map_err(|source| {
            InputError::Io {
                path: path.to_path_buf(),
                source,
            }
        })?;
    String::from_utf8(bytes).map_err(|e| utf8_error(path, e.as_bytes(), &e.utf8_error()))
}

/// Read and expand one experiment file, its rank files hashed.
pub fn load(path: &Path) -> Result<Experiment, InputError> {
    let exp = load_in(path, Scope::AllRanks)?;
    Ok(hash_rank_files(&[exp])?.remove(0))
}

/// [`load`], opening the rank files `scope` says, not hashing them yet.
pub fn load_in(path: &Path, scope: Scope) -> Result<Experiment, InputError> {
    let text = read_text(path)?;
    let mut exp = parse_in(path, &text, scope)?;
    exp.sha256 = crate::digest::Sha256::of(text.as_bytes());
    Ok(exp)
}

/// Expand paths (files, or directories of `*.toml`, not recursive) in
/// order, every rank file hashed.
pub fn load_all(paths: &[PathBuf]) -> Result<Vec<Experiment>, InputError> {
    hash_rank_files(&load_all_in(paths, Scope::AllRanks)?)
}

/// [`load_all`], opening the rank files `scope` says, not hashing them yet
/// ([`hash_rank_files`]: a run hashes them while its backend starts).
pub fn load_all_in(paths: &[PathBuf], scope: Scope) -> Result<Vec<Experiment>, InputError> {
    let mut files = Vec::new();
    for p in paths {
        if p.is_dir() {
            let entries = std::fs::read_dir(p).map_err(|source| InputError::Io {
                path: p.clone(),
                source,
            })?;
            let mut found: Vec<PathBuf> = entries
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|f| f.is_file() && f.extension().is_some_and(|x| x == "toml"))
                .collect();
            found.sort();
            if found.is_empty() {
                return Err(InputError::File {
                    path: p.clone(),
                    message: "directory holds no *.toml experiment files".into(),
                });
            }
            files.extend(found);
        } else {
            files.push(p.clone());
        }
    }
    let exps = files
        .iter()
        .map(|f| load_in(f, scope))
        .collect::<Result<Vec<_>, _>>()?;
    let mut names: HashMap<&str, &Path> = HashMap::new();
    for e in &exps {
        if let Some(prev) = names.insert(&e.name, &e.path) {
            return Err(InputError::File {
                path: e.path.clone(),
                message: format!(
                    "experiment name `{}` is also used by {}",
                    e.name,
                    prev.display()
                ),
            });
        }
    }
    Ok(exps)
}

/// Parse experiment text (`path` is only used in messages, and as the
/// place relative rank-file paths start from); every rank file is opened
/// and hashed.
pub fn parse(path: &Path, text: &str) -> Result<Experiment, InputError> {
    let exp = parse_in(path, text, Scope::AllRanks)?;
    Ok(hash_rank_files(&[exp])?.remove(0))
}

/// [`parse`], opening the rank files `scope` says, not hashing them yet
/// ([`hash_rank_files`]).
pub fn parse_in(path: &Path, text: &str, scope: Scope) -> Result<Experiment, InputError> {
    let src = Source { path, text };
    let mut files = FileCache::new(path, scope);
    let raw: RawExperiment = toml::from_str(text).map_err(|e| {
        let span = e.span().unwrap_or(0..0);
        let message = e.message().trim_end();
        // serde's type errors do not say which field; the key is on the line.
        // Only "unknown/missing/duplicate field `x`" already name it.
        let message = match field_at(text, span.start) {
            Some(key) if !names_a_field(message) => format!("field `{key}`: {message}"),
            _ => message.to_string(),
        };
        src.at(span, message)
    })?;
    let name = raw.name.get_ref().trim().to_string();
    if name.is_empty()
        || !name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
    {
        return Err(src.at(
            raw.name.span(),
            "field `name`: use letters, digits, '-', '_' or '.' (it names dump files and goldens)",
        ));
    }
    let base = raw
        .defaults
        .as_ref()
        .map(|d| RawParams::default().overlay(d))
        .unwrap_or_default();

    let mut cases = Vec::new();
    let mut ids: HashMap<String, std::ops::Range<usize>> = HashMap::new();
    let mut claim_id = |id: &str, span: std::ops::Range<usize>| -> Result<(), InputError> {
        if let Some(prev) = ids.get(id) {
            let (l, c) = src.line_col(prev.start);
            return Err(src.at(
                span,
                format!("duplicate case id `{id}` (first used at {l}:{c})"),
            ));
        }
        ids.insert(id.to_string(), span);
        Ok(())
    };

    for rc in &raw.cases {
        let id = rc.id.get_ref().clone();
        if id.trim().is_empty() {
            return Err(src.at(rc.id.span(), "field `id`: must not be empty"));
        }
        claim_id(&id, rc.id.span())?;
        let p = base.overlay(&rc.params);
        cases.push(build_case(&src, &mut files, &name, id, &p, rc.id.span())?);
    }

    let mut total = cases.len();
    for sw in &raw.sweeps {
        check_sweep_lists(&src, sw)?;
        let combos = sweep_size(sw);
        total = total.saturating_add(combos);
        if total > MAX_CASES {
            return Err(src.at(
                sw.id.span(),
                if total == combos {
                    format!(
                        "sweep `{}` expands to {combos} cases, over the cap of {MAX_CASES} cases per file",
                        sw.id.get_ref()
                    )
                } else {
                    format!(
                        "sweep `{}` expands to {combos} cases, which makes {total} in this file, \
                         over the cap of {MAX_CASES} cases per file",
                        sw.id.get_ref()
                    )
                },
            ));
        }
        for (suffix, over) in expand_sweep(sw) {
            let id = format!("{}{suffix}", sw.id.get_ref());
            claim_id(&id, sw.id.span())?;
            let p = base.overlay(&over);
            cases.push(build_case(&src, &mut files, &name, id, &p, sw.id.span())?);
        }
    }
    if cases.is_empty() {
        return Err(InputError::File {
            path: path.to_path_buf(),
            message: "declares no cases (add [[case]] or [[sweep]] tables)".into(),
        });
    }
    unique_keys(path, &cases)?;
    Ok(Experiment {
        name,
        description: raw.description.unwrap_or_default(),
        path: path.to_path_buf(),
        sha256: crate::digest::Sha256::of(text.as_bytes()),
        cases,
    })
}

/// Same numeric identity twice would make keys ambiguous in reports.
fn unique_keys(path: &Path, cases: &[Case]) -> Result<(), InputError> {
    let mut keys: HashMap<String, String> = HashMap::new();
    for c in cases {
        if let Some(prev) = keys.insert(c.key(), c.id().to_string()) {
            return Err(InputError::File {
                path: path.to_path_buf(),
                message: format!(
                    "cases `{prev}` and `{}` have identical parameters (case key {})",
                    c.id(),
                    c.key()
                ),
            });
        }
    }
    Ok(())
}

/// An empty sweep list would silently sweep nothing and make one case of
/// the defaults: name the key instead.
fn check_sweep_lists(src: &Source<'_>, sw: &RawSweep) -> Result<(), InputError> {
    let empty = sw
        .lists()
        .into_iter()
        .find_map(|(key, list)| list.filter(|(len, _)| *len == 0).map(|(_, at)| (key, at)));
    match empty {
        Some((key, at)) => Err(src.at(
            at,
            format!(
                "sweep `{}`: field `{key}`: empty list; list at least one value, or leave `{key}` out to use the default",
                sw.id.get_ref()
            ),
        )),
        None => Ok(()),
    }
}

fn sweep_size(sw: &RawSweep) -> usize {
    sw.lists()
        .into_iter()
        .map(|(_, list)| list.map_or(1, |(len, _)| len.max(1)))
        .fold(1usize, |a, b| a.saturating_mul(b))
}

/// Cartesian product of a sweep's lists, each combination as an overlay
/// plus an id suffix naming the swept values.
fn expand_sweep(sw: &RawSweep) -> Vec<(String, RawParams)> {
    sw.product()
        .into_iter()
        .map(|(labels, p)| {
            let suffix = if labels.is_empty() {
                String::new()
            } else {
                format!("[{}]", labels.join(","))
            };
            (suffix, p)
        })
        .collect()
}

fn build_case(
    src: &Source<'_>,
    files: &mut FileCache,
    experiment: &str,
    id: String,
    p: &RawParams,
    id_span: std::ops::Range<usize>,
) -> Result<Case, InputError> {
    let ctx = |what: &str| format!("case `{id}`: field `{what}`");
    let RawParams {
        world,
        arenas,
        order,
        seed,
        distribution,
        contract,
        mean,
        dtype,
        collective,
        rounds,
        addends,
        tensors,
        expect,
    } = p;
    let world = match world {
        None if addends.is_some() => None,
        None => {
            return Err(src.at(
                id_span,
                format!("{}: not set (set it here or in [defaults])", ctx("world")),
            ))
        }
        Some(w) => Some(
            WorldSize::try_from(*w.get_ref())
                .map_err(|e| src.at(w.span(), format!("{}: {e}", ctx("world"))))?,
        ),
    };
    // Rank files say W and the arenas; the generator's fields have no
    // meaning beside them.
    let rank_files = match addends {
        Some(t) => {
            let generator_fields = [
                ("arenas", arenas.as_ref().map(|a| a.span())),
                ("seed", seed.as_ref().map(|a| a.span())),
                ("distribution", distribution.as_ref().map(|a| a.span())),
            ];
            if let Some((field, Some(at))) = generator_fields.into_iter().find(|f| f.1.is_some()) {
                return Err(src.at(
                    at,
                    format!(
                        "{}: the addends come from the rank files (`addends`), which set the arenas; leave `{field}` out",
                        ctx(field)
                    ),
                ));
            }
            let names = tensors.as_ref().map(|t| t.get_ref().as_slice());
            Some(
                files
                    .rank_files(t.get_ref(), names, world)
                    .map_err(|e| src.at(t.span(), format!("{}: {e}", ctx("addends"))))?,
            )
        }
        None => {
            if let Some(t) = tensors {
                return Err(src.at(
                    t.span(),
                    format!(
                        "{}: picks tensors of rank files; set `addends` too",
                        ctx("tensors")
                    ),
                ));
            }
            None
        }
    };
    let collective = match collective {
        None => Collective::default(),
        Some(c) => c
            .get_ref()
            .parse()
            .map_err(|m| src.at(c.span(), format!("{}: {m}", ctx("collective"))))?,
    };
    let mut expect_ranks = Vec::new();
    let mut expect_own = None;
    let dtype = match dtype {
        None => None,
        Some(d) => Some(
            d.get_ref()
                .parse()
                .map_err(|m| src.at(d.span(), format!("{}: {m}", ctx("dtype"))))?,
        ),
    };
    // The dtype the result is in, known before `expect` is opened in it
    // (the builder resolves it again, to the same).
    let dtype_span = || {
        p.span("dtype")
            .or_else(|| p.span("addends"))
            .unwrap_or_else(|| id_span.clone())
    };
    let case_dtype = case::resolve_dtype(dtype, rank_files.as_deref())
        .map_err(|m| src.at(dtype_span(), format!("{}: {m}", ctx("dtype"))))?;
    let expect = match (expect, &rank_files) {
        (None, _) => None,
        (Some(e), None) => {
            return Err(src.at(
                e.span(),
                format!(
                    "{}: compares a framework's result of rank files; set `addends` too",
                    ctx("expect")
                ),
            ))
        }
        // Only the reporting rank compares one file (it may be on its host
        // alone); a file per rank is each rank's own (below).
        (Some(e), Some(_)) if !files.reports() && !e.get_ref().contains("{rank}") => None,
        (Some(e), Some(f)) if e.get_ref().contains("{rank}") => {
            if collective.is_all_reduce() {
                return Err(src.at(
                    e.span(),
                    format!(
                        "{}: `{{rank}}` names one file per rank, each holding its shard of a \
                         reduce-scatter; an all-reduce's result is one file (set collective = \
                         \"reduce-scatter\", or name one file)",
                        ctx("expect")
                    ),
                ));
            }
            let lens: Vec<usize> = f.arenas().iter().map(|a| a.len).collect();
            // One process per rank: each opens and checks its own shard's
            // file alone (the others' may be on their hosts only).
            let ranks: Vec<usize> = match files.own_rank() {
                Some(me) => vec![me],
                None => (0..f.world()).collect(),
            };
            for r in ranks {
                let shard: Vec<crate::addends::ArenaSpec> = f
                    .arenas()
                    .iter()
                    .zip(case::shard_lens(&lens, f.world(), r))
                    .map(|(a, len)| crate::addends::ArenaSpec {
                        name: a.name.clone(),
                        dtype: a.dtype,
                        shape: vec![len as u64],
                        len,
                    })
                    .collect();
                let path = e.get_ref().replace("{rank}", &r.to_string());
                let file = files.expect(&path, &shard, case_dtype).map_err(|m| {
                    src.at(
                        e.span(),
                        format!("{}: rank {r}'s shard: {m}", ctx("expect")),
                    )
                })?;
                match files.own_rank() {
                    Some(me) => expect_own = Some((me, file)),
                    None => expect_ranks.push(file),
                }
            }
            None
        }
        (Some(e), Some(f)) => Some(
            files
                .expect(e.get_ref(), f.arenas(), case_dtype)
                .map_err(|m| src.at(e.span(), format!("{}: {m}", ctx("expect"))))?,
        ),
    };
    // Rank files set W themselves (`CaseBuilder::files`).
    let world = world.map_or(1, WorldSize::get);
    let arenas = match arenas {
        None if rank_files.is_some() => Vec::new(),
        None => {
            return Err(src.at(
                id_span,
                format!("{}: not set (set it here or in [defaults])", ctx("arenas")),
            ))
        }
        Some(a) => {
            let mut lens = Vec::new();
            for &n in a.get_ref() {
                if n < 0 {
                    return Err(src.at(
                        a.span(),
                        format!("{}: length {n} is negative", ctx("arenas")),
                    ));
                }
                lens.push(usize::try_from(n).map_err(|_| {
                    src.at(
                        a.span(),
                        format!(
                            "{}: length {n} does not fit this machine's address space",
                            ctx("arenas")
                        ),
                    )
                })?);
            }
            lens
        }
    };
    let order = match order {
        None => DeliveryOrder::Ascending,
        Some(o) => o
            .get_ref()
            .to_order()
            .map_err(|m| src.at(o.span(), format!("{}: {m}", ctx("order"))))?,
    };
    let seed = match seed {
        None => 0,
        Some(s) if *s.get_ref() < 0 => {
            return Err(src.at(s.span(), format!("{}: must be >= 0", ctx("seed"))))
        }
        Some(s) => *s.get_ref() as u64,
    };
    let distribution = match distribution {
        None => Distribution::default(),
        Some(d) => d
            .get_ref()
            .parse()
            .map_err(|m| src.at(d.span(), format!("{}: {m}", ctx("distribution"))))?,
    };
    let contract = match contract {
        None => Contract::default(),
        Some(c) => c
            .get_ref()
            .parse()
            .map_err(|m| src.at(c.span(), format!("{}: {m}", ctx("contract"))))?,
    };
    let mean = mean.as_ref().is_some_and(|m| *m.get_ref());
    let rounds = match rounds {
        None => 1,
        Some(r) => {
            let v = *r.get_ref();
            if !(1..=MAX_ROUNDS as i64).contains(&v) {
                return Err(src.at(
                    r.span(),
                    format!("{}: must be 1 ..= {MAX_ROUNDS}, got {v}", ctx("rounds")),
                ));
            }
            v as u32
        }
    };
    // The builder holds every case to the limits (the arenas' size, the
    // order at this W ...); its error points at the field it names.
    let span_of = |field: &str| p.span(field).unwrap_or_else(|| id_span.clone());
    let ctx_id = id.clone();
    let builder = Case::builder(world, arenas);
    let builder = match rank_files {
        Some(f) => builder.files(f),
        None => builder.seed(seed).distribution(distribution),
    };
    builder
        .experiment(experiment)
        .id(id)
        .order(order)
        .contract(contract)
        .mean(mean)
        .dtype(dtype)
        .collective(collective)
        .rounds(rounds)
        .expect(expect)
        .expect_ranks(expect_ranks)
        .expect_own(expect_own)
        .build()
        .map_err(|e| src.at(span_of(e.field), format!("case `{ctx_id}`: {e}")))
}

/// Why [`to_toml`] could not write a case.
#[derive(Debug, thiserror::Error)]
pub enum WriteError {
    #[error("case `{id}`: {error}")]
    Case { id: String, error: CaseError },
    #[error("cannot write TOML: {0}")]
    Toml(#[from] toml::ser::Error),
}

/// An experiment file named `name` holding `cases`, each under its id,
/// every parameter written out (`expect` aside): [`parse`] reads it back
/// as the same cases, their keys and params equal. Serde writes it, from
/// the schema's own shapes.
pub fn to_toml(name: &str, cases: &[(String, &Case)]) -> Result<String, WriteError> {
    let cases = cases
        .iter()
        .map(|(id, case)| {
            Ok(RawCase {
                id: Spanned::new(0..0, id.clone()),
                params: case.to_raw().map_err(|error| WriteError::Case {
                    id: id.clone(),
                    error,
                })?,
            })
        })
        .collect::<Result<Vec<_>, WriteError>>()?;
    let raw = RawExperiment {
        name: Spanned::new(0..0, name.to_string()),
        description: None,
        defaults: None,
        cases,
        sweeps: Vec::new(),
    };
    Ok(toml::to_string(&raw)?)
}

#[cfg(test)]
mod own_rank_tests {
    use super::*;

    use crate::addends::write_npy_f32 as npy;

    /// Under one process per rank, a per-rank `expect` opens this rank's
    /// file alone (the others may live on other hosts): rank 1 loads while
    /// rank 2's file has the wrong length, which rank 2, and a process
    /// holding every rank, refuse (negative control).
    #[test]
    fn each_rank_opens_only_its_own_expect_file() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        std::fs::create_dir(d.join("out")).unwrap();
        for r in 0..3 {
            npy(&d.join(format!("r{r}.npy")), &[r as f32; 7]);
        }
        // Shards of 7 over 3 ranks: 3, 2, 2.
        for (r, len) in [3usize, 2, 2].into_iter().enumerate() {
            npy(&d.join(format!("out/e{r}.npy")), &vec![0.5; len]);
        }
        let exp = d.join("x.toml");
        std::fs::write(
            &exp,
            "name = \"x\"\n[[case]]\nid = \"c\"\naddends = \"r{rank}.npy\"\n\
             collective = \"reduce-scatter\"\nexpect = \"out/e{rank}.npy\"\n",
        )
        .unwrap();
        let load = |scope| load_all_in(std::slice::from_ref(&exp), scope);
        let own = |rank| Scope::OwnRank { rank, world: 3 };
        let all = load(Scope::AllRanks).unwrap();
        let c = &all[0].cases[0];
        assert_eq!(
            (c.expect_ranks().len(), c.expect_own().is_some()),
            (3, false)
        );
        let mine = load(own(1)).unwrap();
        let c = &mine[0].cases[0];
        assert!(c.expect_ranks().is_empty());
        let (r, f) = c.expect_own().unwrap();
        assert_eq!(r, 1);
        assert!(
            f.resolved_path().ends_with("out/e1.npy"),
            "{:?}",
            f.resolved_path()
        );
        npy(&d.join("out/e2.npy"), &[0.5; 3]);
        assert!(load(own(1)).is_ok());
        for scope in [own(2), Scope::AllRanks] {
            let e = load(scope).unwrap_err().to_string();
            assert!(e.contains("rank 2's shard"), "{e}");
        }
    }
}

#[cfg(test)]
mod background_pass_tests {
    use super::*;
    use crate::addends::write_npy_f32 as npy;

    fn experiment(d: &Path, cases: &str) -> Vec<Experiment> {
        for r in 0..3 {
            npy(&d.join(format!("r{r}.npy")), &[r as f32, 0.5, -2.0]);
            npy(&d.join(format!("s{r}.npy")), &[r as f32, 0.5, -2.0]);
        }
        let exp = d.join("x.toml");
        std::fs::write(&exp, format!("name = \"x\"\n{cases}")).unwrap();
        load_all_in(std::slice::from_ref(&exp), Scope::AllRanks).unwrap()
    }

    /// A run reads its rank files in the background: the keys come out as
    /// hashing them first gives, and a file written between its opening
    /// and its read is refused once the passes end, naming the experiment
    /// and the file (control: the same files left alone pass).
    #[test]
    fn a_file_changed_before_its_background_read_is_refused_with_its_experiment() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let one = "[[case]]\nid = \"c\"\naddends = \"r{rank}.npy\"\n";
        let loaded = experiment(d, one);
        let read = read_rank_files(&loaded).unwrap();
        rank_files_read(&read).unwrap();
        let hashed = hash_rank_files(&experiment(d, one)).unwrap();
        assert_eq!(read[0].cases[0].key(), hashed[0].cases[0].key());
        assert!(!read[0].cases[0].key().contains("pending"));

        let loaded = experiment(d, one);
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(d.join("r1.npy"))
            .unwrap();
        std::io::Write::write_all(&mut f, b"x").unwrap();
        let read = read_rank_files(&loaded).unwrap();
        let e = rank_files_read(&read).unwrap_err().to_string();
        assert!(
            e.contains("x.toml") && e.contains("r1.npy") && e.contains("changed"),
            "{e}"
        );
    }

    /// Two sets of files with the same bytes make two cases of one key:
    /// an experiment with several sets waits for its digests and refuses
    /// that, although the keys differed while pending.
    #[test]
    fn equal_files_under_two_names_are_one_key_even_read_in_the_background() {
        let dir = tempfile::tempdir().unwrap();
        let two = "[[case]]\nid = \"a\"\naddends = \"r{rank}.npy\"\n\
                   [[case]]\nid = \"b\"\naddends = \"s{rank}.npy\"\n";
        let e = read_rank_files(&experiment(dir.path(), two))
            .unwrap_err()
            .to_string();
        assert!(e.contains("identical parameters"), "{e}");
        // Control: different bytes under the second name.
        npy(&dir.path().join("s2.npy"), &[9.0, 0.5, -2.0]);
        let loaded = load_all_in(&[dir.path().join("x.toml")], Scope::AllRanks).unwrap();
        read_rank_files(&loaded).unwrap();
    }
}
