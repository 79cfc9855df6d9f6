//! The CUDA loopback backend against the CPU oracle and the host contract,
//! on raw bits. Built only with `--features gpu-tests`; every test needs a
//! usable CUDA GPU and FAILS (never skips) without one. See docs/GPU-TESTING.md.

use foldprint::backend::cpu::CpuBackend;
use foldprint::backend::cuda::CudaBackend;
use foldprint::backend::{Backend, BackendError, CaseRun, RunOptions};
use foldprint::data::{Distribution, Lane, ALL_DISTRIBUTIONS};
use foldprint::digest::NanPolicy;
use foldprint::experiment::{Case, DeliveryOrder};
use foldprint::fold::{
    fold_fixed, fold_in_order, fold_pairwise, mean_scale, reference_fixed, Contract, ALL_CONTRACTS,
};
use foldprint::gpu::{
    self as cuda, kernels, CompileOptions, DeviceConfig, KernelVariant, LaunchTuning, Target,
};
use std::sync::Mutex;

/// Serializes the heavy tests so they do not fight over host memory.
static HEAVY: Mutex<()> = Mutex::new(());

fn gpu(cfg: DeviceConfig) -> CudaBackend {
    CudaBackend::new(cfg).unwrap_or_else(|e| panic!("the GPU tests need a usable CUDA GPU: {e}"))
}

fn gpu_variant(variant: KernelVariant) -> CudaBackend {
    gpu(DeviceConfig {
        variant,
        ..DeviceConfig::default()
    })
}

#[allow(clippy::too_many_arguments)]
fn case(
    world: usize,
    arenas: Vec<usize>,
    dist: Distribution,
    contract: Contract,
    order: DeliveryOrder,
    mean: bool,
) -> Case {
    Case::builder(world, arenas.clone())
        .experiment("gpu-tests")
        .id(format!(
            "W{world}-n{arenas:?}-{dist}-{contract}-{order}-mean{mean}"
        ))
        .order(order)
        .seed(42)
        .distribution(dist)
        .contract(contract)
        .mean(mean)
        .build()
        .unwrap()
}

fn run(be: &mut dyn Backend, c: &Case, opts: &RunOptions) -> CaseRun {
    let r = be
        .run_case(c, opts)
        .unwrap_or_else(|e| panic!("{} failed on {}: {e}", be.name(), c.id()));
    for a in &r.arenas {
        assert!(
            a.ranks_identical(),
            "{}: ranks differ on {}",
            be.name(),
            c.id()
        );
        assert_eq!(a.rank_digests.len(), c.world());
    }
    assert!(
        r.rounds_identical,
        "{}: rounds differ on {}",
        be.name(),
        c.id()
    );
    r
}

fn digests(be: &mut dyn Backend, c: &Case) -> Vec<String> {
    run(be, c, &RunOptions::default())
        .arenas
        .iter()
        .map(|a| a.digest().to_string())
        .collect()
}

fn assert_matches_cpu(gpu: &mut CudaBackend, c: &Case) {
    let want = digests(&mut CpuBackend::new(), c);
    let got = digests(gpu, c);
    assert_eq!(
        got,
        want,
        "GPU ({}) vs CPU on {}",
        gpu.config().variant,
        c.id()
    );
}

fn canon(bits: u32) -> u32 {
    NanPolicy::Canonical.apply(bits)
}

#[test]
fn probe_reports_a_usable_gpu() {
    let p = cuda::probe();
    eprintln!("{}", serde_json::to_string_pretty(&p).unwrap());
    assert!(p.usable, "CUDA not usable: {}", p.reason());
    assert!(p.device_count >= 1);
    assert!(p.driver_version.is_some());
    assert!(p.nvrtc_version.is_some());
    assert!(
        p.driver_library.path.is_some(),
        "libcuda path not found in /proc/self/maps"
    );
    assert!(
        p.nvrtc_library.path.is_some(),
        "libnvrtc path not found in /proc/self/maps"
    );
}

#[test]
fn generator_matches_host_bits_for_every_distribution() {
    let mut be = gpu(DeviceConfig::default());
    let n = 100_003usize;
    for dist in ALL_DISTRIBUTIONS {
        for (seed, rank, arena) in [(0u64, 0u32, 0u32), (42, 1, 0), (7, 4, 2), (u64::MAX, 5, 1)] {
            for first in [0u64, (1 << 31) - 17, (1 << 32) + 5] {
                let got = be
                    .generate_lane(dist, seed, rank, arena, first, n)
                    .expect("device generator");
                let lane = Lane::new(dist, seed, rank, arena);
                let bad = (0..n).find(|&i| got[i] != lane.bits(first + i as u64));
                assert!(
                    bad.is_none(),
                    "{dist} seed {seed} rank {rank} arena {arena}: element {} is {:#010x}, host {:#010x}",
                    first + bad.unwrap() as u64,
                    got[bad.unwrap()],
                    lane.bits(first + bad.unwrap() as u64)
                );
            }
        }
    }
}

#[test]
fn world_grid_matches_cpu_oracle() {
    let worlds = [1usize, 2, 3, 4, 5, 7, 8, 13, 16, 31, 64];
    for variant in KernelVariant::ALL {
        let mut be = gpu_variant(variant);
        for &w in &worlds {
            let mut lens = vec![
                0usize,
                1,
                2,
                3,
                5,
                97,
                1024,
                4097,
                10007,
                w.saturating_sub(1),
                w + 1,
            ];
            lens.sort_unstable();
            lens.dedup();
            for &n in &lens {
                let c = case(
                    w,
                    vec![n],
                    Distribution::MixedMagnitude,
                    Contract::FixedOrder,
                    DeliveryOrder::Descending,
                    false,
                );
                assert_matches_cpu(&mut be, &c);
            }
        }
    }
}

#[test]
fn raw_bits_equal_the_host_reference_fold() {
    let opts = RunOptions {
        nan_policy: NanPolicy::Preserve,
        keep_values: true,
    };
    for variant in KernelVariant::ALL {
        let mut be = gpu_variant(variant);
        for dist in ALL_DISTRIBUTIONS {
            for &(w, n) in &[(3usize, 4099usize), (8, 4099), (64, 1031)] {
                let c = case(
                    w,
                    vec![n],
                    dist,
                    Contract::FixedOrder,
                    DeliveryOrder::Shuffle(3),
                    false,
                );
                let r = run(&mut be, &c, &opts);
                let got = r.arenas[0].values.as_ref().expect("values kept");
                let lanes: Vec<Vec<f32>> = (0..w)
                    .map(|rk| {
                        let l = Lane::new(dist, 42, rk as u32, 0); // the seed `case` gives
                        (0..n as u64).map(|i| l.value(i)).collect()
                    })
                    .collect();
                let refs: Vec<&[f32]> = lanes.iter().map(|v| v.as_slice()).collect();
                let mut want = vec![0f32; n];
                reference_fixed(&refs, &mut want);
                for i in 0..n {
                    // NaN payloads differ between CPU and GPU by design.
                    assert_eq!(
                        canon(got[i].to_bits()),
                        canon(want[i].to_bits()),
                        "{variant} {dist} W={w} element {i}"
                    );
                }
            }
        }
    }
}

#[test]
fn every_distribution_contract_and_mean_matches_cpu() {
    for variant in KernelVariant::ALL {
        let mut be = gpu_variant(variant);
        for dist in ALL_DISTRIBUTIONS {
            // nccl-allreduce is NCCL's own sum: the NCCL suite covers it.
            for contract in ALL_CONTRACTS.into_iter().filter(|c| !c.needs_nccl()) {
                for mean in [false, true] {
                    for w in [3usize, 8, 13] {
                        let c = case(
                            w,
                            vec![10007, 3, 0],
                            dist,
                            contract,
                            DeliveryOrder::Shuffle(5),
                            mean,
                        );
                        assert_matches_cpu(&mut be, &c);
                    }
                }
            }
        }
    }
}

#[test]
fn delivery_orders_and_racing_copies_keep_fixed_order_bits() {
    let w = 8;
    let n = 100_003;
    let orders = [
        DeliveryOrder::Ascending,
        DeliveryOrder::Descending,
        DeliveryOrder::Rotate(3),
        DeliveryOrder::Shuffle(1),
        DeliveryOrder::Explicit(vec![5, 0, 7, 2, 1, 6, 3, 4]),
    ];
    let fixed = |o: &DeliveryOrder| {
        case(
            w,
            vec![n],
            Distribution::MixedMagnitude,
            Contract::FixedOrder,
            o.clone(),
            false,
        )
    };
    let want = digests(&mut CpuBackend::new(), &fixed(&DeliveryOrder::Ascending));
    for variant in KernelVariant::ALL {
        let mut be = gpu_variant(variant);
        for streams in [0usize, 2, 3, 8] {
            be.set_copy_streams(streams).expect("copy streams");
            for o in &orders {
                assert_eq!(
                    digests(&mut be, &fixed(o)),
                    want,
                    "{variant} streams={streams} order={o}"
                );
            }
        }
    }
    // Negative control: arrival order must see the order, and match the
    // CPU's arrival-order fold for the same order.
    let mut be = gpu(DeviceConfig {
        copy_streams: 4,
        ..DeviceConfig::default()
    });
    let mut seen = Vec::new();
    for o in &orders {
        let c = case(
            w,
            vec![n],
            Distribution::MixedMagnitude,
            Contract::ArrivalOrder,
            o.clone(),
            false,
        );
        let d = digests(&mut be, &c);
        assert_eq!(d, digests(&mut CpuBackend::new(), &c), "arrival-order {o}");
        seen.push(d);
    }
    assert_ne!(
        seen[0], seen[1],
        "arrival-order ascending vs descending must differ"
    );
    assert_eq!(seen[0], want, "arrival-order ascending is the fixed order");
}

