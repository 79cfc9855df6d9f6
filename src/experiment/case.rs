//! A validated case: everything a backend needs, nothing about the machine.

use super::order::DeliveryOrder;
use super::schema::{RawOrder, RawParams};
use super::MAX_CASE_BYTES;
use crate::addends::{AddendFiles, AddendParams, ExpectFile};
use crate::data::Distribution;
use crate::dtype::Dtype;
use crate::fold::{shard_plan, Collective, Contract};
use crate::world_size::WorldSize;
use serde::Serialize;
use std::sync::Arc;
use toml::Spanned;

/// Where a case's addends come from.
#[derive(Debug, Clone, PartialEq)]
pub enum Addends {
    /// The generator's values (docs/SPEC.md, "Addends").
    Generated {
        seed: u64,
        distribution: Distribution,
    },
    /// One file per rank (`addends = "grads/rank{rank}.safetensors"`).
    Files(Arc<AddendFiles>),
}

/// A case that is valid by construction: its fields are private, and it is
/// made by [`CaseBuilder::build`], which holds it to the limits an
/// experiment file is (W a [`WorldSize`], at least one arena, at most
/// [`MAX_CASE_BYTES`] of addends, an order valid at W, 1..=1000 rounds), or
/// derived from a valid case by the `with_*` methods, which keep them.
/// Backends never re-check them.
#[derive(Debug, Clone, PartialEq)]
pub struct Case {
    world: WorldSize,
    fields: Fields,
}

/// A case's fields but W, as [`CaseBuilder`] collects them and [`Case`]
/// holds them once checked (W is a plain number in the one, a
/// [`WorldSize`] in the other).
#[derive(Debug, Clone, PartialEq)]
struct Fields {
    /// Name of the experiment that declared it.
    experiment: String,
    /// Human id, unique within the experiment.
    id: String,
    /// One length per arena (e.g. a gradient lane and a small head lane).
    arenas: Vec<usize>,
    order: DeliveryOrder,
    addends: Addends,
    contract: Contract,
    /// Multiply the sum by the rounded reciprocal 1/W.
    mean: bool,
    /// The element type: as declared in a builder (`None`: the rank
    /// files', else f32), resolved in a built case.
    dtype: Option<Dtype>,
    /// What each rank ends with: the whole arena, or its own shard.
    collective: Collective,
    /// Independent repetitions; every round must give the same bits.
    rounds: u32,
    /// A framework's reduced result to compare with this case's.
    expect: Option<Arc<ExpectFile>>,
    /// A reduce-scatter's result as one file per rank (`{rank}` in
    /// `expect`), rank order, each holding that rank's shard.
    expect_ranks: Vec<Arc<ExpectFile>>,
    /// Under one process per rank, this process's rank and its own file of
    /// a per-rank `expect` (in place of `expect_ranks`): each rank checks
    /// its own shard.
    expect_own: Option<(usize, Arc<ExpectFile>)>,
}

/// Most rounds a case may ask for.
pub const MAX_ROUNDS: u32 = 1000;

/// Why [`CaseBuilder::build`] refused: the field and the problem, in the
/// words experiment files get (the experiment loader adds file:line:column).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("field `{field}`: {message}")]
pub struct CaseError {
    pub field: &'static str,
    pub message: String,
}

/// The parameters of a [`Case`] being made. Unset ones take the defaults
/// experiment files have: ascending order, seed 0, the default
/// distribution and contract, a sum, one round.
#[derive(Debug, Clone)]
pub struct CaseBuilder {
    world: usize,
    fields: Fields,
}

