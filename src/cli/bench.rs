//! `bench`: arguments and printing; what is measured lives in
//! `foldprint::bench`.

use foldprint::bench::cpu;
use foldprint::exit::{Context, Failure};
type Result<T, E = Failure> = std::result::Result<T, E>;
use clap::Args;

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
    #[arg(long, default_value = "cpu", value_parser = super::args::BackendParser)]
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
    /// Time a case of rank files (W = --world files of 2^--log2-len
    /// elements, float32 npy or, with -d, bf16/f16 safetensors, written to
    /// a temporary directory and read from the page cache) next to the
    /// same case from the generator, on --backend cpu or cuda: each case
    /// end to end, and whole `foldprint run`s.
    #[arg(long)]
    inputs: bool,
    /// NCCL sweep (as nccl-tests' -b): the smallest buffer per rank, in
    /// bytes; K, M, G are powers of 1024 [default: 1M].
    #[arg(short = 'b', long = "minbytes", value_parser = parse_size)]
    minbytes: Option<u64>,
    /// NCCL sweep (-e): the largest buffer per rank, in bytes [default: 1G].
    #[arg(short = 'e', long = "maxbytes", value_parser = parse_size)]
    maxbytes: Option<u64>,
    /// NCCL sweep (-f): each size is the previous one times this (2 or more)
    /// [default: 2].
    #[arg(short = 'f', long = "stepfactor")]
    stepfactor: Option<u64>,
    /// The dtype reduced: f32, bf16 or f16 (NCCL sweep, CUDA fold rows and
    /// the copy beside them, the rank files of --inputs) [default: f32].
    #[arg(short = 'd', long = "datatype", value_parser = parse_dtype)]
    datatype: Option<foldprint::dtype::Dtype>,
    /// NCCL sweep (-n): timed repetitions per size; each row is their median
    /// [default: 20].
    #[arg(short = 'n', long = "iters")]
    iters: Option<usize>,
    /// NCCL sweep: print the rows as CSV (one header line, then a row per
    /// size) instead of the table.
    #[arg(long)]
    csv: bool,
    /// NCCL sweep: `all-reduce` (fixed-order next to ncclAllReduce), or
    /// `reduce-scatter` (fixed-order reduce-scatter next to
    /// ncclReduceScatter and the fixed-order all-reduce of the same size)
    /// [default: all-reduce].
    #[arg(long, value_parser = parse_collective)]
    collective: Option<foldprint::fold::Collective>,
}

fn parse_collective(s: &str) -> std::result::Result<foldprint::fold::Collective, String> {
    s.parse()
}

fn parse_size(s: &str) -> std::result::Result<u64, String> {
    foldprint::bench::nccl::parse_bytes(s)
}

fn parse_dtype(s: &str) -> std::result::Result<foldprint::dtype::Dtype, String> {
    s.parse()
}