#[test]
fn launch_configuration_does_not_change_bits() {
    let c = case(
        5,
        vec![1_000_003],
        Distribution::MixedMagnitude,
        Contract::FixedOrder,
        DeliveryOrder::Rotate(2),
        false,
    );
    let want = digests(&mut CpuBackend::new(), &c);
    let mut be = gpu(DeviceConfig::default());
    for variant in KernelVariant::ALL {
        be.set_variant(variant);
        for (seed_block, fast_block, per_sm) in
            [(32, 32, 1), (128, 64, 2), (256, 256, 16), (1024, 1024, 64)]
        {
            be.set_tuning(LaunchTuning {
                seed_block,
                fast_block,
                fast_blocks_per_sm: per_sm,
            });
            assert_eq!(
                digests(&mut be, &c),
                want,
                "{variant} {seed_block}/{fast_block}/{per_sm}"
            );
        }
    }
}

#[test]
fn ptx_for_compute_75_and_cubin_for_the_device_agree() {
    let probe = cuda::probe();
    let dev = probe.devices.first().expect("a device");
    let arch = (dev.compute_capability.0 * 10 + dev.compute_capability.1) as u32;
    let cases: Vec<Case> = [
        Distribution::MixedMagnitude,
        Distribution::SubnormalHeavy,
        Distribution::Specials,
    ]
    .into_iter()
    .flat_map(|d| {
        [Contract::FixedOrder, Contract::PairwiseTree]
            .map(|k| case(8, vec![100_003, 17], d, k, DeliveryOrder::Descending, true))
    })
    .collect();
    let mut targets = Vec::new();
    for target in [Target::Ptx(75), Target::Cubin(arch), Target::Auto] {
        for variant in KernelVariant::ALL {
            let mut be = gpu(DeviceConfig {
                variant,
                compile: CompileOptions {
                    target,
                    ..CompileOptions::default()
                },
                ..DeviceConfig::default()
            });
            let img = &be.device().fold.program.image;
            targets.push(format!("{} {}", img.target.kind, img.target.arch_option()));
            // What loading the module left in the host's float mode, on
            // this thread and on the pool's (the CPU oracle guards itself).
            eprintln!(
                "{} {} {variant}: host float mode altered here {}, in the pool {:?}",
                img.target.kind,
                img.target.arch_option(),
                foldprint::fpenv::is_altered(),
                rayon::broadcast(|_| foldprint::fpenv::is_altered())
            );
            for c in &cases {
                assert_matches_cpu(&mut be, c);
            }
        }
    }
    eprintln!("targets checked: {targets:?}");
    assert!(targets.iter().any(|t| t == "ptx -arch=compute_75"));
    assert!(targets
        .iter()
        .any(|t| t == &format!("cubin -arch=sm_{arch}")));
}

#[test]
fn ftz_changes_subnormal_digests_and_the_pinned_defaults_do_not() {
    let c = case(
        8,
        vec![100_003],
        Distribution::SubnormalHeavy,
        Contract::FixedOrder,
        DeliveryOrder::Ascending,
        false,
    );
    let want = digests(&mut CpuBackend::new(), &c);
    let with = |fmad: bool, ftz: bool| {
        let mut be = gpu(DeviceConfig {
            compile: CompileOptions {
                fmad,
                ftz,
                target: Target::Auto,
                ..CompileOptions::default()
            },
            ..DeviceConfig::default()
        });
        let d = digests(&mut be, &c);
        let img = be.device().fold.program.image.clone();
        (d, img)
    };
    let (defaults, img_default) = with(false, false);
    assert_eq!(defaults, want, "pinned defaults must equal the CPU oracle");
    assert!(img_default.options.contains(&"--ftz=false".to_string()));
    assert!(img_default.options.contains(&"--fmad=false".to_string()));
    let (ftz, img_ftz) = with(false, true);
    eprintln!(
        "ftz=true: image {} ({}), digest {} (CPU {})",
        img_ftz.sha256,
        img_ftz.target.arch_option(),
        ftz[0],
        want[0]
    );
    eprintln!("ftz=true image note: {:?}", img_ftz.note);
    assert!(img_ftz.options.contains(&"--ftz=true".to_string()));
    assert_ne!(ftz, want, "--ftz=true must change a subnormal-heavy digest");
    assert_ne!(
        img_ftz.sha256, img_default.sha256,
        "ftz build must be a different image"
    );
    // fmad has nothing to contract in a pure add chain: record what it does.
    let (fmad, img_fmad) = with(true, false);
    eprintln!(
        "fmad=true: digest {} CPU ({}), image {} default",
        if fmad == want {
            "equals"
        } else {
            "differs from"
        },
        want[0],
        if img_fmad.sha256 == img_default.sha256 {
            "equals"
        } else {
            "differs from"
        }
    );
}

/// An explicit target either carries `--ftz=true` (the digest changes) or
/// is refused with the reason; it never silently builds the default code.
#[test]
fn explicit_targets_never_drop_ftz_silently() {
    let probe = cuda::probe();
    let dev = probe.devices.first().expect("a device");
    let arch = (dev.compute_capability.0 * 10 + dev.compute_capability.1) as u32;
    let c = case(
        8,
        vec![100_003],
        Distribution::SubnormalHeavy,
        Contract::FixedOrder,
        DeliveryOrder::Descending,
        false,
    );
    let want = digests(&mut CpuBackend::new(), &c);
    for target in [Target::Ptx(arch), Target::Ptx(75), Target::Cubin(arch)] {
        let cfg = DeviceConfig {
            compile: CompileOptions {
                fmad: false,
                ftz: true,
                target,
                ..CompileOptions::default()
            },
            ..DeviceConfig::default()
        };
        match CudaBackend::new(cfg) {
            Ok(mut be) => {
                let kind = be.device().fold.program.image.target.kind;
                assert_ne!(
                    digests(&mut be, &c),
                    want,
                    "{target:?} ({kind}) ignored --ftz=true"
                );
                eprintln!("{target:?}: built {kind}, ftz visible in the digest");
            }
            Err(BackendError::Unavailable { reason, .. }) => {
                assert!(matches!(target, Target::Cubin(_)), "{target:?}: {reason}");
                assert!(reason.contains("same CUBIN"), "{reason}");
                eprintln!("{target:?}: refused: {reason}");
            }
            Err(e) => panic!("{target:?}: {e}"),
        }
    }
}

#[test]
fn modules_are_compiled_once_per_device_and_options() {
    let a = gpu(DeviceConfig::default());
    let b = gpu(DeviceConfig::default());
    let c = gpu_variant(KernelVariant::PerElement);
    let prog = |x: &CudaBackend| x.device().fold.program.clone();
    assert!(
        std::sync::Arc::ptr_eq(&prog(&a), &prog(&b)),
        "same options must reuse the cached module"
    );
    assert!(
        std::sync::Arc::ptr_eq(&prog(&a), &prog(&c)),
        "the variant is a function of one module"
    );
    assert!(std::sync::Arc::ptr_eq(
        &a.device().generator,
        &b.device().generator
    ));
    assert!(kernels::compile_count() >= 2);
    // The second backend found every program in this process: it made no
    // image while its context was created, and loaded nothing.
    let s = b.device().startup;
    assert_eq!(
        (s.images, s.nvrtc_compile, s.module_load),
        (0.0, 0.0, 0.0),
        "{s:?}"
    );
    assert!(s.overlapped >= s.context, "{s:?}");
}

#[test]
fn pinned_upstream_example_and_signed_zero() {
    for variant in KernelVariant::ALL {
        let mut be = gpu_variant(variant);
        let a = [1e8f32, 2.5];
        let b = [-1e8f32, 0.5];
        let c = [1f32, -1.0];
        let asc = be
            .fold_slices(&[&a, &b, &c], Contract::FixedOrder, &[2, 1, 0], false)
            .unwrap();
        assert_eq!(asc[0].to_bits(), 1f32.to_bits(), "{variant}");
        assert_eq!(asc[1].to_bits(), 2f32.to_bits(), "{variant}");
        let rev = be
            .fold_slices(&[&a, &b, &c], Contract::ArrivalOrder, &[2, 1, 0], false)
            .unwrap();
        assert_eq!(rev[0].to_bits(), 0f32.to_bits(), "{variant}");
        let z = [-0.0f32; 5];
        let zs = be
            .fold_slices(&[&z, &z, &z], Contract::FixedOrder, &[0, 1, 2], false)
            .unwrap();
        assert!(
            zs.iter().all(|v| v.to_bits() == (-0.0f32).to_bits()),
            "{variant}: -0.0 chain"
        );
    }
}

#[test]
fn kernel_alone_matches_host_sum_and_mean() {
    for variant in KernelVariant::ALL {
        let mut be = gpu_variant(variant);
        for (w, n, mean) in [
            (2usize, 4099usize, false),
            (3, 4099, false),
            (5, 4099, false),
            (4, 2053, true),
            (7, 1, true),
        ] {
            let lanes: Vec<Vec<f32>> = (0..w)
                .map(|r| {
                    let l = Lane::new(Distribution::MixedMagnitude, 9, r as u32, 0);
                    (0..n as u64).map(|i| l.value(i)).collect()
                })
                .collect();
            let refs: Vec<&[f32]> = lanes.iter().map(|v| v.as_slice()).collect();
            let order: Vec<usize> = (0..w).collect();
            let got = be
                .fold_slices(&refs, Contract::FixedOrder, &order, mean)
                .unwrap();
            let mut want = vec![0f32; n];
            reference_fixed(&refs, &mut want);
            if mean {
                let s = mean_scale(w);
                want.iter_mut().for_each(|v| *v *= s);
            }
            for i in 0..n {
                assert_eq!(
                    got[i].to_bits(),
                    want[i].to_bits(),
                    "{variant} W={w} n={n} i={i}"
                );
            }
        }
    }
}

#[test]
fn out_of_memory_is_reported_before_allocating() {
    let mut be = gpu(DeviceConfig::default());
    let c = case(
        64,
        vec![1 << 30],
        Distribution::MixedMagnitude,
        Contract::FixedOrder,
        DeliveryOrder::Ascending,
        false,
    );
    match be.run_case(&c, &RunOptions::default()) {
        Err(BackendError::OutOfMemory {
            needed, available, ..
        }) => assert!(needed > available),
        other => panic!(
            "expected OutOfMemory, got {other:?}",
            other = other.map(|r| r.arenas.len())
        ),
    }
    // The backend is still usable afterwards.
    let small = case(
        4,
        vec![1000],
        Distribution::MixedMagnitude,
        Contract::FixedOrder,
        DeliveryOrder::Ascending,
        false,
    );
    assert_matches_cpu(&mut be, &small);
}