impl CaseBuilder {
    pub fn experiment(mut self, name: impl Into<String>) -> Self {
        self.fields.experiment = name.into();
        self
    }
    pub fn id(mut self, id: impl Into<String>) -> Self {
        self.fields.id = id.into();
        self
    }
    pub fn world(mut self, world: usize) -> Self {
        self.world = world;
        self
    }
    pub fn arenas(mut self, arenas: impl Into<Vec<usize>>) -> Self {
        self.fields.arenas = arenas.into();
        self
    }
    pub fn order(mut self, order: DeliveryOrder) -> Self {
        self.fields.order = order;
        self
    }
    /// Generated addends of this seed (and the distribution set or kept).
    pub fn seed(mut self, seed: u64) -> Self {
        let distribution = match self.fields.addends {
            Addends::Generated { distribution, .. } => distribution,
            Addends::Files(_) => Distribution::default(),
        };
        self.fields.addends = Addends::Generated { seed, distribution };
        self
    }
    /// Generated addends of this distribution (and the seed set or kept).
    pub fn distribution(mut self, distribution: Distribution) -> Self {
        let seed = match self.fields.addends {
            Addends::Generated { seed, .. } => seed,
            Addends::Files(_) => 0,
        };
        self.fields.addends = Addends::Generated { seed, distribution };
        self
    }
    /// Addends read from these rank files; they set W and the arenas.
    pub fn files(mut self, files: Arc<AddendFiles>) -> Self {
        self.world = files.world();
        self.fields.arenas = files.arenas().iter().map(|a| a.len).collect();
        self.fields.addends = Addends::Files(files);
        self
    }
    pub fn expect(mut self, expect: Option<Arc<ExpectFile>>) -> Self {
        self.fields.expect = expect;
        self
    }
    /// A reduce-scatter's expected shards, one file per rank in rank order.
    pub fn expect_ranks(mut self, files: Vec<Arc<ExpectFile>>) -> Self {
        self.fields.expect_ranks = files;
        self
    }
    /// This process's rank's own expected shard (one process per rank).
    pub fn expect_own(mut self, own: Option<(usize, Arc<ExpectFile>)>) -> Self {
        self.fields.expect_own = own;
        self
    }
    pub fn contract(mut self, contract: Contract) -> Self {
        self.fields.contract = contract;
        self
    }
    pub fn mean(mut self, mean: bool) -> Self {
        self.fields.mean = mean;
        self
    }
    /// The dtype declared, or `None` to follow the rank files (f32 for
    /// generated addends).
    pub fn dtype(mut self, dtype: Option<Dtype>) -> Self {
        self.fields.dtype = dtype;
        self
    }
    pub fn rounds(mut self, rounds: u32) -> Self {
        self.fields.rounds = rounds;
        self
    }
    pub fn collective(mut self, collective: Collective) -> Self {
        self.fields.collective = collective;
        self
    }

