//! The raw TOML shapes, exactly as written; `deny_unknown_fields` so a typo
//! is an error rather than a silently ignored key.

use serde::Deserialize;
use toml::Spanned;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawExperiment {
    pub name: Spanned<String>,
    pub description: Option<String>,
    pub defaults: Option<RawParams>,
    #[serde(default, rename = "case")]
    pub cases: Vec<RawCase>,
    #[serde(default, rename = "sweep")]
    pub sweeps: Vec<RawSweep>,
}

/// Parameters as they may appear in `[defaults]`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawParams {
    pub world: Option<Spanned<i64>>,
    pub arenas: Option<Spanned<Vec<i64>>>,
    pub order: Option<Spanned<RawOrder>>,
    pub seed: Option<Spanned<i64>>,
    pub distribution: Option<Spanned<String>>,
    pub contract: Option<Spanned<String>>,
    pub mean: Option<Spanned<bool>>,
    pub rounds: Option<Spanned<i64>>,
    pub addends: Option<Spanned<String>>,
    pub tensors: Option<Spanned<Vec<String>>>,
    pub expect: Option<Spanned<String>>,
}

impl RawParams {
    /// `over`'s values where set, else ours.
    pub fn overlay(&self, over: &RawParams) -> RawParams {
        fn pick<T: Clone>(over: &Option<T>, base: &Option<T>) -> Option<T> {
            over.clone().or_else(|| base.clone())
        }
        let RawParams {
            world,
            arenas,
            order,
            seed,
            distribution,
            contract,
            mean,
            rounds,
            addends,
            tensors,
            expect,
        } = over;
        RawParams {
            world: pick(world, &self.world),
            arenas: pick(arenas, &self.arenas),
            order: pick(order, &self.order),
            seed: pick(seed, &self.seed),
            distribution: pick(distribution, &self.distribution),
            contract: pick(contract, &self.contract),
            mean: pick(mean, &self.mean),
            rounds: pick(rounds, &self.rounds),
            addends: pick(addends, &self.addends),
            tensors: pick(tensors, &self.tensors),
            expect: pick(expect, &self.expect),
        }
    }
}

/// `[[case]]`: an id plus any parameter (serde cannot combine `flatten`
/// with `deny_unknown_fields`, hence the conversion below).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawCaseFields {
    pub id: Spanned<String>,
    pub world: Option<Spanned<i64>>,
    pub arenas: Option<Spanned<Vec<i64>>>,
    pub order: Option<Spanned<RawOrder>>,
    pub seed: Option<Spanned<i64>>,
    pub distribution: Option<Spanned<String>>,
    pub contract: Option<Spanned<String>>,
    pub mean: Option<Spanned<bool>>,
    pub rounds: Option<Spanned<i64>>,
    pub addends: Option<Spanned<String>>,
    pub tensors: Option<Spanned<Vec<String>>>,
    pub expect: Option<Spanned<String>>,
}

#[derive(Debug, Deserialize)]
#[serde(from = "RawCaseFields")]
pub struct RawCase {
    pub id: Spanned<String>,
    pub params: RawParams,
}

impl From<RawCaseFields> for RawCase {
    fn from(f: RawCaseFields) -> Self {
        let RawCaseFields {
            id,
            world,
            arenas,
            order,
            seed,
            distribution,
            contract,
            mean,
            rounds,
            addends,
            tensors,
            expect,
        } = f;
        RawCase {
            id,
            params: RawParams {
                world,
                arenas,
                order,
                seed,
                distribution,
                contract,
                mean,
                rounds,
                addends,
                tensors,
                expect,
            },
        }
    }
}

/// `[[sweep]]`: every parameter is a list; the cases are their product.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawSweep {
    pub id: Spanned<String>,
    pub world: Option<Spanned<Vec<i64>>>,
    pub arenas: Option<Spanned<Vec<Vec<i64>>>>,
    pub order: Option<Spanned<Vec<RawOrder>>>,
    pub seed: Option<Spanned<Vec<i64>>>,
    pub distribution: Option<Spanned<Vec<String>>>,
    pub contract: Option<Spanned<Vec<String>>>,
    pub mean: Option<Spanned<Vec<bool>>>,
    /// Not swept: one value for every case of the sweep.
    pub rounds: Option<Spanned<i64>>,
    /// Not swept: the same rank files for every case of the sweep.
    pub addends: Option<Spanned<String>>,
    pub tensors: Option<Spanned<Vec<String>>>,
    pub expect: Option<Spanned<String>>,
}

/// `"descending"`, `"rotate:3"` ... or an explicit permutation `[2, 0, 1]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(
    untagged,
    expecting = "expected a delivery order: a string such as \"descending\", \"rotate:3\", \"shuffle:7\", or an array of ranks"
)]
pub enum RawOrder {
    Named(String),
    Permutation(Vec<i64>),
}

impl RawOrder {
    pub fn to_order(&self) -> Result<super::DeliveryOrder, String> {
        match self {
            RawOrder::Named(s) => super::DeliveryOrder::parse(s),
            RawOrder::Permutation(p) => {
                let mut ranks = Vec::with_capacity(p.len());
                for &r in p {
                    if r < 0 {
                        return Err(format!("permutation {p:?} has a negative rank {r}"));
                    }
                    ranks.push(r as usize);
                }
                Ok(super::DeliveryOrder::Explicit(ranks))
            }
        }
    }

    pub fn show(&self) -> String {
        match self {
            RawOrder::Named(s) => s.clone(),
            RawOrder::Permutation(p) => {
                let items: Vec<String> = p.iter().map(|r| r.to_string()).collect();
                format!("[{}]", items.join(" "))
            }
        }
    }
}