#[test]
fn rounds_repeat_bit_for_bit() {
    let c = case(
        6,
        vec![65_537, 5],
        Distribution::Cancellation,
        Contract::FixedOrder,
        DeliveryOrder::Shuffle(9),
        true,
    )
    .to_builder()
    .rounds(3)
    .build()
    .unwrap();
    let mut be = gpu(DeviceConfig {
        copy_streams: 3,
        ..DeviceConfig::default()
    });
    let r = run(&mut be, &c, &RunOptions::default());
    assert_eq!(r.rounds.len(), 3);
    assert!(r
        .rounds
        .iter()
        .all(|t| t.total_ms > 0.0 && t.reduce_ms > 0.0 && t.generate_ms >= 0.0));
    assert_matches_cpu(&mut be, &c);
}

#[test]
fn environment_names_device_libraries_and_options() {
    let be = gpu(DeviceConfig::default());
    let env = be.environment().to_value();
    eprintln!("{}", serde_json::to_string_pretty(&env).unwrap());
    assert!(env["gpu"]["name"].as_str().is_some_and(|s| !s.is_empty()));
    assert!(env["gpu"]["uuid"]
        .as_str()
        .is_some_and(|s| s.starts_with("GPU-")));
    assert!(env["gpu"]["sm_count"].as_i64().is_some_and(|s| s > 0));
    let opts: Vec<String> = serde_json::from_value(env["fold_program"]["options"].clone()).unwrap();
    for o in [
        "--fmad=false",
        "--ftz=false",
        "--prec-div=true",
        "--prec-sqrt=true",
    ] {
        assert!(opts.iter().any(|x| x == o), "{o} missing from {opts:?}");
    }
    assert_eq!(
        env["fold_program"]["sha256"].as_str().map(str::len),
        Some(64)
    );
    let libs = env["libraries"].as_array().expect("libraries");
    for fam in ["cuda", "nvrtc"] {
        let l = libs
            .iter()
            .find(|l| l["family"] == fam)
            .unwrap_or_else(|| panic!("no {fam} library in {libs:?}"));
        assert_eq!(l["sha256"].as_str().map(str::len), Some(64), "{fam}");
    }
}

#[test]
fn arena_beyond_2_pow_31_elements() {
    let _g = HEAVY.lock().unwrap_or_else(|p| p.into_inner());
    let n = (1usize << 31) + 3;
    let c = case(
        2,
        vec![n],
        Distribution::MixedMagnitude,
        Contract::FixedOrder,
        DeliveryOrder::Descending,
        false,
    );
    // Open the GPU first so a machine without one fails at once.
    let mut backends: Vec<CudaBackend> =
        KernelVariant::ALL.iter().map(|&v| gpu_variant(v)).collect();
    let t = std::time::Instant::now();
    let want = digests(&mut CpuBackend::new(), &c);
    eprintln!(
        "CPU oracle W=2 n=2^31+3: {:.1} s",
        t.elapsed().as_secs_f64()
    );
    for be in &mut backends {
        let variant = be.config().variant;
        let t = std::time::Instant::now();
        let r = run(be, &c, &RunOptions::default());
        eprintln!(
            "GPU {variant}: {:.1} s, {:?}",
            t.elapsed().as_secs_f64(),
            r.rounds[0]
        );
        let got: Vec<String> = r.arenas.iter().map(|a| a.digest().to_string()).collect();
        assert_eq!(got, want, "{variant} beyond 2^31");
    }
}

/// The device rank check against the host one, on a world whose rank
/// copies agree, then with one element of rank 3 changed in the last,
/// partial chunk (n is not a multiple of 4: the kernel's scalar tail).
#[test]
fn rank_copies_are_checked_on_the_device_as_the_host_would() {
    use foldprint::backend::cuda::world::{self, RoundSpec, WorldBuffers};
    use foldprint::digest::CHUNK_ELEMS;
    use foldprint::fold::shard_plan;
    use foldprint::gpu::readback::Reader;
    use foldprint::gpu::Device;
    use foldprint::gpu::RankCheck;
    let _g = HEAVY.lock().unwrap_or_else(|p| p.into_inner());
    let dev = Device::open(0, CompileOptions::default()).expect("a usable CUDA GPU");
    let main = dev.new_stream().unwrap();
    let (w, n) = (5usize, 3 * CHUNK_ELEMS + 5);
    let plan = shard_plan(n, w).unwrap();
    let bufs = WorldBuffers::alloc(&dev, w, n, &plan, 1).unwrap();
    let order: Vec<usize> = (0..w).collect();
    let spec = RoundSpec {
        plan: &plan,
        order: &order,
        mode: kernels::FoldMode::Fixed,
        prog: 0,
        prog_len: 0,
        scale: None,
        variant: KernelVariant::Fast,
        tuning: LaunchTuning::default(),
        generate: Some((Distribution::Uniform, 9)),
        arena: 0,
        dtype: Dtype::F32,
        redistribute: true,
    };
    world::run_round(&dev, &main, &[], &bufs, &spec).unwrap();
    let mut readers: Vec<Reader> = (0..3)
        .map(|_| Reader::new(&dev, 1 << 16).unwrap())
        .collect();
    let policy = NanPolicy::Canonical;
    let on_device = world::digest_ranks(
        &dev,
        &mut readers,
        &bufs,
        Dtype::F32,
        policy,
        false,
        RankCheck::Device,
        None,
        None,
    )
    .unwrap();
    let on_host = world::digest_ranks(
        &dev,
        &mut readers,
        &bufs,
        Dtype::F32,
        policy,
        false,
        RankCheck::Host,
        None,
        None,
    )
    .unwrap();
    assert_eq!(on_device.digests, on_host.digests);
    assert_eq!(on_device.chunks, on_host.chunks);
    assert!(on_device.differing.is_empty() && on_host.differing.is_empty());
    assert!(on_device.digests.windows(2).all(|p| p[0] == p[1]));
    assert_eq!(on_device.chunks.len(), 4);

    // Negative control: flip the sign bit of rank 3's last element.
    let mut last = [0f32; 1];
    bufs.ranks[3].download(n - 1, &mut last).unwrap();
    bufs.ranks[3].upload_at(n - 1, &[-last[0]]).unwrap();
    let on_device = world::digest_ranks(
        &dev,
        &mut readers,
        &bufs,
        Dtype::F32,
        policy,
        false,
        RankCheck::Device,
        None,
        None,
    )
    .unwrap();
    let on_host = world::digest_ranks(
        &dev,
        &mut readers,
        &bufs,
        Dtype::F32,
        policy,
        false,
        RankCheck::Host,
        None,
        None,
    )
    .unwrap();
    assert_eq!(on_device.differing, vec![(3usize, vec![3usize])]);
    assert_eq!(on_host.differing, on_device.differing);
    // The device's checks started before the host's digests (as a files'
    // round does while rank 0 is hashed) find the same.
    let stream = readers[1].stream().clone();
    let started =
        world::DeviceChecks::start(&dev, &stream, &bufs, policy, RankCheck::Device).unwrap();
    let early = world::digest_ranks(
        &dev,
        &mut readers,
        &bufs,
        Dtype::F32,
        policy,
        false,
        RankCheck::Device,
        None,
        Some(started),
    )
    .unwrap();
    assert_eq!(early.differing, on_device.differing);
    assert_eq!(early.digests, on_device.digests);
    assert_eq!(early.chunks, on_device.chunks);
    assert_eq!(on_device.digests, on_host.digests);
    assert_ne!(on_device.digests[3], on_device.digests[0]);
    for r in [0, 1, 2, 4] {
        assert_eq!(on_device.digests[r], on_device.digests[0]);
    }
    // And one in the body of chunk 1 of rank 1 (the vector path).
    let mut v = [0f32; 1];
    bufs.ranks[1].download(CHUNK_ELEMS + 6, &mut v).unwrap();
    bufs.ranks[1]
        .upload_at(CHUNK_ELEMS + 6, &[f32::from_bits(v[0].to_bits() ^ 1)])
        .unwrap();
    let on_device = world::digest_ranks(
        &dev,
        &mut readers,
        &bufs,
        Dtype::F32,
        policy,
        false,
        RankCheck::Device,
        None,
        None,
    )
    .unwrap();
    assert_eq!(
        on_device.differing,
        vec![(1usize, vec![1usize]), (3usize, vec![3usize])]
    );
}

/// Per-chunk SHA-256 on the device equals sha2's on the host, chunk for
/// chunk, for every distribution (NaNs included), both NaN policies, and
/// lengths around every padding case of the last block.
#[test]
fn chunk_digests_on_the_device_equal_the_hosts() {
    use foldprint::digest::{digest_chunked, CHUNK_ELEMS};
    use foldprint::gpu::mem::DeviceBuffer;
    use foldprint::gpu::Device;
    let _g = HEAVY.lock().unwrap_or_else(|p| p.into_inner());
    let dev = Device::open(0, CompileOptions::default()).expect("a usable CUDA GPU");
    let stream = dev.new_stream().unwrap();
    let lens = [
        1,
        13,
        14,
        15,
        16,
        17,
        31,
        CHUNK_ELEMS - 1,
        CHUNK_ELEMS,
        2 * CHUNK_ELEMS + 14,
        3 * CHUNK_ELEMS + 5,
    ];
    let mut checked = 0;
    for &dist in ALL_DISTRIBUTIONS.iter() {
        let lane = Lane::new(dist, 77, 3, 0);
        for &n in &lens {
            let mut host = vec![0f32; n];
            lane.fill(0, &mut host);
            let arena = DeviceBuffer::alloc(&dev.ctx, n).unwrap();
            arena.upload(&host).unwrap();
            let chunks = n.div_ceil(CHUNK_ELEMS);
            let out = DeviceBuffer::<u32>::alloc(&dev.ctx, 8 * chunks).unwrap();
            for policy in [NanPolicy::Canonical, NanPolicy::Preserve] {
                // SAFETY: live buffers of this context; synchronized below.
                unsafe {
                    dev.chunk_sha256(arena.view(), CHUNK_ELEMS, policy, out.view(), &stream)
                        .unwrap()
                };
                stream.synchronize().unwrap();
                let words = out.to_host().unwrap();
                let got: Vec<String> = words
                    .chunks_exact(8)
                    .map(|d| {
                        d.iter()
                            .flat_map(|w| w.to_be_bytes())
                            .map(|b| format!("{b:02x}"))
                            .collect()
                    })
                    .collect();
                assert_eq!(
                    got,
                    digest_chunked(&host, policy)
                        .chunks
                        .iter()
                        .map(ToString::to_string)
                        .collect::<Vec<_>>(),
                    "{dist} n={n} {policy}"
                );
                checked += chunks;
            }
        }
    }
    assert!(checked > 100);
    // Negative control: one flipped bit changes that chunk's device digest.
    let n = 2 * CHUNK_ELEMS;
    let host: Vec<f32> = (0..n).map(|i| i as f32).collect();
    let arena = DeviceBuffer::alloc(&dev.ctx, n).unwrap();
    let out = DeviceBuffer::<u32>::alloc(&dev.ctx, 16).unwrap();
    let digest_now = |arena: &DeviceBuffer| {
        // SAFETY: as above.
        unsafe {
            dev.chunk_sha256(
                arena.view(),
                CHUNK_ELEMS,
                NanPolicy::Canonical,
                out.view(),
                &stream,
            )
            .unwrap()
        };
        stream.synchronize().unwrap();
        out.to_host().unwrap()
    };
    arena.upload(&host).unwrap();
    let before = digest_now(&arena);
    arena
        .upload_at(
            CHUNK_ELEMS + 9,
            &[f32::from_bits(host[CHUNK_ELEMS + 9].to_bits() ^ 1)],
        )
        .unwrap();
    let after = digest_now(&arena);
    assert_eq!(before[..8], after[..8]);
    assert_ne!(before[8..], after[8..]);
}