    /// The case, or the first limit it breaks.
    pub fn build(self) -> Result<Case, CaseError> {
        let CaseBuilder { world, mut fields } = self;
        let files = match &fields.addends {
            Addends::Files(f) => Some(&**f),
            Addends::Generated { .. } => None,
        };
        fields.dtype = match resolve_dtype(fields.dtype, files) {
            Ok(d) => Some(d),
            Err(m) => {
                return Err(CaseError {
                    field: "dtype",
                    message: m,
                })
            }
        };
        let bad = |field, message: String| Err(CaseError { field, message });
        let world = match WorldSize::new(world) {
            Ok(w) => w,
            Err(e) => return bad("world", e.to_string()),
        };
        let Fields {
            arenas,
            order,
            addends,
            rounds,
            expect,
            expect_ranks,
            expect_own,
            collective,
            ..
        } = &fields;
        if arenas.is_empty() {
            return bad("arenas", "needs at least one arena length".into());
        }
        let total = arenas.iter().fold(0u64, |s, &n| s.saturating_add(n as u64));
        let bytes = total.saturating_mul(world.get() as u64).saturating_mul(4);
        if bytes > MAX_CASE_BYTES {
            return bad(
                "arenas",
                format!(
                    "W = {world} x {total} elements x 4 bytes = {bytes} bytes of addends \
                     cannot fit in memory (cap {MAX_CASE_BYTES})"
                ),
            );
        }
        if let Err(m) = order.validate(world.get()) {
            return bad("order", m);
        }
        if !(1..=MAX_ROUNDS).contains(rounds) {
            return bad(
                "rounds",
                format!("must be 1 ..= {MAX_ROUNDS}, got {rounds}"),
            );
        }
        // The one place a case's W meets its rank files' (the files were
        // held to a declared W against the disk when they were opened).
        if let Addends::Files(f) = addends {
            let lens: Vec<usize> = f.arenas().iter().map(|a| a.len).collect();
            if f.world() != world.get() || lens != *arenas {
                return bad(
                    "addends",
                    format!(
                        "the rank files hold W = {} ranks of arenas {lens:?}, the case has W = {world} and {arenas:?}",
                        f.world()
                    ),
                );
            }
        }
        if let Some(e) = expect {
            if let Err(m) = e.matches(arenas) {
                return bad("expect", m);
            }
        }
        if !expect_ranks.is_empty() {
            if collective.is_all_reduce() {
                return bad(
                    "expect",
                    "one file per rank holds a reduce-scatter's shards; an all-reduce is compared \
                     with one file"
                        .into(),
                );
            }
            if expect_ranks.len() != world.get() {
                return bad(
                    "expect",
                    format!("{} files for W = {world} ranks", expect_ranks.len()),
                );
            }
            for (r, e) in expect_ranks.iter().enumerate() {
                if let Err(m) = e.matches(&shard_lens(arenas, world.get(), r)) {
                    return bad("expect", format!("rank {r}'s shard: {m}"));
                }
            }
        }
        if let Some((r, e)) = expect_own {
            if collective.is_all_reduce() || !expect_ranks.is_empty() || *r >= world.get() {
                return bad(
                    "expect",
                    format!("rank {r}'s own file needs a reduce-scatter of W > {r} and no other per-rank files"),
                );
            }
            if let Err(m) = e.matches(&shard_lens(arenas, world.get(), *r)) {
                return bad("expect", format!("rank {r}'s shard: {m}"));
            }
        }
        Ok(Case { world, fields })
    }
}

impl Case {
    /// A case of `world` ranks and these arena lengths, the rest defaults.
    pub fn builder(world: usize, arenas: impl Into<Vec<usize>>) -> CaseBuilder {
        CaseBuilder {
            world,
            fields: Fields {
                experiment: String::new(),
                id: String::new(),
                arenas: arenas.into(),
                order: DeliveryOrder::Ascending,
                addends: Addends::Generated {
                    seed: 0,
                    distribution: Distribution::default(),
                },
                contract: Contract::default(),
                mean: false,
                dtype: None,
                collective: Collective::default(),
                rounds: 1,
                expect: None,
                expect_ranks: Vec::new(),
                expect_own: None,
            },
        }
    }

    /// This case's parameters as a builder, to make a variant of it.
    pub fn to_builder(&self) -> CaseBuilder {
        CaseBuilder {
            world: self.world.get(),
            fields: self.fields.clone(),
        }
    }

    /// The same case under another contract (no limit depends on it).
    pub fn with_contract(mut self, contract: Contract) -> Case {
        self.fields.contract = contract;
        self
    }
    /// The same case with other addends (no limit depends on them).
    pub fn with_data(mut self, seed: u64, distribution: Distribution) -> Case {
        self.fields.addends = Addends::Generated { seed, distribution };
        self
    }
    /// The same case with every rank file's digest known
    /// (`AddendFiles::hashed`, `AddendFiles::complete`: the same files,
    /// hence the same W and arenas). Only the library swaps them, so a
    /// `Case` outside it is one `CaseBuilder::build` made.
    pub(crate) fn with_files(mut self, files: Arc<AddendFiles>) -> Case {
        debug_assert_eq!(files.world(), self.world());
        self.fields.addends = Addends::Files(files);
        self
    }
    /// The same case run once.
    pub fn single_round(mut self) -> Case {
        self.fields.rounds = 1;
        self
    }
    /// The same case in another delivery order, if it is one at this W.
    pub fn with_order(mut self, order: DeliveryOrder) -> Result<Case, CaseError> {
        order.validate(self.world()).map_err(|message| CaseError {
            field: "order",
            message,
        })?;
        self.fields.order = order;
        Ok(self)
    }

