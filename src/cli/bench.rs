//! `bench`: host throughput of generate + fold and of SHA-256, with
//! `openssl speed -evp sha256` measured in the same run as the baseline.

use foldprint::exit::{Context, Failure};
type Result<T, E = Failure> = std::result::Result<T, E>;
use clap::Args;
use foldprint::backend::{cpu::CpuBackend, Backend, RunOptions};
use foldprint::data::Distribution;
use foldprint::digest::{digest_arena, ArenaHasher, NanPolicy};
use foldprint::experiment::{Case, DeliveryOrder};
use foldprint::fold::Contract;
use std::time::Instant;

#[derive(Args)]
pub struct BenchArgs {
    /// World size of the fold benchmark (1 or more).
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u32).range(1..=65536))]
    world: u32,
    /// log2 of the arena length of the fold benchmark.
    #[arg(long, default_value_t = 24)]
    log2_len: u32,
    /// MiB hashed by the SHA-256 benchmark (1 or more).
    #[arg(long, default_value_t = 512, value_parser = clap::value_parser!(u32).range(1..=1048576))]
    sha_mib: u32,
    /// Print rows as JSON.
    #[arg(long)]
    json: bool,
    /// `cuda`: time the GPU fold kernel alone (seed and fast variants, plus
    /// a device-to-device copy of the same bytes); `auto` picks cuda when
    /// usable.
    #[arg(long, value_enum, default_value_t = foldprint::backend::BackendChoice::Cpu)]
    backend: foldprint::backend::BackendChoice,
    /// CUDA bench: log2 of the arena length of the end-to-end phase split
    /// (W = 8; 25 is the 1 GiB `experiments/large.toml` case).
    #[arg(long, default_value_t = 25, value_parser = clap::value_parser!(u32).range(0..=31))]
    e2e_log2_len: u32,
    /// NCCL bench, one process: GPUs to use (under a launcher, the launcher decides).
    #[arg(long, default_value_t = 1)]
    gpus: usize,
    /// `cuda`: compile the kernels with NVRTC, neither reading nor writing
    /// the on-disk kernel cache.
    #[arg(long)]
    no_kernel_cache: bool,
}

/// One end-to-end measurement of a case on the CUDA backend.
#[derive(serde::Serialize)]
struct Phases {
    rank_check: &'static str,
    world: usize,
    n: usize,
    /// `CudaBackend::new`: context, library probe, NVRTC (or cache).
    backend_start_ms: f64,
    /// Medians over the rounds after the first (the first allocates).
    generate_ms: f64,
    reduce_ms: f64,
    digest_ms: f64,
    round_ms: f64,
    /// The first round, allocations included: what a one-round `run` waits.
    first_round_ms: f64,
    rounds: u32,
    /// Elements per pinned read-back chunk.
    read_chunk: usize,
    /// Where the digest went (medians over the same rounds).
    digest: DigestSplit,
}

/// Medians of [`foldprint::backend::cuda::world::DigestProfile`] fields.
#[derive(serde::Serialize)]
struct DigestSplit {
    rank_diff_ms: f64,
    copy_wait_ms: f64,
    nan_scan_ms: f64,
    device_nan_scan_ms: f64,
    hash_ms: f64,
    device_chunks_wait_ms: f64,
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}