#[test]
fn nan_chunks_are_found_on_the_device_and_spare_the_host_scan() {
    use foldprint::digest::{digest_chunked, CHUNK_ELEMS};
    use foldprint::gpu::mem::DeviceBuffer;
    use foldprint::gpu::readback::Reader;
    use foldprint::gpu::Device;
    let _g = HEAVY.lock().unwrap_or_else(|p| p.into_inner());
    let dev = Device::open(0, CompileOptions::default()).expect("a usable CUDA GPU");
    let stream = dev.new_stream().unwrap();
    let n = 5 * CHUNK_ELEMS + 7;
    let base: Vec<f32> = (0..n).map(|i| (i as f32).sqrt() * -1.25).collect();
    let flags_of = |host: &[f32]| -> Vec<bool> {
        let arena = DeviceBuffer::alloc(&dev.ctx, host.len()).unwrap();
        arena.upload(host).unwrap();
        let chunks = host.len().div_ceil(CHUNK_ELEMS);
        let flags = DeviceBuffer::<u32>::alloc(&dev.ctx, chunks).unwrap();
        // SAFETY: live buffers of this context; synchronized below.
        unsafe {
            dev.nan_chunks(arena.view(), CHUNK_ELEMS, flags.view(), &stream)
                .unwrap()
        };
        stream.synchronize().unwrap();
        flags.to_host().unwrap().iter().map(|&f| f != 0).collect()
    };
    // Infinities and the largest finite value are not NaNs: nothing flagged.
    let mut clean = base.clone();
    clean[3] = f32::INFINITY;
    clean[CHUNK_ELEMS + 1] = f32::NEG_INFINITY;
    clean[2 * CHUNK_ELEMS] = f32::from_bits(0x7F7F_FFFF);
    assert_eq!(flags_of(&clean), vec![false; 6]);
    // A quiet NaN with a payload in chunk 0's vector body, a signalling NaN
    // in chunk 3, a negative NaN as the very last (scalar tail) element.
    let mut dirty = clean.clone();
    dirty[5] = f32::from_bits(0x7FC0_0ABC);
    dirty[3 * CHUNK_ELEMS + 9] = f32::from_bits(0x7F80_0001);
    dirty[n - 1] = f32::from_bits(0xFFC0_0000);
    assert_eq!(
        flags_of(&dirty),
        vec![true, false, false, true, false, true]
    );

    // The read-back hashes exactly what the host would, under both
    // policies, whether a span holds a NaN or not; a NaN-free arena is never
    // scanned on the host.
    let mut reader = Reader::new(&dev, 2 * CHUNK_ELEMS).unwrap();
    for (host, nan_free) in [(&clean, true), (&dirty, false)] {
        let arena = DeviceBuffer::alloc(&dev.ctx, n).unwrap();
        arena.upload(host).unwrap();
        for policy in [NanPolicy::Canonical, NanPolicy::Preserve] {
            let (got, _) = reader
                .digest(&dev, &arena, Dtype::F32, policy, false, true)
                .unwrap();
            assert_eq!(
                got,
                digest_chunked(host, policy),
                "{policy} nan_free={nan_free}"
            );
            let scanned = reader.last_times().nan_scan_ms;
            if nan_free || policy == NanPolicy::Preserve {
                assert_eq!(scanned.to_bits(), 0f64.to_bits(), "{policy}: host scanned");
            } else {
                assert!(scanned > 0.0, "the spans holding a NaN were not scanned");
            }
        }
    }
    // Negative control: canonical and preserved digests of the NaN arena
    // differ, so the equality above is about the policy being applied.
    assert_ne!(
        digest_chunked(&dirty, NanPolicy::Canonical).sha256,
        digest_chunked(&dirty, NanPolicy::Preserve).sha256
    );
}

#[path = "common/rank_files.rs"]
mod rank_files;

/// Rank files on the device: each rank's arena uploaded from its file
/// gives the CPU oracle's digests and the rank-order sum bit for bit, for
/// float32, bfloat16 and float16 tensors; a case of other addends differs
/// (the comparison can fail).
#[test]
fn rank_files_upload_to_the_oracles_bits() {
    let dir = tempfile::tempdir().unwrap();
    let n = 300_007;
    let mut tensors: Vec<Vec<Vec<f32>>> = vec![Vec::new(), Vec::new(), Vec::new()];
    for r in 0..5 {
        let w = rank_files::mixed(5, r, 0, 2 * n);
        let h: Vec<u16> = (0..n as u32)
            .map(|i| (i.wrapping_mul(2654435761).wrapping_add(r as u32) >> 9) as u16 & !0x4000)
            .collect();
        rank_files::write_safetensors(
            &dir.path().join(format!("rank{r}.safetensors")),
            &[
                rank_files::T::f32("a.weight", &[2, n], &w),
                rank_files::T::bf16("b.bf16", &[n], &h),
                rank_files::T::f16("c.f16", &[n], &h),
            ],
        );
        tensors[0].push(w);
        tensors[1].push(
            h.iter()
                .map(|&x| f32::from_bits(u32::from(x) << 16))
                .collect(),
        );
        tensors[2].push(
            h.iter()
                .map(|&x| half::f16::from_bits(x).to_f32())
                .collect(),
        );
    }
    // The files mix f32, bf16 and f16 tensors: declared f32, every one is
    // widened exactly.
    let text = "name = \"rf\"\n[[sweep]]\nid = \"c\"\naddends = \"rank{rank}.safetensors\"\ndtype = [\"f32\"]\n\
                contract = [\"fixed-order\", \"pairwise-tree\", \"arrival-order\"]\n\
                order = [\"ascending\", \"shuffle:3\"]\n";
    let exp = foldprint::experiment::parse(&dir.path().join("rf.toml"), text).unwrap();
    let opts = RunOptions {
        keep_values: true,
        ..RunOptions::default()
    };
    let mut dev = gpu(DeviceConfig::default());
    let mut cpu = CpuBackend::new();
    for c in &exp.cases {
        let (g, o) = (run(&mut dev, c, &opts), run(&mut cpu, c, &opts));
        for (a, (x, y)) in g.arenas.iter().zip(&o.arenas).enumerate() {
            assert_eq!(x.digest(), y.digest(), "{} arena {a}", c.id());
            if c.contract() == Contract::FixedOrder {
                let want: Vec<u32> = rank_files::rank_order_sum(&tensors[a])
                    .iter()
                    .map(|v| v.to_bits())
                    .collect();
                let got: Vec<u32> = x
                    .values
                    .as_ref()
                    .unwrap()
                    .iter()
                    .map(|v| v.to_bits())
                    .collect();
                assert_eq!(got, want, "arena {a}");
            }
        }
    }
    // Negative control: generated addends of the same shape differ.
    let c = &exp.cases[0];
    let generated = c.clone().with_data(1, Distribution::MixedMagnitude);
    assert_ne!(
        run(&mut dev, &generated, &opts).arenas[0].digest(),
        run(&mut dev, c, &opts).arenas[0].digest()
    );
}

