//! The CPU oracle against the contract: straight-line folds, delivery-order
//! immunity (with the negative controls that prove the checks have power),
//! W as part of the identity, and the committed generator vectors.

use foldprint::backend::{cpu::CpuBackend, Backend, RunOptions};
use foldprint::data::{value, Distribution, Lane};
use foldprint::digest::NanPolicy;
use foldprint::experiment::{Case, DeliveryOrder};
use foldprint::fold::{fold_in_order, mean_scale, reference_fixed, Contract};
use proptest::prelude::*;

fn case(world: usize, arenas: Vec<usize>, order: DeliveryOrder, contract: Contract) -> Case {
    Case::builder(world, arenas)
        .experiment("test")
        .id("t")
        .order(order)
        .seed(42)
        .distribution(Distribution::MixedMagnitude)
        .contract(contract)
        .build()
        .unwrap()
}

/// Rank 0's reduced arenas, after checking every rank ended identical.
fn reduced(c: &Case) -> Vec<Vec<f32>> {
    let opts = RunOptions {
        nan_policy: NanPolicy::Preserve,
        keep_values: true,
    };
    let run = CpuBackend::new().run_case(c, &opts).expect("cpu run");
    run.arenas
        .into_iter()
        .map(|a| {
            assert!(a.ranks_identical(), "ranks differ for {c:?}");
            a.values.expect("values kept")
        })
        .collect()
}

fn addends(c: &Case, arena: usize) -> Vec<Vec<f32>> {
    (0..c.world())
        .map(|r| {
            let foldprint::experiment::Addends::Generated { seed, distribution } = *c.addends()
            else {
                panic!("generated addends expected");
            };
            let lane = Lane::new(distribution, seed, r as u32, arena as u32);
            (0..c.arenas()[arena] as u64)
                .map(|i| lane.value(i))
                .collect()
        })
        .collect()
}

fn straight_line(c: &Case, arena: usize) -> Vec<f32> {
    let a = addends(c, arena);
    let refs: Vec<&[f32]> = a.iter().map(|v| v.as_slice()).collect();
    let mut out = vec![0f32; c.arenas()[arena]];
    reference_fixed(&refs, &mut out);
    out
}

/// Raw bits with NaN payloads canonicalized: payloads are not part of the
/// contract (even SIMD and scalar x86 adds propagate different ones).
fn bits(v: &[f32]) -> Vec<u32> {
    v.iter()
        .map(|x| NanPolicy::Canonical.apply(x.to_bits()))
        .collect()
}

#[test]
fn sharded_fold_equals_straight_line_fold() {
    for world in [1usize, 2, 3, 4, 5, 7, 8, 13, 31, 64] {
        for n in [0usize, 1, 2, 5, 63, 64, 65, 1000, 4097, 10007] {
            let c = case(
                world,
                vec![n, 3],
                DeliveryOrder::Ascending,
                Contract::FixedOrder,
            );
            let got = reduced(&c);
            for (a, arena) in got.iter().enumerate() {
                assert_eq!(
                    bits(arena),
                    bits(&straight_line(&c, a)),
                    "W={world} n={n} arena {a}"
                );
            }
        }
    }
}

#[test]
fn delivery_order_cannot_change_fixed_order_bits() {
    let orders = [
        DeliveryOrder::Ascending,
        DeliveryOrder::Descending,
        DeliveryOrder::Rotate(2),
        DeliveryOrder::Shuffle(9),
        DeliveryOrder::Explicit(vec![3, 0, 5, 1, 4, 2]),
    ];
    let want = straight_line(
        &case(
            6,
            vec![4097],
            DeliveryOrder::Ascending,
            Contract::FixedOrder,
        ),
        0,
    );
    for o in &orders {
        let got = reduced(&case(6, vec![4097], o.clone(), Contract::FixedOrder));
        assert_eq!(bits(&got[0]), bits(&want), "order {o}");
    }
    // Power of the check: a reducer that folded in arrival order (a slot =
    // arrival index mutant) would fail it on this data.
    let mutant = reduced(&case(
        6,
        vec![4097],
        DeliveryOrder::Descending,
        Contract::ArrivalOrder,
    ));
    assert_ne!(
        bits(&mutant[0]),
        bits(&want),
        "arrival-order must see the descending order"
    );
}

