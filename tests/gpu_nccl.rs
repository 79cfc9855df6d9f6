//! The NCCL backend on a real communicator. Built only with `--features
//! gpu-tests`; needs a CUDA GPU and an NCCL library, and fails without them.
//! On a one-GPU host this is a world of one rank: the full code path runs,
//! with the exchange as NCCL send/recv to self. Worlds of several ranks
//! need a multi-GPU host (docs/GPU-TESTING.md).

use foldprint::backend::cpu::CpuBackend;
use foldprint::backend::nccl::{NcclBackend, NcclConfig};
use foldprint::backend::{Backend, RunOptions};
use foldprint::data::ALL_DISTRIBUTIONS;
use foldprint::dist::rendezvous::Plan;
use foldprint::experiment::{Case, DeliveryOrder};
use foldprint::fold::Contract;
use std::time::Duration;

fn nccl() -> NcclBackend {
    NcclBackend::new(NcclConfig {
        cuda: Default::default(),
        gpus: 1,
        init_timeout: Duration::from_secs(60),
        timeout: Duration::from_secs(60),
        plan: Plan::new(&["gpu-tests".into()], "gpu tests"),
    })
    .unwrap_or_else(|e| panic!("the NCCL tests need a GPU and NCCL: {e}"))
}

fn case(arenas: Vec<usize>, dist: usize, contract: Contract, mean: bool) -> Case {
    Case {
        experiment: "gpu-nccl".into(),
        id: format!("{arenas:?}-{dist}-{contract}-{mean}"),
        world: 1,
        arenas,
        order: DeliveryOrder::Ascending,
        seed: 17,
        distribution: ALL_DISTRIBUTIONS[dist],
        contract,
        mean,
        rounds: 2,
    }
}

fn digests(be: &mut dyn Backend, c: &Case) -> Vec<Vec<String>> {
    let r = be
        .run_case(c, &RunOptions::default())
        .unwrap_or_else(|e| panic!("{}: {e}", be.name()));
    assert!(r.rounds_identical);
    r.arenas.iter().map(|a| a.rank_digests.clone()).collect()
}

#[test]
fn world_of_one_equals_the_cpu_oracle_for_every_distribution() {
    let mut be = nccl();
    assert_eq!(be.world(), 1);
    let mut cpu = CpuBackend::new();
    for dist in 0..ALL_DISTRIBUTIONS.len() {
        for mean in [false, true] {
            let c = case(vec![10007, 1, 0, 1 << 20], dist, Contract::FixedOrder, mean);
            assert_eq!(digests(&mut be, &c), digests(&mut cpu, &c), "{}", c.id);
        }
    }
    // Negative control of the comparison: another seed must differ.
    let a = case(vec![4096], 0, Contract::FixedOrder, false);
    let mut b = a.clone();
    b.seed += 1;
    assert_ne!(digests(&mut be, &a), digests(&mut be, &b));
}

#[test]
fn nccl_allreduce_of_one_rank_is_the_identity_and_cpu_skips_it() {
    let mut be = nccl();
    let c = case(vec![4099], 0, Contract::NcclAllreduce, false);
    let fixed = case(vec![4099], 0, Contract::FixedOrder, false);
    assert_eq!(digests(&mut be, &c), digests(&mut be, &fixed));
    assert!(CpuBackend::new().skip_reason(&c).is_some());
}

#[test]
fn other_world_sizes_are_skipped_with_a_reason() {
    let be = nccl();
    let mut c = case(vec![16], 0, Contract::FixedOrder, false);
    c.world = 4;
    let why = be.skip_reason(&c).expect("W=4 cannot run on a world of 1");
    assert!(why.contains("W = 4"), "{why}");
}

#[test]
fn environment_names_nccl_version_and_library() {
    let be = nccl();
    let env = be.environment();
    let v = env["nccl"]["version"].as_str().unwrap().to_string();
    assert!(v.starts_with("2."), "{v}");
    let libs = env["libraries"].as_array().unwrap();
    assert!(libs.iter().any(|l| l["family"] == "nccl"), "{env}");
    eprintln!("NCCL {v} from {}", env["nccl"]["opened"]);
}