/// Rank files larger than several upload stages, uploaded while their
/// background pass is still reading them (the stages go across the ranks
/// as the reading does): the device gives the CPU oracle's digest, in
/// float32 and in bf16. A file changed after its opening is refused, not
/// folded; a case of other addends differs (the comparison can fail).
#[test]
fn rank_files_uploaded_while_still_being_read_equal_the_oracle() {
    let dir = tempfile::tempdir().unwrap();
    // Three stages of 2^23 elements and a tail, per rank.
    let n = (3 << 23) + 12_345;
    for r in 0..3 {
        let w = rank_files::mixed(7, r, 0, n);
        let bytes: Vec<u8> = w.iter().flat_map(|v| v.to_le_bytes()).collect();
        rank_files::write_npy(&dir.path().join(format!("f{r}.npy")), "<f4", &[n], &bytes);
        let h: Vec<u16> = w.iter().map(|v| (v.to_bits() >> 16) as u16).collect();
        rank_files::write_safetensors(
            &dir.path().join(format!("b{r}.safetensors")),
            &[rank_files::T::bf16("g", &[n], &h)],
        );
    }
    let text = "name = \"streamed\"\n\
                [[case]]\nid = \"f\"\naddends = \"f{rank}.npy\"\n\
                [[case]]\nid = \"b\"\naddends = \"b{rank}.safetensors\"\n";
    let path = dir.path().join("streamed.toml");
    let mut dev = gpu(DeviceConfig::default());
    let mut cpu = CpuBackend::new();
    let opts = RunOptions::default();
    // Twice over: the pass of each is started here, and the device's
    // upload meets it mid-read (the oracle's run waits for the end).
    let mut seen = Vec::new();
    for c in 0..2 {
        let exp = foldprint::experiment::parse(&path, text).unwrap();
        let exp = foldprint::experiment::read_rank_files(&[exp])
            .unwrap()
            .remove(0);
        let case = &exp.cases[c];
        let g = run(&mut dev, case, &opts);
        let o = run(&mut cpu, case, &opts);
        assert_eq!(g.arenas[0].digest(), o.arenas[0].digest(), "{}", case.id());
        foldprint::experiment::rank_files_read(std::slice::from_ref(&exp)).unwrap();
        seen.push(g.arenas[0].digest());
    }
    assert_ne!(seen[0], seen[1], "float32 and bf16 reduce to other bytes");
    // Negative control: the same shape from the generator differs.
    let exp = foldprint::experiment::parse(&path, text).unwrap();
    let generated = exp.cases[0]
        .clone()
        .with_data(1, Distribution::MixedMagnitude);
    assert_ne!(run(&mut dev, &generated, &opts).arenas[0].digest(), seen[0]);
    // A file rewritten after its opening: the upload refuses it.
    let exp = foldprint::experiment::parse(&path, text).unwrap();
    let exp = foldprint::experiment::read_rank_files(&[exp])
        .unwrap()
        .remove(0);
    let f1 = dir.path().join("f1.npy");
    let mut bytes = std::fs::read(&f1).unwrap();
    bytes.push(0);
    std::fs::write(&f1, &bytes).unwrap();
    let err = dev
        .run_case(&exp.cases[0], &opts)
        .expect_err("a file changed since its opening is never folded");
    assert!(err.to_string().contains("f1.npy"), "{err}");
}

// ---- bf16 and f16 -------------------------------------------------------

use foldprint::dtype::Dtype;

const HALVES: [Dtype; 2] = [Dtype::Bf16, Dtype::F16];

/// Rank files over several stages whose shards end between stage edges
/// (W = 5, 2 x 2^23 + 777 elements): each shard is folded as its stages
/// arrive and rank 0's digest is read back section by section meanwhile.
/// The device gives the CPU oracle's rank and chunk digests and kept
/// values, bit for bit, with NaN payloads in the data, under both rank
/// checks, racing copies, all-reduce and reduce-scatter, float32 and
/// bf16. One element changed in one file changes the digest (the
/// comparison can fail).
#[test]
fn staged_rounds_from_rank_files_equal_the_oracle_under_every_option() {
    use foldprint::gpu::RankCheck;
    let _heavy = HEAVY.lock().unwrap_or_else(|p| p.into_inner());
    let dir = tempfile::tempdir().unwrap();
    let n = (2 << 23) + 777;
    let write = |dir: &std::path::Path, r: usize, bump: Option<usize>| {
        let mut w = rank_files::mixed(11, r, 0, n);
        if r == 1 {
            // Signalling NaNs with payloads, one every 1,000,003 elements
            // and one in the last stage's tail.
            for (k, i) in (0..n).step_by(1_000_003).chain([n - 5]).enumerate() {
                w[i] = f32::from_bits(0x7f80_0001 + k as u32);
            }
        }
        if let Some(i) = bump {
            // Larger than the other addends' sum: it cannot be absorbed.
            w[i] = 3.0e30;
        }
        let bytes: Vec<u8> = w.iter().flat_map(|v| v.to_le_bytes()).collect();
        rank_files::write_npy(&dir.join(format!("f{r}.npy")), "<f4", &[n], &bytes);
        let h: Vec<u16> = w.iter().map(|v| (v.to_bits() >> 16) as u16).collect();
        rank_files::write_safetensors(
            &dir.join(format!("b{r}.safetensors")),
            &[rank_files::T::bf16("g", &[n], &h)],
        );
    };
    for r in 0..5 {
        write(dir.path(), r, None);
    }
    let sweep = |id: &str, files: &str| {
        format!(
            "[[sweep]]\nid = \"{id}\"\naddends = \"{files}\"\n\
             collective = [\"all-reduce\", \"reduce-scatter\"]\n"
        )
    };
    let text = format!(
        "name = \"staged\"\n{}{}",
        sweep("f", "f{rank}.npy"),
        sweep("b", "b{rank}.safetensors")
    );
    let path = dir.path().join("staged.toml");
    let exp = foldprint::experiment::parse(&path, &text).unwrap();
    assert_eq!(exp.cases.len(), 4);
    let mut cpu = CpuBackend::new();
    let configs = [
        DeviceConfig::default(),
        DeviceConfig {
            rank_check: RankCheck::Host,
            ..DeviceConfig::default()
        },
        DeviceConfig {
            copy_streams: 2,
            ..DeviceConfig::default()
        },
    ];
    let optss = [
        RunOptions::default(),
        RunOptions {
            keep_values: true,
            ..RunOptions::default()
        },
    ];
    // Kept values: the NaNs' payloads are the platform's (docs/SPEC.md §5).
    let bits = |v: &Option<Vec<f32>>| -> Vec<u32> {
        v.as_ref()
            .unwrap()
            .iter()
            .map(|x| canon(x.to_bits()))
            .collect()
    };
    let mut first = None;
    for cfg in configs {
        let check = cfg.rank_check;
        let mut dev = gpu(cfg);
        for opts in &optss {
            for c in &exp.cases {
                let (g, o) = (
                    dev.run_case(c, opts).unwrap(),
                    cpu.run_case(c, opts).unwrap(),
                );
                let (x, y) = (&g.arenas[0], &o.arenas[0]);
                let what = format!("{} {check:?} {opts:?}", c.id());
                // Float32 files go up from where the pass keeps them, but
                // for the few elements past each stage's last whole page
                // (the npy header puts them off the page); bf16 does not.
                let sent = dev.in_place_bytes();
                if c.id().starts_with('f') {
                    let all = 5 * n as u64 * 4 * u64::from(c.rounds());
                    assert!(
                        sent > all * 99 / 100 && sent < all,
                        "{what}: {sent} of {all}"
                    );
                } else {
                    assert_eq!(sent, 0, "{what}");
                }
                assert_eq!(x.digest(), y.digest(), "{what}");
                assert_eq!(x.rank_digests, y.rank_digests, "{what}");
                assert_eq!(x.chunks, y.chunks, "{what}");
                assert_eq!(x.shard_digests(), y.shard_digests(), "{what}");
                if opts.keep_values {
                    assert!(bits(&x.values) == bits(&y.values), "{what}");
                }
                first.get_or_insert((c.clone(), x.digest()));
            }
        }
    }
    // Three rounds, the files kept pinned from round to round: every round
    // has the oracle's bits.
    let f = exp.cases.iter().find(|c| c.id().starts_with('f')).unwrap();
    let three = f.to_builder().rounds(3).build().unwrap();
    let mut dev = gpu(DeviceConfig::default());
    let got = dev.run_case(&three, &RunOptions::default()).unwrap();
    let want = cpu.run_case(f, &RunOptions::default()).unwrap();
    assert!(got.rounds_identical);
    assert_eq!(got.arenas[0].digest(), want.arenas[0].digest());
    // Every round sent all but less than a page per rank and stage.
    let (all, sent) = (3 * 5 * n as u64 * 4, dev.in_place_bytes());
    let page = foldprint::gpu::in_place::PIN_ALIGN as u64;
    assert!(
        sent < all && all - sent < 3 * 5 * 3 * page,
        "{sent} of {all}"
    );
    // Negative control: one element of rank 3's file changed.
    let (c, seen) = first.unwrap();
    let bumped = tempfile::tempdir().unwrap();
    for r in 0..5 {
        write(bumped.path(), r, (r == 3).then_some(n - 100));
    }
    let exp = foldprint::experiment::parse(&bumped.path().join("staged.toml"), &text).unwrap();
    let again = exp.cases.iter().find(|x| x.id() == c.id()).unwrap();
    let mut dev = gpu(DeviceConfig::default());
    let got = dev.run_case(again, &RunOptions::default()).unwrap();
    assert_ne!(got.arenas[0].digest(), seen, "{}", c.id());
}

/// Host bytes pinned in place go up as they lie: pieces pinned as the
/// bytes grow, copies from inside one piece and across two, bit for bit;
/// a copy sent with nothing in it is no error, wherever it points.
/// Bytes not pinned yet, and a run that does not start on a page, are
/// refused (nothing is sent from them).
#[test]
fn bytes_pinned_in_place_go_up_as_they_lie() {
    use foldprint::gpu::in_place::{PinnedInPlace, PIN_ALIGN};
    use foldprint::gpu::mem::DeviceBuffer;
    use foldprint::gpu::Device;
    let dev = Device::open(0, CompileOptions::default()).expect("a usable CUDA GPU");
    let stream = dev.new_stream().unwrap();
    let n = 3 * PIN_ALIGN / 4 + 1001;
    let want: Vec<u32> = (0..n as u32)
        .map(|i| i.wrapping_mul(2_654_435_761) ^ 0x7f80_0001)
        .collect();
    let mut store = vec![0u8; n * 4 + PIN_ALIGN];
    let skip = store.as_ptr().align_offset(PIN_ALIGN);
    for (b, v) in store[skip..].chunks_exact_mut(4).zip(&want) {
        b.copy_from_slice(&v.to_le_bytes());
    }
    let bytes = &store[skip..skip + n * 4];
    let arena = DeviceBuffer::<u32>::alloc(&dev.ctx, n).unwrap();
    let send = |pin: &mut PinnedInPlace<'_>, first: usize, len: usize| {
        let dst = arena.slice(first, len).unwrap();
        // SAFETY: `arena` is of this context and outlives every pin (each
        // drop waits for its copies); nothing else uses it meanwhile.
        unsafe { pin.upload_async(first * 4, dst, &stream) }
    };
    let mut pin = PinnedInPlace::new(&dev.ctx);
    // What is known so far ends past the first page, off a page boundary.
    pin.pin_through(&bytes[..PIN_ALIGN + 12], PIN_ALIGN + 12)
        .unwrap();
    assert_eq!(pin.pinned(), PIN_ALIGN);
    send(&mut pin, 0, PIN_ALIGN / 4).unwrap();
    let past = send(&mut pin, PIN_ALIGN / 4 - 1, 2);
    assert!(past.is_err(), "bytes past the pinned ones were sent");
    pin.pin_through(bytes, n * 4).unwrap();
    assert_eq!(pin.pinned(), 3 * PIN_ALIGN);
    // Across the first piece's end into the second (the driver copies
    // from one piece at a time), then the second piece to its end.
    let (a, b, c) = (
        PIN_ALIGN / 4 - 10,
        2 * PIN_ALIGN / 4 + 77,
        3 * PIN_ALIGN / 4,
    );
    send(&mut pin, a, b - a).unwrap();
    send(&mut pin, b, c - b).unwrap();
    assert!(send(&mut pin, c, 1).is_err(), "the unpinned tail was sent");
    send(&mut pin, n, 0).unwrap();
    let misaligned = PinnedInPlace::new(&dev.ctx).pin_through(&bytes[4..], n * 4 - 4);
    assert!(misaligned.is_err(), "a run off a page was pinned");
    drop(pin);
    arena.upload_at(c, &want[c..]).unwrap();
    let got = arena.to_host().unwrap();
    let bad = got.iter().zip(&want).filter(|(g, w)| g != w).count();
    assert_eq!(bad, 0, "elements that did not arrive as they lie");
    // Negative control: the same comparison sees one element not sent.
    arena.upload_at(5, &[0]).unwrap();
    let got = arena.to_host().unwrap();
    assert_eq!(got.iter().zip(&want).filter(|(g, w)| g != w).count(), 1);
}