#[test]
fn arrival_order_folds_in_delivery_order() {
    let order = DeliveryOrder::Explicit(vec![2, 0, 3, 1]);
    let c = case(4, vec![999], order.clone(), Contract::ArrivalOrder);
    let got = reduced(&c);
    let a = addends(&c, 0);
    let seq = order.sequence(4);
    for i in 0..999 {
        let slots: Vec<f32> = a.iter().map(|r| r[i]).collect();
        assert_eq!(
            got[0][i].to_bits(),
            fold_in_order(&slots, &seq).to_bits(),
            "element {i}"
        );
    }
}

#[test]
fn w3_default_data_differs_from_reversed_order() {
    let c = case(
        3,
        vec![4099],
        DeliveryOrder::Ascending,
        Contract::FixedOrder,
    );
    let fwd = straight_line(&c, 0);
    let a = addends(&c, 0);
    let changed = (0..4099)
        .filter(|&i| {
            let s = [a[0][i], a[1][i], a[2][i]];
            fold_in_order(&s, &[2, 1, 0]).to_bits() != fwd[i].to_bits()
        })
        .count();
    assert!(changed > 400, "only {changed} of 4099 change");
}

#[test]
fn world_size_is_part_of_the_identity() {
    let two = reduced(&case(
        2,
        vec![5000],
        DeliveryOrder::Ascending,
        Contract::FixedOrder,
    ));
    let four = reduced(&case(
        4,
        vec![5000],
        DeliveryOrder::Ascending,
        Contract::FixedOrder,
    ));
    assert_ne!(bits(&two[0]), bits(&four[0]));
}

#[test]
fn mean_is_sum_times_rounded_reciprocal() {
    let c = case(
        3,
        vec![2053],
        DeliveryOrder::Descending,
        Contract::FixedOrder,
    );
    let sum = straight_line(&c, 0);
    let c = c.to_builder().mean(true).build().unwrap();
    let got = reduced(&c);
    let s = mean_scale(3);
    for (g, x) in got[0].iter().zip(&sum) {
        assert_eq!(g.to_bits(), (x * s).to_bits());
    }
    // 1/3 is not exact: dividing instead would differ somewhere.
    assert!(sum.iter().any(|x| (x * s).to_bits() != (x / 3.0).to_bits()));
}

#[test]
fn pairwise_tree_is_order_immune_but_differs_from_fixed() {
    let asc = reduced(&case(
        8,
        vec![3001],
        DeliveryOrder::Ascending,
        Contract::PairwiseTree,
    ));
    let shuf = reduced(&case(
        8,
        vec![3001],
        DeliveryOrder::Shuffle(5),
        Contract::PairwiseTree,
    ));
    let fixed = reduced(&case(
        8,
        vec![3001],
        DeliveryOrder::Ascending,
        Contract::FixedOrder,
    ));
    assert_eq!(bits(&asc[0]), bits(&shuf[0]));
    assert_ne!(bits(&asc[0]), bits(&fixed[0]));
}

#[test]
fn generator_matches_committed_test_vectors() {
    let text = include_str!("../data/generator-vectors.tsv");
    let mut checked = 0;
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let f: Vec<&str> = line.split('\t').collect();
        let d: Distribution = f[0].parse().unwrap();
        let want = u32::from_str_radix(f[5], 16).unwrap();
        let got = value(
            d,
            f[1].parse().unwrap(),
            f[2].parse().unwrap(),
            f[3].parse().unwrap(),
            f[4].parse().unwrap(),
        );
        assert_eq!(got.to_bits(), want, "{line}");
        checked += 1;
    }
    assert_eq!(checked, 177);
}

