//! Invariance groups: cases that differ only in delivery order. Fixed-order
//! and pairwise-tree groups must agree; arrival-order groups must disagree
//! wherever the data can see the order (the negative control).

use super::CaseReport;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Group {
    pub key: String,
    pub contract: String,
    /// Case ids in the group, in run order.
    pub cases: Vec<String>,
    pub orders: Vec<String>,
    pub distinct_results: usize,
    /// `agree` or `disagree`.
    pub expect: String,
    /// `agree`, `disagree` or `inconclusive`.
    pub verdict: String,
    pub ok: bool,
    pub note: String,
}

/// Two fold sequences that differ only in their first two entries give the
/// same bits (a + b == b + a), so compare sequences with those sorted.
fn effective(seq: &[usize]) -> Vec<usize> {
    let mut s = seq.to_vec();
    if s.len() >= 2 && s[0] > s[1] {
        s.swap(0, 1);
    }
    s
}

pub fn build_groups(cases: &[CaseReport]) -> Vec<Group> {
    let mut by_key: BTreeMap<&str, Vec<&CaseReport>> = BTreeMap::new();
    for c in cases {
        by_key.entry(c.group.as_str()).or_default().push(c);
    }
    let mut groups = Vec::new();
    for (key, members) in by_key {
        let mut orders: Vec<&str> = members.iter().map(|c| c.params.order.as_str()).collect();
        orders.dedup();
        if orders.len() < 2 {
            continue;
        }
        let contract = members[0].params.contract.clone();
        let mut results: Vec<Vec<&str>> = members.iter().map(|c| c.digests()).collect();
        results.sort();
        results.dedup();
        let distinct = results.len();
        let verdict_seen = if distinct == 1 { "agree" } else { "disagree" };

        let (expect, verdict, ok, note) = if contract == "nccl-allreduce" {
            // NCCL ignores our delivery order; its sum is a control for
            // library settings, compared across runs, not across orders.
            ("n/a", verdict_seen, true, format!("{distinct} distinct result(s); NCCL's own sum is compared across NCCL settings, not orders"))
        } else if contract == "arrival-order" {
            let mut seqs: Vec<Vec<usize>> = members
                .iter()
                .map(|c| effective(&c.params.order_sequence))
                .collect();
            seqs.sort();
            seqs.dedup();
            let blind = members.iter().all(|c| c.sensitivity.verdict == "blind");
            if seqs.len() < 2 || blind {
                let why = if blind {
                    "the data cannot see reordering (sensitivity: blind)"
                } else {
                    "every order folds in the same effective sequence"
                };
                (
                    "disagree",
                    "inconclusive",
                    true,
                    format!("control cannot fail here: {why}"),
                )
            } else if distinct >= 2 {
                (
                    "disagree",
                    "disagree",
                    true,
                    format!(
                        "{distinct} distinct results across {} orders, as a working control should",
                        orders.len()
                    ),
                )
            } else {
                ("disagree", "agree", false, "arrival-order gave identical bits for different fold sequences: the harness is not seeing the order".into())
            }
        } else if distinct == 1 {
            (
                "agree",
                "agree",
                true,
                format!("identical across {} delivery orders", orders.len()),
            )
        } else {
            ("agree", verdict_seen, false, format!("{distinct} distinct results across {} delivery orders: delivery order changed the bits", orders.len()))
        };
        // Different spellings of one sequence (`ascending`, `rotate:0`,
        // `[0,1,2,3]`) are one order, not several: say so.
        let mut spellings: BTreeMap<&[usize], Vec<&str>> = BTreeMap::new();
        for c in &members {
            let names = spellings.entry(&c.params.order_sequence).or_default();
            if !names.contains(&c.params.order.as_str()) {
                names.push(&c.params.order);
            }
        }
        let mut note = note;
        for names in spellings.values().filter(|n| n.len() > 1) {
            note.push_str(&format!(
                "; {} are the same delivery sequence",
                names.join(" = ")
            ));
        }
        groups.push(Group {
            key: key.to_string(),
            contract,
            cases: members.iter().map(|c| c.id.clone()).collect(),
            orders: orders.iter().map(|s| s.to_string()).collect(),
            distinct_results: distinct,
            expect: expect.into(),
            verdict: verdict.into(),
            ok,
            note,
        });
    }
    groups
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::ReducedArena;
    use crate::data::Distribution;
    use crate::experiment::{Case, DeliveryOrder};
    use crate::fold::Contract;
    use crate::sensitivity::Sensitivity;

    fn report(contract: Contract, order: DeliveryOrder, digest: &str, verdict: &str) -> CaseReport {
        let case = Case {
            experiment: "e".into(),
            id: order.canonical(),
            world: 4,
            arenas: vec![10],
            order,
            seed: 1,
            distribution: Distribution::MixedMagnitude,
            contract,
            mean: false,
            rounds: 1,
        };
        let arena = ReducedArena {
            len: 10,
            rank_digests: vec![digest.into(); 4],
            chunks: vec![],
            values: None,
            differing: vec![],
        };
        let sens = Sensitivity {
            changed: 5,
            checked: 10,
            fraction: 0.5,
            sample: "every element".into(),
            verdict: verdict.into(),
        };
        CaseReport::new(&case, &[arena], vec![], true, sens)
    }

    #[test]
    fn fixed_order_group_fails_when_digests_differ() {
        let ok = build_groups(&[
            report(
                Contract::FixedOrder,
                DeliveryOrder::Ascending,
                "aa",
                "sensitive",
            ),
            report(
                Contract::FixedOrder,
                DeliveryOrder::Descending,
                "aa",
                "sensitive",
            ),
        ]);
        assert!(ok[0].ok);
        let bad = build_groups(&[
            report(
                Contract::FixedOrder,
                DeliveryOrder::Ascending,
                "aa",
                "sensitive",
            ),
            report(
                Contract::FixedOrder,
                DeliveryOrder::Descending,
                "bb",
                "sensitive",
            ),
        ]);
        assert!(!bad[0].ok);
        assert_eq!(bad[0].verdict, "disagree");
    }

    #[test]
    fn arrival_order_control_fails_when_it_cannot_see_order() {
        let bad = build_groups(&[
            report(
                Contract::ArrivalOrder,
                DeliveryOrder::Ascending,
                "aa",
                "sensitive",
            ),
            report(
                Contract::ArrivalOrder,
                DeliveryOrder::Descending,
                "aa",
                "sensitive",
            ),
        ]);
        assert!(
            !bad[0].ok,
            "identical bits for different sequences must fail"
        );
        let good = build_groups(&[
            report(
                Contract::ArrivalOrder,
                DeliveryOrder::Ascending,
                "aa",
                "sensitive",
            ),
            report(
                Contract::ArrivalOrder,
                DeliveryOrder::Descending,
                "bb",
                "sensitive",
            ),
        ]);
        assert!(good[0].ok);
        // Swapping only the first two sources is the same sum: inconclusive, not a failure.
        let commuted = build_groups(&[
            report(
                Contract::ArrivalOrder,
                DeliveryOrder::Ascending,
                "aa",
                "sensitive",
            ),
            report(
                Contract::ArrivalOrder,
                DeliveryOrder::Explicit(vec![1, 0, 2, 3]),
                "aa",
                "sensitive",
            ),
        ]);
        assert!(commuted[0].ok);
        assert_eq!(commuted[0].verdict, "inconclusive");
        let blind = build_groups(&[
            report(
                Contract::ArrivalOrder,
                DeliveryOrder::Ascending,
                "aa",
                "blind",
            ),
            report(
                Contract::ArrivalOrder,
                DeliveryOrder::Descending,
                "aa",
                "blind",
            ),
        ]);
        assert_eq!(blind[0].verdict, "inconclusive");
    }
}