/// How many of `got[j]` differ from `want(first + j)`, and the first such j;
/// with `skip_nan`, patterns that are a float32 NaN are not compared.
fn mismatches(
    got: &[u16],
    first: u32,
    skip_nan: bool,
    want: impl Fn(u32) -> u16 + Sync,
) -> (usize, Option<usize>) {
    use rayon::prelude::*;
    let bad = |j: usize| {
        let b = first.wrapping_add(j as u32);
        !(skip_nan && f32::from_bits(b).is_nan()) && got[j] != want(b)
    };
    let count = (0..got.len()).into_par_iter().filter(|&j| bad(j)).count();
    let at = (0..got.len()).into_par_iter().find_first(|&j| bad(j));
    (count, at)
}

/// The device's narrowing of every float32 pattern and widening of every
/// 16-bit pattern equal the host's `Dtype::narrow` / `Dtype::widen` bit for
/// bit (NaN payloads, subnormals and ties included): the exact conversions
/// on every input, and the f16 folds' hardware ones (`hw`, the fast path)
/// on every non-NaN input, a NaN half widening to a NaN (what the fast
/// path's NaN check rests on). The same comparison finds a truncating
/// narrowing and a single flipped bit, so it can fail.
#[test]
fn device_conversions_equal_the_hosts_on_every_input() {
    let _g = HEAVY.lock().unwrap_or_else(|e| e.into_inner());
    let mut dev = gpu(DeviceConfig::default());
    const BATCH: usize = 1 << 28;
    let started = std::time::Instant::now();
    for (d, hw) in [
        (Dtype::Bf16, false),
        (Dtype::F16, false),
        (Dtype::F16, true),
    ] {
        let (_, wide) = dev.convert_bits(d, 0, hw, 0, 1 << 16).expect("widen");
        assert_eq!(wide.len(), 1 << 16);
        let mut nan_halves = 0;
        for (h, &got) in (0..=0xFFFFu32).zip(&wide) {
            let want = d.widen(h);
            if hw && want.is_nan() {
                nan_halves += 1;
                assert!(
                    f32::from_bits(got).is_nan(),
                    "{d} hw: NaN {h:#06x} widened to {got:#010x}"
                );
            } else {
                assert_eq!(
                    got,
                    want.to_bits(),
                    "{d} hw={hw}: widening {h:#06x} differs"
                );
            }
        }
        assert_eq!(nan_halves, if hw { 2 * 1023 } else { 0 });

        let narrow = |b: u32| d.narrow(f32::from_bits(b)) as u16;
        for k in 0..(1usize << 32) / BATCH {
            let first = (k * BATCH) as u32;
            let (mut got, _) = dev.convert_bits(d, first, hw, BATCH, 0).expect("narrow");
            assert_eq!(got.len(), BATCH);
            let (count, at) = mismatches(&got, first, hw, narrow);
            assert_eq!(
                (count, at),
                (0, None),
                "{d} hw={hw}: narrowing differs from the host's at {:#010x}",
                first as u64 + at.unwrap_or(0) as u64
            );
            // Negative controls on the batch of ordinary magnitudes
            // (0x3000_0000..0x4000_0000: 2^-31 up to 2): truncating instead
            // of rounding differs about half the time, and one flipped bit
            // is found where it was flipped.
            if first == 0x3000_0000 {
                let mask = if d == Dtype::Bf16 { 0xFFFF } else { 0x1FFF };
                let truncate = |b: u32| d.narrow(f32::from_bits(b & !mask)) as u16;
                let (wrong, _) = mismatches(&got, first, hw, truncate);
                // (Measured on an H100: f16 about 0.25 of the batch, bf16
                // about half.)
                assert!(wrong > BATCH / 8, "{d}: truncation differs in only {wrong}");
                got[12_345] ^= 1;
                assert_eq!(mismatches(&got, first, hw, narrow), (1, Some(12_345)));
            }
        }
    }
    println!(
        "every conversion of bf16 and f16 (and f16's hardware ones) checked in {:.1} s",
        started.elapsed().as_secs_f64()
    );
}

/// A 16-bit pattern for rank `r`, element `i`: rank 0 holds every pattern
/// once in its first 65,536 elements; the others are scrambled, so NaNs
/// (with payloads), infinities and subnormals meet each other in the sums.
fn pattern16(r: usize, i: u32) -> u16 {
    if r == 0 {
        i as u16
    } else {
        ((i.wrapping_mul(2_654_435_761) >> 7) ^ (r as u32).wrapping_mul(0x5BD1)) as u16
    }
}

/// The 16-bit folds on addends holding every 16-bit pattern (f16's fast
/// path and its exact redo for NaN results both run): W = 1 gives back each
/// pattern rounded through float32, a NaN keeping its payload (quieted);
/// at W = 3 and 8, in every contract, with mean or not, every non-NaN
/// result is the host's float32 fold rounded once, on raw bits, and a NaN
/// result is a NaN; in fixed order both production variants equal the
/// exact integer kernel (`fp_fold16_before`) bit for bit, NaN payloads
/// included. Controls: the expected NaNs carry many payloads (a fold that
/// made them canonical would fail), and the order of adds changes sums.
#[test]
fn bf16_and_f16_folds_keep_every_pattern_bit_for_bit() {
    let n = 65_536 + 13;
    for variant in KernelVariant::ALL {
        let mut be = gpu_variant(variant);
        let trials = be.fold16_trials().expect("the trials program");
        let exact = kernels::FOLD16_TRIALS[0];
        assert_eq!(exact.entry, "fp_fold16_before");
        for d in HALVES {
            for w in [1usize, 3, 8] {
                let rows: Vec<Vec<u16>> = (0..w)
                    .map(|r| (0..n as u32).map(|i| pattern16(r, i)).collect())
                    .collect();
                let refs: Vec<&[u16]> = rows.iter().map(|r| r.as_slice()).collect();
                let order: Vec<usize> = (0..w).rev().collect();
                let mut by_contract = Vec::new();
                for contract in [
                    Contract::FixedOrder,
                    Contract::ArrivalOrder,
                    Contract::PairwiseTree,
                ] {
                    for mean in [false, true] {
                        let at = format!("{variant} {d} W={w} {contract:?} mean={mean}");
                        let got = be
                            .fold_slices16(d, &refs, contract, &order, mean, None)
                            .expect("fold");
                        assert_eq!(got.len(), n);
                        let mut payloads = std::collections::HashSet::new();
                        for i in 0..n {
                            let slots: Vec<f32> =
                                rows.iter().map(|r| d.widen(u32::from(r[i]))).collect();
                            let mut acc = match contract {
                                Contract::FixedOrder => fold_fixed(&slots),
                                Contract::ArrivalOrder => fold_in_order(&slots, &order),
                                _ => fold_pairwise(&slots),
                            };
                            if mean {
                                acc *= mean_scale(w);
                            }
                            let want = d.narrow(acc) as u16;
                            if !acc.is_nan() || (w == 1 && !mean) {
                                assert_eq!(got[i], want, "{at} element {i}");
                                if acc.is_nan() {
                                    payloads.insert(want);
                                }
                            } else {
                                assert!(d.widen(u32::from(got[i])).is_nan(), "{at} element {i}");
                            }
                        }
                        if w == 1 && !mean {
                            // Every quiet payload of both signs: 2 x 64
                            // (bf16) or 2 x 512 (f16).
                            let quiet = if d == Dtype::Bf16 { 128 } else { 1024 };
                            assert_eq!(payloads.len(), quiet, "{at}: NaN payloads");
                        }
                        if contract == Contract::FixedOrder {
                            let before = be
                                .fold_slices16(
                                    d,
                                    &refs,
                                    contract,
                                    &order,
                                    mean,
                                    Some((&trials, exact)),
                                )
                                .expect("exact fold");
                            let first_bad = got.iter().zip(&before).position(|(a, b)| a != b);
                            assert_eq!(first_bad, None, "{at}: production vs exact kernel");
                        }
                        if !mean {
                            by_contract.push(got);
                        }
                    }
                }
                if w >= 3 {
                    assert_ne!(
                        by_contract[0], by_contract[1],
                        "{d} W={w}: order changes nothing"
                    );
                }
            }
        }
    }
}

fn case_in(c: Case, dtype: Dtype) -> Case {
    let id = format!("{}-{dtype}", c.id());
    c.to_builder().dtype(Some(dtype)).id(id).build().unwrap()
}