    pub fn experiment(&self) -> &str {
        &self.fields.experiment
    }
    pub fn id(&self) -> &str {
        &self.fields.id
    }
    pub fn world(&self) -> usize {
        self.world.get()
    }
    pub fn world_size(&self) -> WorldSize {
        self.world
    }
    pub fn arenas(&self) -> &[usize] {
        &self.fields.arenas
    }
    pub fn order(&self) -> &DeliveryOrder {
        &self.fields.order
    }
    pub fn addends(&self) -> &Addends {
        &self.fields.addends
    }
    /// The rank files, when the addends come from files.
    pub fn files(&self) -> Option<&Arc<AddendFiles>> {
        match &self.fields.addends {
            Addends::Files(f) => Some(f),
            Addends::Generated { .. } => None,
        }
    }
    pub fn expect(&self) -> Option<&Arc<ExpectFile>> {
        self.fields.expect.as_ref()
    }
    /// A reduce-scatter's expected shards, one file per rank (rank order);
    /// empty when there are none.
    pub fn expect_ranks(&self) -> &[Arc<ExpectFile>] {
        &self.fields.expect_ranks
    }
    /// This process's rank and its own expected shard, under one process
    /// per rank (its shard is compared on the rank that holds it).
    pub fn expect_own(&self) -> Option<(usize, &Arc<ExpectFile>)> {
        self.fields.expect_own.as_ref().map(|(r, f)| (*r, f))
    }
    pub fn contract(&self) -> Contract {
        self.fields.contract
    }
    pub fn mean(&self) -> bool {
        self.fields.mean
    }
    /// The element type the case reduces in (addends, result, digests).
    pub fn dtype(&self) -> Dtype {
        self.fields.dtype.unwrap_or_default()
    }
    pub fn rounds(&self) -> u32 {
        self.fields.rounds
    }
    pub fn collective(&self) -> Collective {
        self.fields.collective
    }

    /// Stable identifier derived from the numeric parameters only (never the
    /// experiment name, rounds or environment), so reports from different
    /// machines and files line up. See [`CaseParams::key`].
    pub fn key(&self) -> String {
        self.params().key()
    }

    /// The key with delivery order left out: cases sharing it form an
    /// invariance group.
    pub fn group_key(&self) -> String {
        self.params().group_key()
    }

    pub fn total_len(&self) -> u64 {
        self.fields.arenas.iter().map(|&n| n as u64).sum()
    }

    /// Bytes of addends across all ranks and arenas.
    pub fn addend_bytes(&self) -> u64 {
        self.world() as u64 * self.total_len() * 4
    }