/// The branches of SPEC §1 that a row of the vector file takes, named from
/// the element's 64-bit word (and the pair's, for `cancellation`).
fn branches(d: Distribution, seed: u64, rank: u32, arena: u32, index: u64) -> Vec<String> {
    use foldprint::data::{element_bits, lane_key};
    let u = element_bits(lane_key(seed, rank, arena), index);
    let hi8 = (u >> 32) & 0xFF;
    let mut b = Vec::new();
    let mut add = |cond: bool, name: &str| {
        if cond {
            b.push(format!("{}:{name}", d.name()));
        }
    };
    match d {
        Distribution::MixedMagnitude => {
            add(u >> 63 == 0, "sign 0");
            add(u >> 63 == 1, "sign 1");
            add((hi8 * 24) >> 8 == 0, "e 115");
            add((hi8 * 24) >> 8 == 23, "e 138");
        }
        Distribution::Uniform => {
            let i = (u >> 39) as i64 - (1 << 24);
            add(i < 0, "i < 0");
            add(i > 0, "i > 0");
            add(i == 0, "i = 0");
            add(i == -(1 << 24), "i = -2^24");
        }
        Distribution::Cancellation => {
            let p = element_bits(lane_key(seed, rank & !1, arena), index);
            let e = 137 + ((((p >> 32) & 0xFF) * 11) >> 8);
            let parity = if rank & 1 == 0 { "even" } else { "odd" };
            add(e == 137, &format!("{parity} e 137"));
            add(e == 147, &format!("{parity} e 147"));
        }
        Distribution::SubnormalHeavy => {
            let s = (u >> 32) & 3;
            add(s < 3, &format!("s {s}"));
            add(s == 3, &format!("e {}", 1 + ((u >> 34) & 3)));
            add(u >> 63 == 1, "sign 1");
        }
        Distribution::Specials => {
            let k = (u >> 32) & 63;
            add(k < 2 || k > 2 && k < 5, &format!("k {k}"));
            add(k == 2, &format!("NaN sign {}", u >> 63));
            add(k == 2 && u & (1 << 21) != 0, "NaN payload bit 21");
            add(k >= 5, "k >= 5");
        }
        Distribution::ExactIntegers => {
            let i = (u >> 48) as i64 - (1 << 15);
            add(i < 0, "i < 0");
            add(i > 0, "i > 0");
            add(i == 0, "i = 0");
            add(i == -(1 << 15), "i = -2^15");
            add(i == (1 << 15) - 1, "i = 2^15 - 1");
        }
    }
    b
}

/// Every branch of every distribution has a committed vector, so an
/// implementation that gets one branch wrong (a NaN payload, the extreme
/// exponents, -2^24) fails a vector, not just some digest.
#[test]
fn generator_vectors_cover_every_branch() {
    let text = include_str!("../data/generator-vectors.tsv");
    let mut seen = std::collections::BTreeSet::new();
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let f: Vec<&str> = line.split('\t').collect();
        let d: Distribution = f[0].parse().unwrap();
        seen.extend(branches(
            d,
            f[1].parse().unwrap(),
            f[2].parse().unwrap(),
            f[3].parse().unwrap(),
            f[4].parse().unwrap(),
        ));
    }
    let want = [
        "mixed-magnitude:sign 0",
        "mixed-magnitude:sign 1",
        "mixed-magnitude:e 115",
        "mixed-magnitude:e 138",
        "uniform:i < 0",
        "uniform:i > 0",
        "uniform:i = 0",
        "uniform:i = -2^24",
        "cancellation:even e 137",
        "cancellation:even e 147",
        "cancellation:odd e 137",
        "cancellation:odd e 147",
        "subnormal-heavy:s 0",
        "subnormal-heavy:s 1",
        "subnormal-heavy:s 2",
        "subnormal-heavy:e 1",
        "subnormal-heavy:e 2",
        "subnormal-heavy:e 3",
        "subnormal-heavy:e 4",
        "subnormal-heavy:sign 1",
        "specials:k 0",
        "specials:k 1",
        "specials:NaN sign 0",
        "specials:NaN sign 1",
        "specials:NaN payload bit 21",
        "specials:k 3",
        "specials:k 4",
        "specials:k >= 5",
        "exact-integers:i < 0",
        "exact-integers:i > 0",
        "exact-integers:i = 0",
        "exact-integers:i = -2^15",
        "exact-integers:i = 2^15 - 1",
    ];
    let missing: Vec<&str> = want
        .iter()
        .copied()
        .filter(|w| !seen.contains(*w))
        .collect();
    assert!(missing.is_empty(), "no vector for: {missing:?}");
    // Negative control: the 144 rows that predate this test miss branches.
    let old: std::collections::BTreeSet<String> = text
        .lines()
        .filter(|l| !l.starts_with('#'))
        .take(144)
        .flat_map(|line| {
            let f: Vec<&str> = line.split('\t').collect();
            branches(
                f[0].parse().unwrap(),
                f[1].parse().unwrap(),
                f[2].parse().unwrap(),
                f[3].parse().unwrap(),
                f[4].parse().unwrap(),
            )
        })
        .collect();
    assert!(want.iter().any(|w| !old.contains(*w)));
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]
    #[test]
    fn any_shape_and_order_matches_the_straight_line_fold(
        world in 1usize..20, n in 0usize..300, rot in 0u64..40, seed in any::<u64>(),
        dist in prop::sample::select(foldprint::data::ALL_DISTRIBUTIONS.to_vec())
    ) {
        let c = case(world, vec![n], DeliveryOrder::Rotate(rot), Contract::FixedOrder)
            .with_data(seed, dist);
        let got = reduced(&c);
        prop_assert_eq!(bits(&got[0]), bits(&straight_line(&c, 0)));
    }
}