/// Every distribution, contract (but NCCL's), W 1, 3 and 8, mean or not,
/// odd lengths: the CUDA digests of bf16 and f16 cases are the CPU
/// oracle's, with either fold variant.
#[test]
fn bf16_and_f16_cases_equal_the_cpu_oracle() {
    for variant in KernelVariant::ALL {
        let mut be = gpu_variant(variant);
        for d in HALVES {
            for dist in ALL_DISTRIBUTIONS {
                for contract in ALL_CONTRACTS.into_iter().filter(|c| !c.needs_nccl()) {
                    for mean in [false, true] {
                        for w in [1usize, 3, 8] {
                            let c = case(
                                w,
                                vec![10_007, 3, 0, 2 * 65_536 + 13],
                                dist,
                                contract,
                                DeliveryOrder::Shuffle(5),
                                mean,
                            );
                            assert_matches_cpu(&mut be, &case_in(c, d));
                        }
                    }
                }
            }
        }
    }
}

/// The reduced bf16/f16 values are the float32 chain of the rounded
/// addends rounded once, on raw bits; the dtype changes the digest, the
/// order changes the sum (the data can tell), and racing copies or the
/// host's rank check change nothing.
#[test]
fn bf16_and_f16_values_are_the_float32_chain_rounded_once() {
    let (w, n) = (8usize, 100_003usize);
    let opts = RunOptions {
        keep_values: true,
        ..RunOptions::default()
    };
    for d in HALVES {
        for mean in [false, true] {
            let c = case_in(
                case(
                    w,
                    vec![n],
                    Distribution::MixedMagnitude,
                    Contract::FixedOrder,
                    DeliveryOrder::Descending,
                    mean,
                ),
                d,
            );
            let lanes: Vec<Lane> = (0..w as u32)
                .map(|r| Lane::new(Distribution::MixedMagnitude, 42, r, 0))
                .collect();
            let want: Vec<u32> = (0..n as u64)
                .map(|i| {
                    let mut acc = d.quantize(lanes[0].value(i));
                    for l in &lanes[1..] {
                        acc += d.quantize(l.value(i));
                    }
                    if mean {
                        acc *= mean_scale(w);
                    }
                    canon(d.widen(d.narrow(acc)).to_bits())
                })
                .collect();
            for cfg in [
                DeviceConfig::default(),
                DeviceConfig {
                    copy_streams: 4,
                    rank_check: cuda::RankCheck::Host,
                    ..DeviceConfig::default()
                },
            ] {
                let mut be = gpu(cfg);
                let r = run(&mut be, &c, &opts);
                let got: Vec<u32> = r.arenas[0]
                    .values
                    .as_ref()
                    .unwrap()
                    .iter()
                    .map(|v| canon(v.to_bits()))
                    .collect();
                assert_eq!(got.len(), n);
                let first_bad = got.iter().zip(&want).position(|(a, b)| a != b);
                assert_eq!(first_bad, None, "{d} mean={mean}");
                assert_eq!(
                    r.arenas[0].digest(),
                    run(&mut CpuBackend::new(), &c, &opts).arenas[0].digest()
                );
            }
        }
        // Negative controls: another dtype, another order of adds.
        let base = case(
            w,
            vec![n],
            Distribution::MixedMagnitude,
            Contract::FixedOrder,
            DeliveryOrder::Ascending,
            false,
        );
        let tree = case(
            w,
            vec![n],
            Distribution::MixedMagnitude,
            Contract::PairwiseTree,
            DeliveryOrder::Ascending,
            false,
        );
        let mut be = gpu(DeviceConfig::default());
        let mine = digests(&mut be, &case_in(base.clone(), d));
        assert_ne!(mine, digests(&mut be, &base), "{d} vs f32");
        assert_ne!(
            mine,
            digests(&mut be, &case_in(tree, d)),
            "{d}: tree vs chain"
        );
        let other = if d == Dtype::Bf16 {
            Dtype::F16
        } else {
            Dtype::Bf16
        };
        assert_ne!(
            mine,
            digests(&mut be, &case_in(base, other)),
            "{d} vs {other}"
        );
    }
}

/// The generator in a 16-bit dtype is the host lane rounded once.
#[test]
fn generator_in_bf16_and_f16_is_the_host_lane_rounded_once() {
    let mut be = gpu(DeviceConfig::default());
    for d in HALVES {
        for dist in ALL_DISTRIBUTIONS {
            let got = be
                .generate_lane_as(d, dist, 9, 3, 1, 1000, 4099)
                .expect("generate");
            let lane = Lane::new(dist, 9, 3, 1);
            let want: Vec<u32> = (1000..1000 + 4099u64)
                .map(|i| d.narrow(lane.value(i)))
                .collect();
            assert_eq!(got, want, "{d} {dist}");
        }
    }
}

/// Rank files in bf16 and f16 stay in their dtype on the device and give
/// the CPU oracle's digests and values; declared f32, the same files widen
/// and give another digest.
#[test]
fn bf16_and_f16_rank_files_equal_the_oracle() {
    let dir = tempfile::tempdir().unwrap();
    let n = 200_003;
    for r in 0..3 {
        let h: Vec<u16> = (0..n as u32)
            .map(|i| (i.wrapping_mul(2654435761).wrapping_add(r as u32) >> 9) as u16 & !0x4000)
            .collect();
        rank_files::write_safetensors(
            &dir.path().join(format!("b{r}.safetensors")),
            &[rank_files::T::bf16("g", &[n], &h)],
        );
        rank_files::write_safetensors(
            &dir.path().join(format!("h{r}.safetensors")),
            &[rank_files::T::f16("g", &[n], &h)],
        );
    }
    let text = "name = \"rf16\"\n\
                [[sweep]]\nid = \"b\"\naddends = \"b{rank}.safetensors\"\n\
                contract = [\"fixed-order\", \"pairwise-tree\"]\nmean = [false, true]\n\
                [[sweep]]\nid = \"h\"\naddends = \"h{rank}.safetensors\"\n\
                contract = [\"fixed-order\", \"arrival-order\"]\norder = [\"shuffle:3\"]\n\
                [[case]]\nid = \"w\"\naddends = \"b{rank}.safetensors\"\ndtype = \"f32\"\n";
    let exp = foldprint::experiment::parse(&dir.path().join("rf16.toml"), text).unwrap();
    let opts = RunOptions {
        keep_values: true,
        ..RunOptions::default()
    };
    let mut dev = gpu(DeviceConfig::default());
    let mut cpu = CpuBackend::new();
    let mut seen = std::collections::BTreeMap::new();
    for c in &exp.cases {
        let (g, o) = (run(&mut dev, c, &opts), run(&mut cpu, c, &opts));
        let bits = |r: &CaseRun| -> Vec<u32> {
            r.arenas[0]
                .values
                .as_ref()
                .unwrap()
                .iter()
                .map(|v| canon(v.to_bits()))
                .collect()
        };
        assert_eq!(g.arenas[0].digest(), o.arenas[0].digest(), "{}", c.id());
        assert_eq!(bits(&g), bits(&o), "{}", c.id());
        seen.insert(c.id().to_string(), (c.dtype(), g.arenas[0].digest()));
    }
    let dtypes: std::collections::HashSet<Dtype> = seen.values().map(|(d, _)| *d).collect();
    assert_eq!(dtypes.len(), 3, "{seen:?}");
    // One rounding after the float32 chain hides the fold order in this
    // data (pairwise-tree and arrival-order give fixed-order's bits, on the
    // CPU as on the device: measured on an H100); the mean and the dtype
    // still show, so the digests above can differ.
    let digest = |id: &str| seen[id].1;
    assert_ne!(
        digest("b[fixed-order,mean=false]"),
        digest("b[fixed-order,mean=true]"),
        "{seen:?}"
    );
    assert_ne!(digest("b[fixed-order,mean=false]"), digest("w"), "{seen:?}");
}

/// The device rank check of 16-bit arenas agrees with the host's, and
/// finds one flipped bit in the scalar tail (n odd) and one in a body.
#[test]
fn bf16_rank_copies_are_checked_on_the_device_as_the_host_would() {
    use foldprint::backend::cuda::world::{self, RoundSpec, WorldBuffers};
    use foldprint::digest::CHUNK_ELEMS;
    use foldprint::fold::shard_plan;
    use foldprint::gpu::readback::Reader;
    use foldprint::gpu::{Device, RankCheck};
    let _g = HEAVY.lock().unwrap_or_else(|p| p.into_inner());
    let dev = Device::open(0, CompileOptions::default()).expect("a usable CUDA GPU");
    let main = dev.new_stream().unwrap();
    let (w, n) = (5usize, 3 * CHUNK_ELEMS + 5);
    let plan = shard_plan(n, w).unwrap();
    let bufs = WorldBuffers::<u16>::alloc(&dev, w, n, &plan, 1).unwrap();
    let order: Vec<usize> = (0..w).collect();
    let spec = RoundSpec {
        plan: &plan,
        order: &order,
        mode: kernels::FoldMode::Fixed,
        prog: 0,
        prog_len: 0,
        scale: None,
        variant: KernelVariant::Fast,
        tuning: LaunchTuning::default(),
        generate: Some((Distribution::Uniform, 9)),
        arena: 0,
        dtype: Dtype::Bf16,
        redistribute: true,
    };
    world::run_round(&dev, &main, &[], &bufs, &spec).unwrap();
    let mut readers: Vec<Reader> = (0..3)
        .map(|_| Reader::new(&dev, 1 << 16).unwrap())
        .collect();
    let policy = NanPolicy::Canonical;
    let mut check = |how| {
        world::digest_ranks(
            &dev,
            &mut readers,
            &bufs,
            Dtype::Bf16,
            policy,
            false,
            how,
            None,
            None,
        )
        .unwrap()
    };
    let (d, h) = (check(RankCheck::Device), check(RankCheck::Host));
    assert_eq!((&d.digests, &d.chunks), (&h.digests, &h.chunks));
    assert!(d.differing.is_empty() && d.digests.windows(2).all(|p| p[0] == p[1]));
    assert_eq!(d.chunks.len(), 4);
    let flip = |r: usize, i: usize| {
        let mut v = [0u16; 1];
        bufs.ranks[r].download(i, &mut v).unwrap();
        bufs.ranks[r].upload_at(i, &[v[0] ^ 1]).unwrap();
    };
    flip(3, n - 1);
    flip(1, CHUNK_ELEMS + 6);
    let (d, h) = (check(RankCheck::Device), check(RankCheck::Host));
    assert_eq!(
        d.differing,
        vec![(1usize, vec![1usize]), (3usize, vec![3usize])]
    );
    assert_eq!(h.differing.len(), 2);
    assert_eq!(d.digests, h.digests);
    assert_ne!(d.digests[3], d.digests[0]);
}