    /// This case's parameters as an experiment file writes them: the
    /// experiment loader's `build_case` run backwards, so they read back
    /// as the same case (its key and params). `expect` is left out: it
    /// judges a result, it is not a parameter of the sum.
    pub(super) fn to_raw(&self) -> Result<RawParams, CaseError> {
        fn given<T>(value: T) -> Option<Spanned<T>> {
            Some(Spanned::new(0..0, value))
        }
        let int = |field: &'static str, v: u64| {
            i64::try_from(v).map_err(|_| CaseError {
                field,
                message: format!("{v} is past the largest TOML integer"),
            })
        };
        // Every field named, so a new parameter is a compile error here.
        let CaseParams {
            world,
            arenas,
            order: _,          // written from the order itself, below
            order_sequence: _, // follows from order and world
            seed: _,           // from the case's addends, below
            distribution: _,   // likewise
            contract,
            mean,
            dtype: _, // below: f32 too where rank files are, which may be 16-bit
            collective,
            rounds,
            addends: _, // likewise
        } = self.params();
        let order = match self.order() {
            DeliveryOrder::Explicit(p) => RawOrder::Permutation(
                p.iter()
                    .map(|&r| int("order", r as u64))
                    .collect::<Result<_, _>>()?,
            ),
            named => RawOrder::Named(named.canonical()),
        };
        let (arenas, seed, distribution, addends, tensors) = match self.addends() {
            Addends::Generated { seed, distribution } => (
                given(
                    arenas
                        .iter()
                        .map(|&n| int("arenas", n as u64))
                        .collect::<Result<_, _>>()?,
                ),
                given(int("seed", *seed)?),
                given(distribution.name().to_string()),
                None,
                None,
            ),
            // The same files, wherever the experiment is written.
            Addends::Files(f) => {
                let tensors = match f.format() {
                    crate::addends::Format::Safetensors => {
                        given(f.arenas().iter().map(|a| a.name.clone()).collect())
                    }
                    crate::addends::Format::Npy => None,
                };
                (None, None, None, given(f.resolved_template()), tensors)
            }
        };
        Ok(RawParams {
            world: given(int("world", world as u64)?),
            arenas,
            order: given(order),
            seed,
            distribution,
            contract: given(contract.name().to_string()),
            mean: given(mean),
            // Generated f32 cases are written as before the dtypes.
            dtype: (self.files().is_some() || !self.dtype().is_f32())
                .then(|| Spanned::new(0..0, self.dtype().name().to_string())),
            // Left out for all-reduce, so an audit's files read as before.
            collective: collective.map(|c| Spanned::new(0..0, c.name().to_string())),
            rounds: given(rounds.into()),
            addends,
            tensors,
            expect: None,
        })
    }

    pub fn params(&self) -> CaseParams {
        let Case { world, fields } = self;
        let Fields {
            experiment: _,
            id: _,
            arenas,
            order,
            addends,
            contract,
            mean,
            dtype: _, // resolved by `Case::dtype`
            collective,
            rounds,
            expect: _, // judged in the report, not a parameter of the sum
            expect_ranks: _,
            expect_own: _,
        } = fields;
        let (seed, distribution, files) = match addends {
            Addends::Generated { seed, distribution } => (Some(*seed), Some(*distribution), None),
            Addends::Files(f) => (None, None, Some(f.params())),
        };
        CaseParams {
            world: world.get(),
            arenas: arenas.clone(),
            order: order.canonical(),
            order_sequence: order.sequence(world.get()),
            seed,
            distribution,
            contract: *contract,
            mean: *mean,
            dtype: (!self.dtype().is_f32()).then_some(self.dtype()),
            collective: (!collective.is_all_reduce()).then_some(*collective),
            rounds: *rounds,
            addends: files,
        }
    }
}

/// The parameter block written into reports. The distribution and the
/// contract are written by name (`mixed-magnitude`, `fixed-order`), as in
/// experiment files and case keys.
#[derive(Debug, Clone, Serialize, serde::Deserialize, PartialEq)]
pub struct CaseParams {
    pub world: usize,
    pub arenas: Vec<usize>,
    pub order: String,
    pub order_sequence: Vec<usize>,
    /// The generator's seed and distribution; absent when the addends
    /// come from files.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seed: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub distribution: Option<Distribution>,
    pub contract: Contract,
    pub mean: bool,
    /// The element type; absent for f32, so f32 reports read as before.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dtype: Option<Dtype>,
    /// What each rank ends with; absent for all-reduce, so all-reduce
    /// reports read as before.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub collective: Option<Collective>,
    pub rounds: u32,
    /// The rank files, when the addends come from files.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub addends: Option<AddendParams>,
}

