//! Invariance groups: cases that differ only in delivery order. Fixed-order
//! and pairwise-tree groups must agree; arrival-order groups must disagree
//! wherever the data can see the order (the negative control).

use super::CaseReport;
use crate::fold::{Contract, OrderRole};
use crate::sensitivity::Verdict;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Group {
    pub key: String,
    pub contract: Contract,
    /// Case ids in the group, in run order.
    pub cases: Vec<String>,
    pub orders: Vec<String>,
    pub distinct_results: usize,
    pub expect: Expect,
    pub verdict: GroupVerdict,
    pub ok: bool,
    pub note: String,
}

/// What a group's delivery orders should do to its bits, by contract. In
/// reports: `agree`, `disagree` or `n/a`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Expect {
    /// Every order gives the same bits (the contract ignores delivery order).
    Agree,
    /// Orders that fold in different sequences give different bits (a
    /// negative control that must see the order).
    Disagree,
    /// Delivery order is not the question (NCCL's own sum is compared
    /// across NCCL settings, not across orders).
    #[serde(rename = "n/a")]
    NotApplicable,
}

impl Expect {
    /// What the contract's groups should show.
    pub const fn of(contract: Contract) -> Expect {
        match contract.order_role() {
            OrderRole::Invariant => Expect::Agree,
            OrderRole::Changes => Expect::Disagree,
            // NCCL ignores our delivery order.
            OrderRole::Ignored => Expect::NotApplicable,
        }
    }

    /// The word a report uses for it.
    pub const fn name(self) -> &'static str {
        match self {
            Expect::Agree => "agree",
            Expect::Disagree => "disagree",
            Expect::NotApplicable => "n/a",
        }
    }
}

/// What a group's results showed. In reports: `agree`, `disagree` or
/// `inconclusive`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum GroupVerdict {
    /// One result across every order.
    Agree,
    /// Two or more results.
    Disagree,
    /// A control that could not fail here: blind data, or orders that all
    /// fold in the same effective sequence.
    Inconclusive,
}

impl GroupVerdict {
    /// The word a report uses for it.
    pub const fn name(self) -> &'static str {
        match self {
            GroupVerdict::Agree => "agree",
            GroupVerdict::Disagree => "disagree",
            GroupVerdict::Inconclusive => "inconclusive",
        }
    }
}

impl std::fmt::Display for Expect {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.pad(self.name())
    }
}