/// A reduce-scatter case's run: no rank copies, W shard digests, every
/// round the same.
fn run_scatter(be: &mut dyn Backend, c: &Case, opts: &RunOptions) -> CaseRun {
    let r = be
        .run_case(c, opts)
        .unwrap_or_else(|e| panic!("{} failed on {}: {e}", be.name(), c.id()));
    for a in &r.arenas {
        assert!(a.rank_digests.is_empty(), "{}: {}", be.name(), c.id());
        assert_eq!(a.shard_digests().len(), c.world(), "{}", c.id());
    }
    assert!(
        r.rounds_identical,
        "{}: rounds differ on {}",
        be.name(),
        c.id()
    );
    r
}

/// Every digest a reduce-scatter reports: per arena the shard digests, the
/// gathered digest and the gathered arena's chunk digests.
type ScatterDigests = Vec<(Vec<String>, String, Vec<String>)>;

fn scatter_digests(be: &mut dyn Backend, c: &Case) -> ScatterDigests {
    let s = |d: &foldprint::digest::Sha256| d.to_string();
    run_scatter(be, c, &RunOptions::default())
        .arenas
        .iter()
        .map(|a| {
            (
                a.shard_digests().iter().map(s).collect(),
                s(&a.digest()),
                a.chunks.iter().map(s).collect(),
            )
        })
        .collect()
}

/// A reduce-scatter on the loopback world gives the CPU oracle's shard,
/// gathered and chunk digests, bit for bit: every distribution and host
/// contract, W 1, 3, 7 and 8, sum and mean, f32, bf16 and f16, with
/// lengths that split unevenly, shorter than W, empty, and past one chunk;
/// a delivery order (shuffled, and descending with racing copies) changes
/// nothing in fixed-order.
#[test]
fn reduce_scatter_equals_the_cpu_oracle() {
    use foldprint::fold::Collective;
    let mut be = gpu(DeviceConfig::default());
    let mut cpu = CpuBackend::new();
    let mut ran = 0;
    for dtype in [Dtype::F32, Dtype::Bf16, Dtype::F16] {
        for dist in ALL_DISTRIBUTIONS {
            for contract in ALL_CONTRACTS.into_iter().filter(|c| !c.needs_nccl()) {
                for mean in [false, true] {
                    for w in [1usize, 3, 7, 8] {
                        let c = case(
                            w,
                            vec![10_007, 5, 0, 2 * 65_536 + 13],
                            dist,
                            contract,
                            DeliveryOrder::Shuffle(5),
                            mean,
                        );
                        let c = c
                            .to_builder()
                            .collective(Collective::ReduceScatter)
                            .dtype(Some(dtype))
                            .id(format!("{}-{dtype}-rs", c.id()))
                            .build()
                            .unwrap();
                        assert_eq!(
                            scatter_digests(&mut be, &c),
                            scatter_digests(&mut cpu, &c),
                            "GPU vs CPU on {}",
                            c.id()
                        );
                        ran += 1;
                    }
                }
            }
        }
    }
    // Racing exchange copies and another delivery order: fixed-order bits.
    be.set_copy_streams(4).unwrap();
    for dtype in [Dtype::F32, Dtype::Bf16] {
        let c = case(
            8,
            vec![300_007, 3],
            Distribution::MixedMagnitude,
            Contract::FixedOrder,
            DeliveryOrder::Descending,
            true,
        )
        .to_builder()
        .collective(Collective::ReduceScatter)
        .dtype(Some(dtype))
        .build()
        .unwrap();
        assert_eq!(scatter_digests(&mut be, &c), scatter_digests(&mut cpu, &c));
        ran += 1;
    }
    println!("{ran} reduce-scatter cases equal the CPU oracle");
}

/// On raw bits: each rank's shard of a fixed-order reduce-scatter on the
/// device is the same slice of the device's all-reduce (and the gathered
/// arena the whole all-reduce), in f32 and bf16, sum and mean, W 3 and 7;
/// each shard digest is the digest of that slice. Negative controls: the
/// slice of the next rank (shard r given to rank r+1) has another digest,
/// and so does the arrival-order reduce-scatter in another delivery order.
#[test]
fn reduce_scatter_shards_are_the_all_reduce_slices_on_raw_bits() {
    use foldprint::digest::digest_arena_as;
    use foldprint::fold::{shard_plan, Collective};
    let mut be = gpu(DeviceConfig::default());
    let keep = RunOptions {
        keep_values: true,
        ..RunOptions::default()
    };
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<u32>>();
    for dtype in [Dtype::F32, Dtype::Bf16] {
        for mean in [false, true] {
            for w in [3usize, 7] {
                let n = 100_003;
                let all = case(
                    w,
                    vec![n],
                    Distribution::MixedMagnitude,
                    Contract::FixedOrder,
                    DeliveryOrder::Ascending,
                    mean,
                )
                .to_builder()
                .dtype(Some(dtype))
                .build()
                .unwrap();
                let scatter = all
                    .to_builder()
                    .collective(Collective::ReduceScatter)
                    .build()
                    .unwrap();
                let a = run(&mut be, &all, &keep).arenas.remove(0);
                let s = run_scatter(&mut be, &scatter, &keep).arenas.remove(0);
                let (av, sv) = (a.values.clone().unwrap(), s.values.clone().unwrap());
                assert_eq!(bits(&sv), bits(&av), "{dtype} mean={mean} W={w}");
                assert_eq!(s.digest(), a.digest());
                assert_eq!(s.chunks, a.chunks);
                let plan = shard_plan(n, w).unwrap();
                let policy = keep.nan_policy;
                for (r, sh) in plan.iter().enumerate() {
                    let slice = digest_arena_as(&av[sh.range()], dtype, policy);
                    assert_eq!(s.shard_digests()[r], slice, "{dtype} W={w} shard {r}");
                    // Negative control: shard r+1's slice is not shard r's.
                    let next = plan[(r + 1) % w];
                    let other = digest_arena_as(&av[next.range()], dtype, policy);
                    assert_ne!(s.shard_digests()[r], other, "{dtype} W={w} shard {r}");
                }
            }
        }
    }
    // Negative control: the data can tell the order apart, so equal
    // digests above are no accident of the data.
    let mut arrival = |order| {
        let c = case(
            7,
            vec![100_003],
            Distribution::MixedMagnitude,
            Contract::ArrivalOrder,
            order,
            false,
        )
        .to_builder()
        .collective(Collective::ReduceScatter)
        .build()
        .unwrap();
        scatter_digests(&mut be, &c)
    };
    let (up, down) = (
        arrival(DeliveryOrder::Ascending),
        arrival(DeliveryOrder::Descending),
    );
    assert_ne!(up[0].1, down[0].1);
}

/// A reduce-scatter of rank files with one `expect` file per rank, on the
/// loopback world: every rank's shard equals its file (the files hold the
/// CPU oracle's shards); one element of rank 1's file one ULP off is found
/// in rank 1's file alone.
#[test]
fn reduce_scatter_of_rank_files_checks_each_ranks_expect_file() {
    use foldprint::backend::cpu::CpuBackend as Cpu;
    let dir = tempfile::tempdir().unwrap();
    let n = 70_001;
    for r in 0..3 {
        let v = rank_files::mixed(5, r, 1, n);
        rank_files::write_safetensors(
            &dir.path().join(format!("rank{r}.safetensors")),
            &[rank_files::T::f32("g", &[n], &v)],
        );
    }
    let text = "name = \"rs\"\n[[case]]\nid = \"c\"\naddends = \"rank{rank}.safetensors\"\n\
                collective = \"reduce-scatter\"\nexpect = \"out/rank{rank}.safetensors\"\n";
    let path = dir.path().join("rs.toml");
    // The shards the CPU oracle gives, written as each rank's expect file.
    let plain = "name = \"rs\"\n[[case]]\nid = \"c\"\naddends = \"rank{rank}.safetensors\"\n\
                 collective = \"reduce-scatter\"\n";
    let exp = foldprint::experiment::parse(&path, plain).unwrap();
    let keep = RunOptions {
        keep_values: true,
        ..RunOptions::default()
    };
    let oracle = run_scatter(&mut Cpu::new(), &exp.cases[0], &keep).arenas[0]
        .values
        .clone()
        .unwrap();
    let plan = foldprint::fold::shard_plan(n, 3).unwrap();
    std::fs::create_dir_all(dir.path().join("out")).unwrap();
    let write = |r: usize, edit: bool| {
        let mut s = oracle[plan[r].range()].to_vec();
        if edit {
            s[2] = f32::from_bits(s[2].to_bits() + 1);
        }
        rank_files::write_safetensors(
            &dir.path().join(format!("out/rank{r}.safetensors")),
            &[rank_files::T::f32("g", &[s.len()], &s)],
        );
    };
    for r in 0..3 {
        write(r, false);
    }
    std::fs::write(&path, text).unwrap();
    let verdicts = || -> Vec<bool> {
        // `FOLDPRINT_BIN` names the binary where this test was copied.
        let bin = std::env::var_os("FOLDPRINT_BIN")
            .unwrap_or_else(|| env!("CARGO_BIN_EXE_foldprint").into());
        let o = std::process::Command::new(bin)
            .args(["run", "--backend", "cuda", "--out"])
            .arg(dir.path().join("r.json"))
            .arg(&path)
            .output()
            .unwrap();
        assert!(
            matches!(o.status.code(), Some(0 | 1)),
            "{}",
            String::from_utf8_lossy(&o.stderr)
        );
        let v: serde_json::Value =
            serde_json::from_slice(&std::fs::read(dir.path().join("r.json")).unwrap()).unwrap();
        v["cases"][0]["expect_ranks"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e["equal"].as_bool().unwrap())
            .collect()
    };
    assert_eq!(verdicts(), [true, true, true]);
    write(1, true);
    assert_eq!(verdicts(), [true, false, true]);
}