impl CaseParams {
    /// The invariance group: every numeric parameter but the delivery order
    /// (docs/SPEC.md, "Case key"). The one place the key is spelt, for
    /// cases being run and for reports being checked alike.
    pub fn group_key(&self) -> String {
        // Every field named: a new parameter must be put in the key, or
        // left out of it here on purpose.
        let CaseParams {
            world,
            arenas,
            order: _,          // the case key adds it
            order_sequence: _, // follows from order and world
            seed,
            distribution,
            contract,
            mean,
            dtype,
            collective,
            rounds: _, // repetitions, not numeric identity
            addends,
        } = self;
        let lens: Vec<String> = arenas.iter().map(|n| n.to_string()).collect();
        // The inputs: the generator's, or the files' identity (their
        // digests, never their paths).
        let inputs = match (addends, seed, distribution) {
            // Not hashed yet (or other ranks' files not known yet): the
            // files as named, until the digests replace them.
            (Some(f), _, _) if f.identity == crate::digest::Sha256::default() => {
                let names: Vec<&str> = f.arenas.iter().map(|a| a.name.as_str()).collect();
                format!("files:pending:{}:{}", f.template, names.join(","))
            }
            (Some(f), _, _) => format!("files:{}", f.identity.short(16)),
            (None, seed, distribution) => format!(
                "{}/s{}",
                distribution.unwrap_or_default(),
                seed.unwrap_or_default()
            ),
        };
        // f32 is left out, so every f32 key reads as before the dtypes.
        let dtype = match dtype {
            Some(d) if !d.is_f32() => format!("/{d}"),
            _ => String::new(),
        };
        // All-reduce is left out, so every all-reduce key reads as before.
        let collective = match collective {
            Some(c) if !c.is_all_reduce() => format!("/{c}"),
            _ => String::new(),
        };
        format!(
            "{}{}/{}/W{}/n{}{}/{}",
            contract,
            collective,
            if *mean { "mean" } else { "sum" },
            world,
            lens.join("+"),
            dtype,
            inputs
        )
    }

    /// The case key: the group and the canonical delivery order.
    pub fn key(&self) -> String {
        format!("{}/{}", self.group_key(), self.order)
    }

    /// A builder of the case these parameters describe, delivered in
    /// `order` (what `self.order` names, parsed by the caller). Rank files
    /// are not at hand where a report is read: their case is a generated
    /// one of the same W and arenas, which is all its limits and its
    /// sensitivity sample depend on.
    pub fn builder(&self, order: DeliveryOrder) -> CaseBuilder {
        // Every field named: a new parameter must be read back here too.
        let CaseParams {
            world,
            arenas,
            order: _,          // parsed by the caller
            order_sequence: _, // follows from order and world
            seed,
            distribution,
            contract,
            mean,
            dtype,
            collective,
            rounds,
            addends: _, // a generated case of the same shape, above
        } = self;
        Case::builder(*world, arenas.clone())
            .order(order)
            .seed(seed.unwrap_or_default())
            .distribution(distribution.unwrap_or_default())
            .contract(*contract)
            .mean(*mean)
            .dtype(Some(dtype.unwrap_or_default()))
            .collective(collective.unwrap_or_default())
            .rounds(*rounds)
    }
}

/// Rank `rank`'s shard length of each arena (docs/SPEC.md §2).
pub fn shard_lens(arenas: &[usize], world: usize, rank: usize) -> Vec<usize> {
    arenas
        .iter()
        .map(|&n| shard_plan(n, world).map_or(0, |p| p.get(rank).map_or(0, |s| s.len)))
        .collect()
}