/// The GPU fold benchmark and the end-to-end phases, printed.
fn run_cuda(
    json: bool,
    kernel_cache: bool,
    e2e_log2_len: u32,
    dtype: foldprint::dtype::Dtype,
) -> Result<i32> {
    use foldprint::bench::cuda::{end_to_end, kernel_rows};
    let report = kernel_rows(kernel_cache, dtype)?;
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
        "{:>3} {:>9} {:<5} {:<9} {:>10} {:>10} {:>7} BITS",
        "W",
        "n",
        "TYPE",
        "WHAT",
        "MEDIAN ms",
        "MIN ms",
        "TB/s"
    );
    for r in &report.rows {
        outln!(
            "{:>3} {:>9} {:<5} {:<9} {:>10.4} {:>10.4} {:>7.3} {}",
            r.world,
            r.n,
            r.dtype,
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

/// The sweep the arguments ask for (nccl-tests' flags and defaults of
/// this bench: 1M to 1G, factor 2, f32, 20 repetitions).
fn sweep(a: &BenchArgs) -> Result<foldprint::bench::nccl::Sweep> {
    use foldprint::bench::nccl::{Sweep, ITERS};
    Sweep::new(
        a.minbytes.unwrap_or(1 << 20),
        a.maxbytes.unwrap_or(1 << 30),
        a.stepfactor.unwrap_or(2),
        a.datatype.unwrap_or_default(),
        a.iters.unwrap_or(ITERS),
    )
    .map(|s| s.with_collective(a.collective.unwrap_or_default()))
    .map_err(Failure::Refused)
}

/// Fixed-order reduction next to ncclAllReduce over the sweep, in
/// nccl-tests' columns, with the bits of both results counted.
fn run_nccl(gpus: usize, a: &BenchArgs) -> Result<i32> {
    use foldprint::bench::nccl::show_bytes;
    let sweep = sweep(a)?;
    let bench = foldprint::bench::nccl::run(gpus, &sweep)?;
    if !bench.reporting {
        return Ok(0);
    }
    if !sweep.collective.is_all_reduce() {
        return print_scatter(&bench, &sweep, a);
    }
    let not_bandwidth = bench.not_bandwidth();
    let failed = bench
        .rows
        .iter()
        .any(|r| r.fixed_vs_oracle != Some(0) || r.fixed_ranks_differing != 0);
    let count = |c: Option<u64>| c.map_or("-".to_string(), |c| c.to_string());
    if a.json {
        let v = serde_json::json!({
            "world": bench.world,
            "emulated_hosts": bench.emulated_hosts,
            "bandwidth_result": not_bandwidth.is_none(),
            "not_bandwidth": not_bandwidth,
            "rows": bench.rows,
        });
        outln!("{}", serde_json::to_string_pretty(&v)?);
    } else if a.csv {
        if let Some(why) = &not_bandwidth {
            eprintln!("NOT A BANDWIDTH RESULT: {why}");
        }
        outln!("size_bytes,count,type,redop,world,fixed_time_us,fixed_algbw_gbs,fixed_busbw_gbs,fixed_diff_vs_oracle,nccl_time_us,nccl_algbw_gbs,nccl_busbw_gbs,nccl_diff_vs_fixed,bandwidth_result");
        for r in &bench.rows {
            outln!(
                "{},{},{},sum,{},{:.2},{:.3},{:.3},{},{:.2},{:.3},{:.3},{},{}",
                r.bytes,
                r.count,
                r.dtype,
                r.world,
                r.fixed_ms * 1e3,
                r.fixed_algbw,
                r.fixed_busbw,
                count(r.fixed_vs_oracle),
                r.allreduce_ms * 1e3,
                r.allreduce_algbw,
                r.allreduce_busbw,
                count(r.allreduce_vs_fixed),
                not_bandwidth.is_none()
            );
        }
    } else {
        if let Some(why) = &not_bandwidth {
            outln!("# NOT A BANDWIDTH RESULT: {why}");
        }
        outln!(
            "# foldprint bench --backend nccl -b {} -e {} -f {} -d {} -n {}: {} rank(s), median of {} per size",
            show_bytes(sweep.min_bytes),
            show_bytes(sweep.max_bytes),
            sweep.factor,
            sweep.dtype,
            sweep.iters,
            bench.world,
            sweep.iters
        );
        outln!("# busbw = algbw x 2(W-1)/W; #diff: fixed-order elements whose bits differ from the CPU oracle (must be 0), NCCL's elements whose bits differ from fixed-order (its drift)");
        outln!("#");
        outln!(
            "# {:>10} {:>12} {:>6} {:>6}   {:^41}   {:^41}",
            "",
            "",
            "",
            "",
            "fixed-order",
            "ncclAllReduce (in-place)"
        );
        outln!(
            "# {:>10} {:>12} {:>6} {:>6}   {:>10} {:>8} {:>8} {:>11}   {:>10} {:>8} {:>8} {:>11}",
            "size",
            "count",
            "type",
            "redop",
            "time",
            "algbw",
            "busbw",
            "#diff",
            "time",
            "algbw",
            "busbw",
            "#diff"
        );
        outln!(
            "# {:>10} {:>12} {:>6} {:>6}   {:>10} {:>8} {:>8} {:>11}   {:>10} {:>8} {:>8} {:>11}",
            "(B)",
            "(elements)",
            "",
            "",
            "(us)",
            "(GB/s)",
            "(GB/s)",
            "vs oracle",
            "(us)",
            "(GB/s)",
            "(GB/s)",
            "vs fixed"
        );
        for r in &bench.rows {
            let fixed = if r.fixed_ranks_differing > 0 {
                format!("{} {}R", count(r.fixed_vs_oracle), r.fixed_ranks_differing)
            } else {
                count(r.fixed_vs_oracle)
            };
            outln!(
                "  {:>10} {:>12} {:>6} {:>6}   {:>10.1} {:>8.2} {:>8.2} {:>11}   {:>10.1} {:>8.2} {:>8.2} {:>11}",
                r.bytes,
                r.count,
                r.dtype.name(),
                "sum",
                r.fixed_ms * 1e3,
                r.fixed_algbw,
                r.fixed_busbw,
                fixed,
                r.allreduce_ms * 1e3,
                r.allreduce_algbw,
                r.allreduce_busbw,
                count(r.allreduce_vs_fixed)
            );
        }
        let avg = |f: fn(&foldprint::bench::nccl::NcclBenchRow) -> f64| {
            bench.rows.iter().map(f).sum::<f64>() / bench.rows.len().max(1) as f64
        };
        outln!(
            "# Avg bus bandwidth: fixed-order {:.3} GB/s, ncclAllReduce {:.3} GB/s",
            avg(|r| r.fixed_busbw),
            avg(|r| r.allreduce_busbw)
        );
        if failed {
            outln!("# FAILED: a fixed-order result differs from the CPU oracle or between ranks (a suffix nR counts the ranks whose copy differs from rank 0's)");
        }
    }
    Ok(if failed { 1 } else { 0 })
}

/// The reduce-scatter sweep: fixed-order reduce-scatter, ncclReduceScatter
/// (where W divides the count) and the fixed-order all-reduce of the same
/// arena, with the bits of both reduce-scatters counted.
fn print_scatter(
    bench: &foldprint::bench::nccl::NcclBench,
    sweep: &foldprint::bench::nccl::Sweep,
    a: &BenchArgs,
) -> Result<i32> {
    use foldprint::bench::nccl::show_bytes;
    let not_bandwidth = bench.not_bandwidth();
    let rows = &bench.scatter_rows;
    let failed = rows.iter().any(|r| r.fixed_vs_oracle != Some(0));
    let count = |c: Option<u64>| c.map_or("-".to_string(), |c| c.to_string());
    let opt = |v: Option<f64>, scale: f64, digits: usize| {
        v.map_or("-".to_string(), |v| format!("{:.*}", digits, v * scale))
    };
    if a.json {
        let v = serde_json::json!({
            "world": bench.world,
            "collective": "reduce-scatter",
            "emulated_hosts": bench.emulated_hosts,
            "bandwidth_result": not_bandwidth.is_none(),
            "not_bandwidth": not_bandwidth,
            "rows": rows,
        });
        outln!("{}", serde_json::to_string_pretty(&v)?);
    } else if a.csv {
        if let Some(why) = &not_bandwidth {
            eprintln!("NOT A BANDWIDTH RESULT: {why}");
        }
        outln!("size_bytes,count,type,redop,world,fixed_time_us,fixed_algbw_gbs,fixed_busbw_gbs,fixed_diff_vs_oracle,nccl_time_us,nccl_algbw_gbs,nccl_busbw_gbs,nccl_diff_vs_fixed,allreduce_time_us,bandwidth_result");
        for r in rows {
            outln!(
                "{},{},{},sum,{},{:.2},{:.3},{:.3},{},{},{},{},{},{:.2},{}",
                r.bytes,
                r.count,
                r.dtype,
                r.world,
                r.fixed_ms * 1e3,
                r.fixed_algbw,
                r.fixed_busbw,
                count(r.fixed_vs_oracle),
                opt(r.reducescatter_ms, 1e3, 2),
                opt(r.reducescatter_algbw, 1.0, 3),
                opt(r.reducescatter_busbw, 1.0, 3),
                count(r.reducescatter_vs_fixed),
                r.allreduce_ms * 1e3,
                not_bandwidth.is_none()
            );
        }
    } else {
        if let Some(why) = &not_bandwidth {
            outln!("# NOT A BANDWIDTH RESULT: {why}");
        }
        outln!(
            "# foldprint bench --backend nccl --collective reduce-scatter -b {} -e {} -f {} -d {} -n {}: {} rank(s), median of {} per size",
            show_bytes(sweep.min_bytes),
            show_bytes(sweep.max_bytes),
            sweep.factor,
            sweep.dtype,
            sweep.iters,
            bench.world,
            sweep.iters
        );
        outln!("# size: one rank's whole arena; busbw = algbw x (W-1)/W; #diff: elements of the shards gathered on rank 0 whose bits differ from the CPU oracle (fixed-order, must be 0) or from fixed-order (NCCL's drift); ncclReduceScatter needs W equal shards (`-` where W does not divide the count); all-reduce: the fixed-order all-reduce of the same arena");
        outln!("#");
        outln!(
            "# {:>10} {:>12} {:>6} {:>6}   {:^41}   {:^41}   {:^10}",
            "",
            "",
            "",
            "",
            "fixed-order reduce-scatter",
            "ncclReduceScatter (in-place)",
            "all-reduce"
        );
        outln!(
            "# {:>10} {:>12} {:>6} {:>6}   {:>10} {:>8} {:>8} {:>11}   {:>10} {:>8} {:>8} {:>11}   {:>10}",
            "size", "count", "type", "redop", "time", "algbw", "busbw", "#diff", "time", "algbw",
            "busbw", "#diff", "time"
        );
        outln!(
            "# {:>10} {:>12} {:>6} {:>6}   {:>10} {:>8} {:>8} {:>11}   {:>10} {:>8} {:>8} {:>11}   {:>10}",
            "(B)", "(elements)", "", "", "(us)", "(GB/s)", "(GB/s)", "vs oracle", "(us)",
            "(GB/s)", "(GB/s)", "vs fixed", "(us)"
        );
        for r in rows {
            outln!(
                "  {:>10} {:>12} {:>6} {:>6}   {:>10.1} {:>8.2} {:>8.2} {:>11}   {:>10} {:>8} {:>8} {:>11}   {:>10.1}",
                r.bytes,
                r.count,
                r.dtype.name(),
                "sum",
                r.fixed_ms * 1e3,
                r.fixed_algbw,
                r.fixed_busbw,
                count(r.fixed_vs_oracle),
                opt(r.reducescatter_ms, 1e3, 1),
                opt(r.reducescatter_algbw, 1.0, 2),
                opt(r.reducescatter_busbw, 1.0, 2),
                count(r.reducescatter_vs_fixed),
                r.allreduce_ms * 1e3
            );
        }
        if failed {
            outln!("# FAILED: a fixed-order reduce-scatter differs from the CPU oracle");
        }
    }
    Ok(if failed { 1 } else { 0 })
}

/// Flags of the NCCL sweep given to another backend: a usage error, so a
/// sweep never silently measures something else.
fn refuse_sweep_flags(a: &BenchArgs) -> Result<()> {
    let given: Vec<&str> = [
        (a.minbytes.is_some(), "-b"),
        (a.maxbytes.is_some(), "-e"),
        (a.stepfactor.is_some(), "-f"),
        (a.iters.is_some(), "-n"),
        (a.csv, "--csv"),
        (a.collective.is_some(), "--collective"),
        (
            a.datatype.is_some()
                && !a.inputs
                && !matches!(
                    a.backend,
                    foldprint::backend::BackendChoice::Cuda
                        | foldprint::backend::BackendChoice::Auto
                ),
            "-d",
        ),
    ]
    .into_iter()
    .filter_map(|(on, f)| on.then_some(f))
    .collect();
    if given.is_empty() {
        return Ok(());
    }
    Err(Failure::Refused(format!(
        "{} belong(s) to the NCCL sweep: add --backend nccl (-d also picks the dtype of --inputs and of --backend cuda's fold rows)",
        given.join(", ")
    )))
}

/// A thread pool the host cannot give us is `Unavailable`, as it was.
pub fn run(a: BenchArgs) -> Result<i32> {
    use foldprint::backend::BackendChoice;
    if a.backend != BackendChoice::Nccl || a.inputs {
        refuse_sweep_flags(&a)?;
    }
    if a.inputs {
        return run_inputs(&a);
    }
    match a.backend {
        BackendChoice::Cuda => {
            return run_cuda(
                a.json,
                !a.no_kernel_cache,
                a.e2e_log2_len,
                a.datatype.unwrap_or_default(),
            )
        }
        BackendChoice::Nccl => return run_nccl(a.gpus, &a),
        BackendChoice::Auto if foldprint::gpu::probe().usable => {
            return run_cuda(
                a.json,
                !a.no_kernel_cache,
                a.e2e_log2_len,
                a.datatype.unwrap_or_default(),
            )
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
    let case = cpu::fold_case(a.world as usize, n)?;
    let all = rayon::current_num_threads();
    // Progress on stderr: the table comes only at the end.
    eprintln!("bench: fold, 1 thread ...");
    let mut rows = vec![cpu::fold_row(&case, 1)?];
    if all > 1 {
        eprintln!("bench: fold, {all} threads ...");
        rows.push(cpu::fold_row(&case, all)?);
    }
    eprintln!("bench: SHA-256 digest path ...");
    rows.extend(cpu::sha_rows(a.sha_mib));
    eprintln!("bench: openssl speed baseline ...");
    match cpu::openssl_row() {
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

/// Whole runs timed per experiment of `bench --inputs`, alternating.
const INPUT_RUNS: usize = 5;

/// `bench --inputs`: rank files next to the generator, per case on one
/// backend, then as whole `foldprint run`s (fresh processes, as users run
/// them: a run hashes its rank files while its backend starts).
fn run_inputs(a: &BenchArgs) -> Result<i32> {
    use foldprint::backend::{self, BackendChoice};
    use foldprint::bench::inputs;
    super::start_threads()?;
    let n = 1usize
        .checked_shl(a.log2_len)
        .filter(|_| a.log2_len <= 32)
        .context("--log2-len must be at most 32")?;
    let choice = match a.backend {
        BackendChoice::Nccl => {
            return Err(Failure::Refused(
                "bench --inputs runs on --backend cpu or cuda (one process)".into(),
            ))
        }
        other => other,
    };
    let (mut be, note) =
        foldprint::run::start_backend(choice, &backend::BackendOptions::default())?;
    if let Some(n) = note {
        eprintln!("note: {n}");
    }
    let dir = tempfile::Builder::new()
        .prefix("foldprint-bench-inputs")
        .tempdir()
        .context("making a temporary directory for the rank files")?;
    eprintln!(
        "bench: writing {} rank files of {} MiB ...",
        a.world,
        (n as u64 * a.datatype.unwrap_or_default().bytes() as u64) >> 20
    );
    let dtype = a.datatype.unwrap_or_default();
    let r = inputs::compare(be.as_mut(), a.world as usize, n, dtype, 5, dir.path())?;
    let name = be.name();
    drop(be);
    // Whole runs, each its own process, one after the other.
    let exe = std::env::current_exe().context("finding this foldprint binary")?;
    let mut times = [Vec::new(), Vec::new()];
    for _ in 0..INPUT_RUNS {
        for (k, e) in [inputs::FILES_EXPERIMENT, inputs::GENERATOR_EXPERIMENT]
            .iter()
            .enumerate()
        {
            let t = std::time::Instant::now();
            let status = std::process::Command::new(&exe)
                .args(["run", "--backend", name, "--json"])
                .arg(dir.path().join(e))
                .stdout(std::process::Stdio::null())
                .status()
                .context("starting foldprint run")?;
            if !status.success() {
                return Err(Failure::CheckFailed(format!(
                    "`foldprint run` of the benchmark's {e} failed ({status})"
                )));
            }
            times[k].push(t.elapsed().as_secs_f64() * 1e3);
        }
    }
    // Shown sorted, fastest first.
    for t in &mut times {
        t.sort_by(f64::total_cmp);
    }
    let median = |v: &[f64]| foldprint::bench::median(v.to_vec());
    let (files_run, generator_run) = (median(&times[0]), median(&times[1]));
    if a.json {
        let mut v = serde_json::to_value(&r)?;
        if let Some(o) = v.as_object_mut() {
            o.insert("files_run_ms".into(), serde_json::json!(times[0]));
            o.insert("generator_run_ms".into(), serde_json::json!(times[1]));
        }
        outln!("{}", serde_json::to_string_pretty(&v)?);
    } else {
        outln!(
            "inputs: backend {} · W={} n=2^{} {} · {} MiB of addends · median of rounds 2..{}",
            r.backend,
            r.world,
            a.log2_len,
            r.dtype,
            r.bytes >> 20,
            r.rounds
        );
        outln!(
            "{:<10} {:>17} {:>13} {:>9} {:>9} {:>9}",
            "ADDENDS",
            "PASS in/hashed ms",
            "UPLOAD/GEN ms",
            "ROUND ms",
            "SENS ms",
            "CASE ms"
        );
        outln!(
            "{:<10} {:>17} {:>13.1} {:>9.1} {:>9.1} {:>9.1}",
            "files",
            format!("{:.1} / {:.1}", r.files_read_ms, r.files_hash_ms),
            r.files_upload_ms,
            r.files_round_ms,
            r.files_sensitivity_ms,
            r.files_case_ms
        );
        outln!(
            "{:<10} {:>17} {:>13.1} {:>9.1} {:>9.1} {:>9.1}",
            "generator",
            "-",
            r.generator_generate_ms,
            r.generator_round_ms,
            r.generator_sensitivity_ms,
            r.generator_case_ms
        );
        outln!(
            "CASE: end to end, median of {} (files: opening to every digest known, the hashing behind the round; its round and sensitivity done at {:.1} ms)",
            foldprint::bench::inputs::CASE_REPS,
            r.files_case_round_ms
        );
        outln!(
            "files' round in that case: {:.1} ms (upload through the files' end checks {:.1} ms, digests {:.1} ms)",
            r.files_cold_round_ms,
            r.files_cold_upload_ms,
            r.files_cold_digest_ms
        );
        outln!(
            "files / generator: {:.2}x per case · digests {} · sensitivity {}",
            r.ratio,
            if r.same_digests { "equal" } else { "DIFFER" },
            if r.same_sensitivity {
                "equal"
            } else {
                "differs"
            }
        );
        let show = |v: &[f64]| {
            v.iter()
                .map(|t| format!("{t:.0}"))
                .collect::<Vec<_>>()
                .join(" ")
        };
        outln!(
            "whole `foldprint run`s (ms, one process each): files {} · generator {}",
            show(&times[0]),
            show(&times[1])
        );
        outln!(
            "files / generator: {:.2}x per run (medians {files_run:.0} and {generator_run:.0} ms)",
            files_run / generator_run
        );
    }
    // The sensitivity of a generated 16-bit case is measured on the
    // generator's float32 values, of the files on the dtype's: only f32
    // sensitivities must be equal.
    let same = r.same_digests && (r.same_sensitivity || !r.dtype.is_f32());
    Ok(if same { 0 } else { 1 })
}
