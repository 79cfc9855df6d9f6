//! A validated case: everything a backend needs, nothing about the machine.

use super::order::DeliveryOrder;
use crate::data::Distribution;
use crate::fold::Contract;
use serde::Serialize;

#[derive(Debug, Clone, PartialEq)]
pub struct Case {
    /// Name of the experiment that declared it.
    pub experiment: String,
    /// Human id, unique within the experiment.
    pub id: String,
    pub world: usize,
    /// One length per arena (e.g. a gradient lane and a small head lane).
    pub arenas: Vec<usize>,
    pub order: DeliveryOrder,
    pub seed: u64,
    pub distribution: Distribution,
    pub contract: Contract,
    /// Multiply the sum by the rounded reciprocal 1/W.
    pub mean: bool,
    /// Independent repetitions; every round must give the same bits.
    pub rounds: u32,
}

impl Case {
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
        self.arenas.iter().map(|&n| n as u64).sum()
    }

    /// Bytes of addends across all ranks and arenas.
    pub fn addend_bytes(&self) -> u64 {
        self.world as u64 * self.total_len() * 4
    }

    pub fn params(&self) -> CaseParams {
        let Case {
            experiment: _,
            id: _,
            world,
            arenas,
            order,
            seed,
            distribution,
            contract,
            mean,
            rounds,
        } = self;
        CaseParams {
            world: *world,
            arenas: arenas.clone(),
            order: order.canonical(),
            order_sequence: order.sequence(*world),
            seed: *seed,
            distribution: *distribution,
            contract: *contract,
            mean: *mean,
            rounds: *rounds,
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
    pub seed: u64,
    pub distribution: Distribution,
    pub contract: Contract,
    pub mean: bool,
    pub rounds: u32,
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
            rounds: _, // repetitions, not numeric identity
        } = self;
        let lens: Vec<String> = arenas.iter().map(|n| n.to_string()).collect();
        format!(
            "{}/{}/W{}/n{}/{}/s{}",
            contract,
            if *mean { "mean" } else { "sum" },
            world,
            lens.join("+"),
            distribution,
            seed
        )
    }

    /// The case key: the group and the canonical delivery order.
    pub fn key(&self) -> String {
        format!("{}/{}", self.group_key(), self.order)
    }
}