/// Where a case's time goes on this machine: the large case's phases under
/// both rank checks, each in a fresh backend.
fn end_to_end(world: usize, n: usize, rounds: u32, kernel_cache: bool) -> Result<Vec<Phases>> {
    use foldprint::backend::cuda::world::RankCheck;
    use foldprint::backend::cuda::{CudaBackend, CudaConfig};
    let case = Case {
        experiment: "bench".into(),
        id: "end-to-end".into(),
        world,
        arenas: vec![n],
        order: DeliveryOrder::Ascending,
        seed: 1,
        distribution: Distribution::Uniform,
        contract: Contract::FixedOrder,
        mean: false,
        rounds,
    };
    let mut out = Vec::new();
    let default_chunk = CudaConfig::default().chunk;
    let shapes = [
        (RankCheck::Device, default_chunk),
        // The 8 MiB chunk earlier builds used, for comparison.
        (RankCheck::Device, 1 << 21),
        (RankCheck::Host, default_chunk),
    ];
    for (check, chunk) in shapes {
        let t = Instant::now();
        let mut cfg = CudaConfig {
            rank_check: check,
            chunk,
            ..CudaConfig::default()
        };
        cfg.compile.disk_cache = kernel_cache;
        let mut be = CudaBackend::new(cfg)?;
        let backend_start_ms = t.elapsed().as_secs_f64() * 1e3;
        let run = be.run_case(&case, &RunOptions::default())?;
        let steady = &run.rounds[1.min(run.rounds.len() - 1)..];
        let pick = |f: fn(&foldprint::backend::RoundTimings) -> f64| {
            median(steady.iter().map(f).collect())
        };
        let profiles = be.digest_profiles();
        let steady_profiles = &profiles[1.min(profiles.len().saturating_sub(1))..];
        let split = |f: fn(&foldprint::backend::cuda::world::DigestProfile) -> f64| {
            median(steady_profiles.iter().map(f).collect())
        };
        let digest = DigestSplit {
            rank_diff_ms: split(|p| p.rank_diff_ms),
            copy_wait_ms: split(|p| p.read.copy_wait_ms),
            nan_scan_ms: split(|p| p.read.nan_scan_ms),
            device_nan_scan_ms: split(|p| p.read.device_nan_scan_ms),
            hash_ms: split(|p| p.read.hash_ms),
            device_chunks_wait_ms: split(|p| p.device_chunks_wait_ms),
        };
        out.push(Phases {
            rank_check: match check {
                RankCheck::Device => "device",
                RankCheck::Host => "host",
            },
            world,
            n,
            backend_start_ms,
            generate_ms: pick(|r| r.generate_ms),
            reduce_ms: pick(|r| r.reduce_ms),
            digest_ms: pick(|r| r.digest_ms),
            round_ms: pick(|r| r.total_ms),
            first_round_ms: run.rounds[0].total_ms,
            rounds,
            read_chunk: chunk,
            digest,
        });
    }
    Ok(out)
}

/// The GPU fold benchmark (src/backend/cuda/bench.rs), printed.
fn run_cuda(json: bool, kernel_cache: bool, e2e_log2_len: u32) -> Result<i32> {
    use foldprint::gpu::bench::{bench_fold, BenchConfig};
    let mut cfg = BenchConfig::default();
    cfg.compile.disk_cache = kernel_cache;
    let report = bench_fold(&cfg)?;
    let n = 1usize
        .checked_shl(e2e_log2_len)
        .filter(|_| e2e_log2_len <= 31)
        .context("--e2e-log2-len must be at most 31")?;
    let phases = end_to_end(8, n, 5, kernel_cache).context("end-to-end phases")?;
    if json {
        let mut v = serde_json::to_value(&report)?;
        if let Some(o) = v.as_object_mut() {
            o.insert("end_to_end".into(), serde_json::to_value(&phases)?);
        }
        outln!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(0);
    }
    let s = &report.startup;
    outln!(
        "start: probe {:.1} ms · device queries {:.1} ms · context {:.1} ms ∥ kernel images {:.1} ms = {:.1} ms side by side · kernels {:.1} ms (NVRTC {:.1}, cache {:.1}, module load {:.1})",
        s.probe,
        s.queries,
        s.context,
        s.images,
        s.overlapped,
        s.programs,
        s.nvrtc_compile,
        s.kernel_cache,
        s.module_load
    );
    for o in &report.kernel_cache {
        outln!(
            "  {}: {}{}",
            o.program,
            if o.from_cache {
                "from cache"
            } else {
                "compiled"
            },
            o.key
                .as_deref()
                .map(|k| format!(", key {k}"))
                .unwrap_or_default()
        );
    }
    outln!(
        "{} · driver {} · NVRTC {} · {}",
        report.device,
        report.driver,
        report.nvrtc,
        report.target
    );
    outln!(
        "{:>3} {:>9} {:<9} {:>10} {:>10} {:>7} BITS",
        "W",
        "n",
        "WHAT",
        "MEDIAN ms",
        "MIN ms",
        "TB/s"
    );
    for r in &report.rows {
        outln!(
            "{:>3} {:>9} {:<9} {:>10.4} {:>10.4} {:>7.3} {}",
            r.world,
            r.n,
            r.what,
            r.median_ms,
            r.min_ms,
            r.effective_tb_s,
            r.bits_ok.map_or("-", |ok| if ok { "ok" } else { "DIFFER" })
        );
    }
    outln!();
    outln!(
        "end to end: W=8 n=2^{e2e_log2_len} ({} MiB of addends), median of rounds 2..{}; first round includes allocation",
        (8u64 * n as u64 * 4) >> 20,
        phases.first().map_or(0, |p| p.rounds)
    );
    outln!(
        "{:<11} {:>10} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9}",
        "RANK CHECK",
        "READ CHUNK",
        "START ms",
        "GEN ms",
        "REDUCE ms",
        "DIGEST ms",
        "ROUND ms",
        "FIRST ms"
    );
    for p in &phases {
        outln!(
            "{:<11} {:>10} {:>9.1} {:>9.2} {:>9.2} {:>9.1} {:>9.1} {:>9.1}",
            p.rank_check,
            format!("{} KiB", p.read_chunk * 4 / 1024),
            p.backend_start_ms,
            p.generate_ms,
            p.reduce_ms,
            p.digest_ms,
            p.round_ms,
            p.first_round_ms
        );
    }
    outln!();
    outln!("digest split (ms; host figures are the slowest read-back thread's):");
    outln!(
        "{:<11} {:>10} {:>10} {:>12} {:>10} {:>13} {:>10} {:>11}",
        "RANK CHECK",
        "READ CHUNK",
        "RANK DIFF",
        "GPU NaN SCAN",
        "COPY WAIT",
        "HOST NaN SCAN",
        "SHA-256",
        "GPU CHUNKS"
    );
    for p in &phases {
        let d = &p.digest;
        outln!(
            "{:<11} {:>10} {:>10.2} {:>12.2} {:>10.2} {:>13.2} {:>10.1} {:>11.2}",
            p.rank_check,
            format!("{} KiB", p.read_chunk * 4 / 1024),
            d.rank_diff_ms,
            d.device_nan_scan_ms,
            d.copy_wait_ms,
            d.nan_scan_ms,
            d.hash_ms,
            d.device_chunks_wait_ms
        );
    }
    Ok(if report.rows.iter().any(|r| r.bits_ok == Some(false)) {
        1
    } else {
        0
    })
}