impl std::fmt::Display for GroupVerdict {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.pad(self.name())
    }
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
        let contract = members[0].params.contract;
        let mut results: Vec<Vec<crate::digest::Sha256>> =
            members.iter().map(|c| c.digests()).collect();
        results.sort();
        results.dedup();
        let distinct = results.len();
        let seen = if distinct == 1 {
            GroupVerdict::Agree
        } else {
            GroupVerdict::Disagree
        };
        let expect = Expect::of(contract);
        let (verdict, ok, note) = match expect {
            // NCCL ignores our delivery order; its sum is a control for
            // library settings, compared across runs, not across orders.
            Expect::NotApplicable => (seen, true, format!("{distinct} distinct result(s); NCCL's own sum is compared across NCCL settings, not orders")),
            Expect::Disagree => {
                let mut seqs: Vec<Vec<usize>> = members
                    .iter()
                    .map(|c| effective(&c.params.order_sequence))
                    .collect();
                seqs.sort();
                seqs.dedup();
                let blind = members.iter().all(|c| match c.sensitivity.verdict {
                    Verdict::Blind => true,
                    Verdict::Weak | Verdict::Sensitive => false,
                });
                if seqs.len() < 2 || blind {
                    let why = if blind {
                        "the data cannot see reordering (sensitivity: blind)"
                    } else {
                        "every order folds in the same effective sequence"
                    };
                    (
                        GroupVerdict::Inconclusive,
                        true,
                        format!("control cannot fail here: {why}"),
                    )
                } else if distinct >= 2 {
                    (
                        GroupVerdict::Disagree,
                        true,
                        format!(
                            "{distinct} distinct results across {} orders, as a working control should",
                            orders.len()
                        ),
                    )
                } else if crate::sensitivity::sequences_differ(&members[0].params, &seqs)
                    == Some(false)
                {
                    // Tiny arenas: every element happens to round alike
                    // under these sequences, so the control could not fail.
                    (
                        GroupVerdict::Inconclusive,
                        true,
                        format!(
                            "control cannot fail here: a coincidence of the data, whose {} element(s) fold to the same bits in all {} sequences (sensitivity: blind for these orders)",
                            members[0].params.arenas.iter().sum::<usize>(),
                            seqs.len()
                        ),
                    )
                } else {
                    (GroupVerdict::Agree, false, format!("{contract} gave identical bits for different fold sequences: the harness is not seeing the order"))
                }
            }
            Expect::Agree if distinct == 1 => (
                GroupVerdict::Agree,
                true,
                format!("identical across {} delivery orders", orders.len()),
            ),
            Expect::Agree => (seen, false, format!("{distinct} distinct results across {} delivery orders: delivery order changed the bits", orders.len())),
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
            expect,
            verdict,
            ok,
            note,
        });
    }
    groups
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::Distribution;
    use crate::experiment::{Case, DeliveryOrder};
    use crate::result::ReducedArena;
    use crate::sensitivity;

    fn report(
        contract: Contract,
        order: DeliveryOrder,
        digest: &str,
        verdict: Verdict,
    ) -> CaseReport {
        let case = Case::builder(4, [10])
            .experiment("e")
            .id(order.canonical())
            .order(order)
            .seed(1)
            .distribution(Distribution::MixedMagnitude)
            .contract(contract)
            .build()
            .unwrap();
        let arena = ReducedArena {
            scattered: None,
            len: 10,
            // Distinct names, distinct digests.
            rank_digests: vec![crate::digest::Sha256::of(digest.as_bytes()); 4],
            chunks: vec![],
            values: None,
            differing: vec![],
        };
        let sens = sensitivity::Sensitivity {
            changed: 5,
            checked: 10,
            fraction: 0.5,
            sample: "every element".into(),
            verdict,
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
                Verdict::Sensitive,
            ),
            report(
                Contract::FixedOrder,
                DeliveryOrder::Descending,
                "aa",
                Verdict::Sensitive,
            ),
        ]);
        assert!(ok[0].ok);
        let bad = build_groups(&[
            report(
                Contract::FixedOrder,
                DeliveryOrder::Ascending,
                "aa",
                Verdict::Sensitive,
            ),
            report(
                Contract::FixedOrder,
                DeliveryOrder::Descending,
                "bb",
                Verdict::Sensitive,
            ),
        ]);
        assert!(!bad[0].ok);
        assert_eq!(bad[0].verdict, GroupVerdict::Disagree);
    }

    #[test]
    fn arrival_order_control_fails_when_it_cannot_see_order() {
        let bad = build_groups(&[
            report(
                Contract::ArrivalOrder,
                DeliveryOrder::Ascending,
                "aa",
                Verdict::Sensitive,
            ),
            report(
                Contract::ArrivalOrder,
                DeliveryOrder::Descending,
                "aa",
                Verdict::Sensitive,
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
                Verdict::Sensitive,
            ),
            report(
                Contract::ArrivalOrder,
                DeliveryOrder::Descending,
                "bb",
                Verdict::Sensitive,
            ),
        ]);
        assert!(good[0].ok);
        // Swapping only the first two sources is the same sum: inconclusive, not a failure.
        let commuted = build_groups(&[
            report(
                Contract::ArrivalOrder,
                DeliveryOrder::Ascending,
                "aa",
                Verdict::Sensitive,
            ),
            report(
                Contract::ArrivalOrder,
                DeliveryOrder::Explicit(vec![1, 0, 2, 3]),
                "aa",
                Verdict::Sensitive,
            ),
        ]);
        assert!(commuted[0].ok);
        assert_eq!(commuted[0].verdict, GroupVerdict::Inconclusive);
        let blind = build_groups(&[
            report(
                Contract::ArrivalOrder,
                DeliveryOrder::Ascending,
                "aa",
                Verdict::Blind,
            ),
            report(
                Contract::ArrivalOrder,
                DeliveryOrder::Descending,
                "aa",
                Verdict::Blind,
            ),
        ]);
        assert_eq!(blind[0].verdict, GroupVerdict::Inconclusive);
    }

    #[test]
    fn each_contract_expects_what_the_report_documents() {
        // docs/REPORT.md, "A group".
        let want = [
            (Contract::FixedOrder, "agree"),
            (Contract::ArrivalOrder, "disagree"),
            (Contract::PairwiseTree, "agree"),
            (Contract::NcclAllreduce, "n/a"),
        ];
        assert_eq!(want.len(), crate::fold::ALL_CONTRACTS.len());
        for (c, word) in want {
            assert_eq!(Expect::of(c).name(), word, "{c}");
        }
    }

    #[test]
    fn nccl_groups_pass_whatever_the_orders_give() {
        for digests in [["aa", "aa"], ["aa", "bb"]] {
            let g = build_groups(&[
                report(
                    Contract::NcclAllreduce,
                    DeliveryOrder::Ascending,
                    digests[0],
                    Verdict::Sensitive,
                ),
                report(
                    Contract::NcclAllreduce,
                    DeliveryOrder::Descending,
                    digests[1],
                    Verdict::Sensitive,
                ),
            ]);
            assert_eq!(g[0].expect, Expect::NotApplicable);
            assert!(g[0].ok);
        }
    }

    /// W = 4, one element: for seed 23 `ascending` and `rotate:1` fold to
    /// the same bits (the data cannot show them apart); for seed 2 they
    /// differ, so identical bits there are still the harness's failure.
    #[test]
    fn a_control_whose_data_cannot_tell_its_orders_apart_is_inconclusive() {
        let one = |seed: u64, order: DeliveryOrder| {
            let case = Case::builder(4, [1])
                .experiment("e")
                .id(format!("{seed}/{}", order.canonical()))
                .order(order)
                .seed(seed)
                .distribution(Distribution::MixedMagnitude)
                .contract(Contract::ArrivalOrder)
                .build()
                .unwrap();
            let sens = sensitivity::measure(&case).unwrap();
            assert_eq!(sens.verdict, Verdict::Sensitive);
            let arena = ReducedArena {
                scattered: None,
                len: 1,
                rank_digests: vec![crate::digest::Sha256::of(b"aa"); 4],
                chunks: vec![],
                values: None,
                differing: vec![],
            };
            CaseReport::new(&case, &[arena], vec![], true, sens)
        };
        let rotate = || DeliveryOrder::parse("rotate:1").unwrap();
        let g = build_groups(&[one(23, DeliveryOrder::Ascending), one(23, rotate())]);
        assert_eq!(g[0].verdict, GroupVerdict::Inconclusive);
        assert!(g[0].ok);
        assert!(
            g[0].note.contains("a coincidence of the data"),
            "{}",
            g[0].note
        );
        let g = build_groups(&[one(2, DeliveryOrder::Ascending), one(2, rotate())]);
        assert_eq!(g[0].verdict, GroupVerdict::Agree);
        assert!(!g[0].ok, "{}", g[0].note);
    }

    #[test]
    fn weak_data_still_makes_the_control_conclusive() {
        let g = build_groups(&[
            report(
                Contract::ArrivalOrder,
                DeliveryOrder::Ascending,
                "aa",
                Verdict::Weak,
            ),
            report(
                Contract::ArrivalOrder,
                DeliveryOrder::Descending,
                "aa",
                Verdict::Weak,
            ),
        ]);
        assert_eq!(g[0].verdict, GroupVerdict::Agree);
        assert!(!g[0].ok);
    }
}