/// The dtype a case reduces in: the declared one, held to the rank files
/// (a file is widened to f32 exactly, never rounded to a narrower type),
/// or else the files' own, which must agree; f32 for generated addends.
/// A refusal names the file the arenas were read from and the tensor.
pub(super) fn resolve_dtype(
    declared: Option<Dtype>,
    files: Option<&AddendFiles>,
) -> Result<Dtype, String> {
    let Some(f) = files else {
        return Ok(declared.unwrap_or_default());
    };
    let file = f.reference_path();
    let mut stored: Vec<(Dtype, &str)> = Vec::new();
    for a in f.arenas() {
        if !stored.iter().any(|(d, _)| *d == a.dtype) {
            stored.push((a.dtype, &a.name));
        }
    }
    match declared {
        Some(Dtype::F32) => Ok(Dtype::F32),
        Some(d) => match stored.iter().find(|(s, _)| *s != d) {
            None => Ok(d),
            Some((s, name)) => {
                let instead = if s.is_f32() {
                    "set dtype = \"f32\" to reduce in float32".to_string()
                } else {
                    format!("set dtype = \"{s}\", or \"f32\" to widen every tensor exactly")
                };
                Err(format!(
                    "{d}, but tensor `{name}` of {file} is {s}: foldprint never rounds an addend ({instead})"
                ))
            }
        },
        None => match stored.as_slice() {
            [] => Ok(Dtype::F32),
            [(d, _)] => Ok(*d),
            [(a, an), (b, bn), ..] => Err(format!(
                "not set, and the tensors of {file} mix dtypes (`{an}` is {a}, `{bn}` is {b}); \
                 set dtype = \"f32\" to widen every tensor exactly, or pick tensors of one dtype \
                 with `tensors`"
            )),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::world_size::MAX_WORLD;

    #[test]
    fn the_builder_holds_every_case_to_the_limits() {
        let ok = Case::builder(3, [7, 0]).build().unwrap();
        assert_eq!((ok.world(), ok.arenas(), ok.rounds()), (3, &[7, 0][..], 1));
        let refused = |b: CaseBuilder, field: &str| {
            let e = b.build().unwrap_err();
            assert_eq!(e.field, field, "{e}");
        };
        refused(Case::builder(0, [1]), "world");
        refused(Case::builder(MAX_WORLD + 1, [1]), "world");
        refused(Case::builder(2, []), "arenas");
        refused(Case::builder(4, [1 << 38]), "arenas");
        refused(
            Case::builder(3, [1]).order(DeliveryOrder::Explicit(vec![1, 0])),
            "order",
        );
        refused(Case::builder(3, [1]).rounds(0), "rounds");
        refused(Case::builder(3, [1]).rounds(MAX_ROUNDS + 1), "rounds");
        // A variant is held to them too.
        assert!(ok
            .clone()
            .with_order(DeliveryOrder::Explicit(vec![0, 1]))
            .is_err());
        assert!(ok.to_builder().world(2).build().is_ok());
    }

    #[test]
    fn a_written_case_names_its_dtype_only_where_it_is_not_the_default() {
        let f32 = Case::builder(3, [5]).build().unwrap();
        let bf16 = f32.to_builder().dtype(Some(Dtype::Bf16)).build().unwrap();
        let cases = [("a".to_string(), &f32), ("b".to_string(), &bf16)];
        let text = super::super::to_toml("x", &cases).unwrap();
        // f32 cases are written as they were before the dtypes.
        assert_eq!(text.matches("dtype").count(), 1, "{text}");
        assert!(text.contains("dtype = \"bf16\""), "{text}");
        let back = super::super::parse(std::path::Path::new("x.toml"), &text).unwrap();
        let keys: Vec<String> = back.cases.iter().map(Case::key).collect();
        assert_eq!(keys, [f32.key(), bf16.key()]);
        assert!(keys[1].contains("/n5/bf16/"), "{}", keys[1]);
    }

    #[test]
    fn a_case_written_as_toml_names_what_toml_cannot_hold() {
        let big = Case::builder(2, [1]).seed(u64::MAX).build().unwrap();
        let e = big.to_raw().unwrap_err();
        assert_eq!(e.field, "seed", "{e}");
        // Control: the largest seed a TOML integer holds is written.
        let fits = big.with_data(i64::MAX as u64, Distribution::default());
        assert_eq!(*fits.to_raw().unwrap().seed.unwrap().get_ref(), i64::MAX);
    }
}