#[derive(serde::Serialize)]
struct Row {
    what: String,
    threads: usize,
    bytes: u64,
    seconds: f64,
    gb_per_s: f64,
}

fn fold_row(case: &Case, threads: usize) -> Result<Row> {
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .map_err(|e| Failure::Unavailable(format!("building a thread pool: {e}")))?;
    let mut be = CpuBackend::new();
    let run = pool.install(|| be.run_case(case, &RunOptions::default()))?;
    let best = run
        .rounds
        .iter()
        .map(|t| t.generate_ms + t.reduce_ms)
        .fold(f64::INFINITY, f64::min)
        / 1e3;
    let bytes = case.addend_bytes();
    Ok(Row {
        what: format!(
            "generate + fold, W={} n=2^{}",
            case.world,
            case.arenas[0].trailing_zeros()
        ),
        threads,
        bytes,
        seconds: best,
        gb_per_s: bytes as f64 / best / 1e9,
    })
}

fn openssl_row() -> Option<Row> {
    let out = std::process::Command::new("openssl")
        .args([
            "speed", "-evp", "sha256", "-bytes", "16384", "-seconds", "3",
        ])
        .output()
        .ok()?;
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text.lines().rev().find(|l| l.starts_with("sha256"))?;
    let k: f64 = line
        .split_whitespace()
        .last()?
        .trim_end_matches('k')
        .parse()
        .ok()?;
    Some(Row {
        what: "openssl speed -evp sha256 (16 KiB blocks)".into(),
        threads: 1,
        bytes: 0,
        seconds: 3.0,
        gb_per_s: k * 1e3 / 1e9,
    })
}

/// Fixed-order reduction next to ncclAllReduce, 1 MiB to 1 GiB.
fn run_nccl(gpus: usize, json: bool) -> Result<i32> {
    use foldprint::backend::nccl::{NcclBackend, NcclConfig};
    let mut be = NcclBackend::new(NcclConfig {
        cuda: Default::default(),
        gpus,
        init_timeout: std::time::Duration::from_secs(120),
        timeout: std::time::Duration::from_secs(300),
        plan: foldprint::ranks::rendezvous::Plan::new(&["bench".into()], "nccl bench"),
    })?;
    let sizes: Vec<usize> = (18..=28).map(|k| 1usize << k).collect(); // 1 MiB .. 1 GiB of f32
    let rows = be.bench(&sizes, 20)?;
    if !be.is_reporting_rank() {
        return Ok(0);
    }
    let emulated = foldprint::backend::nccl::facts::emulated_hosts();
    if json {
        let v = serde_json::json!({
            "world": be.world(),
            "emulated_hosts": emulated,
            "bandwidth_result": emulated.is_none(),
            "rows": rows,
        });
        outln!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(0);
    }
    if let Some(e) = &emulated {
        outln!(
            "NOT A BANDWIDTH RESULT: emulated hosts ({}); NCCL moved every byte over its socket transport on loopback",
            e["layout"].as_str().unwrap_or("?")
        );
    }
    outln!(
        "NCCL world of {} rank(s); median of 20; busbw = algbw x 2(W-1)/W",
        be.world()
    );
    outln!(
        "{:>12} {:>12} {:>10} {:>10} {:>14} {:>10} {:>10}",
        "BYTES",
        "FIXED ms",
        "algbw",
        "busbw",
        "ALLREDUCE ms",
        "algbw",
        "busbw"
    );
    for r in &rows {
        outln!(
            "{:>12} {:>12.4} {:>10.2} {:>10.2} {:>14.4} {:>10.2} {:>10.2}",
            r.bytes,
            r.fixed_ms,
            r.fixed_algbw,
            r.fixed_busbw,
            r.allreduce_ms,
            r.allreduce_algbw,
            r.allreduce_busbw
        );
    }
    Ok(0)
}

pub fn run(a: BenchArgs) -> Result<i32> {
    use foldprint::backend::BackendChoice;
    match a.backend {
        BackendChoice::Cuda => return run_cuda(a.json, !a.no_kernel_cache, a.e2e_log2_len),
        BackendChoice::Nccl => return run_nccl(a.gpus, a.json),
        BackendChoice::Auto if foldprint::gpu::probe().usable => {
            return run_cuda(a.json, !a.no_kernel_cache, a.e2e_log2_len)
        }
        BackendChoice::Auto => {
            eprintln!("note: auto: CUDA not usable here; measuring the CPU oracle");
        }
        BackendChoice::Cpu => {}
    }
    super::start_threads()?;
    let n = 1usize
        .checked_shl(a.log2_len)
        .filter(|_| a.log2_len <= 32)
        .context("--log2-len must be at most 32")?;
    let case = Case {
        experiment: "bench".into(),
        id: "bench".into(),
        world: a.world as usize,
        arenas: vec![n],
        order: DeliveryOrder::Descending,
        seed: 1,
        distribution: Distribution::MixedMagnitude,
        contract: Contract::FixedOrder,
        mean: false,
        rounds: 3,
    };
    let all = rayon::current_num_threads();
    // Progress on stderr: the table comes only at the end.
    eprintln!("bench: fold, 1 thread ...");
    let mut rows = vec![fold_row(&case, 1)?];
    if all > 1 {
        eprintln!("bench: fold, {all} threads ...");
        rows.push(fold_row(&case, all)?);
    }
    eprintln!("bench: SHA-256 digest path ...");

    // Streaming: one large arena from memory, as a run hashes it.
    let values: Vec<f32> = (0..a.sha_mib as usize * (1 << 18))
        .map(|i| i as f32)
        .collect();
    let bytes = (values.len() * 4) as u64;
    let t = Instant::now();
    let _ = digest_arena(&values, NanPolicy::Canonical);
    let s = t.elapsed().as_secs_f64();
    rows.push(Row {
        what: format!("sha256 digest path, {} MiB arena (streaming)", a.sha_mib),
        threads: 1,
        bytes,
        seconds: s,
        gb_per_s: bytes as f64 / s / 1e9,
    });
    // In cache: 16 KiB blocks hashed repeatedly, the way `openssl speed` measures.
    let block = &values[..4096];
    let reps = (bytes / 16384).max(1);
    let t = Instant::now();
    let mut h = ArenaHasher::new(NanPolicy::Canonical);
    for _ in 0..reps {
        h.update(block);
    }
    let _ = h.finish();
    let s = t.elapsed().as_secs_f64();
    rows.push(Row {
        what: "sha256 digest path, 16 KiB blocks (in cache)".into(),
        threads: 1,
        bytes: reps * 16384,
        seconds: s,
        gb_per_s: (reps * 16384) as f64 / s / 1e9,
    });
    eprintln!("bench: openssl speed baseline ...");
    match openssl_row() {
        Some(r) => rows.push(r),
        None => eprintln!("note: `openssl speed` is not available here; no SHA-256 baseline"),
    }
    if a.json {
        outln!("{}", serde_json::to_string_pretty(&rows)?);
    } else {
        outln!(
            "{:<48} {:>7} {:>10} {:>9}",
            "WHAT",
            "THREADS",
            "SECONDS",
            "GB/s"
        );
        for r in &rows {
            outln!(
                "{:<48} {:>7} {:>10.3} {:>9.2}",
                r.what,
                r.threads,
                r.seconds,
                r.gb_per_s
            );
        }
    }
    Ok(0)
}
