//! CLI edge: argument parsing, exit codes, and human or JSON output.
//!
//! Exit codes: 0 all checks passed; 1 a check failed (digest mismatch,
//! invariance violated, golden differs); 2 bad input (experiment, report,
//! arguments); 3 the environment cannot run it (backend or library missing,
//! not enough memory).

mod audit;
mod bench;
mod doctor;
mod table;

use anyhow::{Context, Result};
use clap::{Args, Parser, Subcommand};
use foldprint::backend::{self, BackendChoice};
use foldprint::digest::NanPolicy;
use foldprint::experiment::{self, Experiment};
use foldprint::report::{compare, Golden, Report};
use foldprint::runner::{self, RunConfig};
use std::io::IsTerminal;
use std::path::PathBuf;

#[derive(Parser)]
#[command(
    name = "foldprint",
    version,
    about = "Bitwise-reproducible fixed-order float32 reduction, with SHA-256 digests of the reduced arenas"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run experiments and print digests, invariance groups and sensitivities.
    Run(RunArgs),
    /// Compare reports by case key; exit 1 on any difference.
    Compare(CompareArgs),
    /// Run experiments and check their digests against committed goldens.
    Verify(VerifyArgs),
    /// Regenerate golden digests from the CPU oracle.
    Golden(GoldenArgs),
    /// Say which backends are usable here, and why not.
    Doctor(DoctorArgs),
    /// Measure generate + fold and SHA-256 throughput on this machine.
    Bench(bench::BenchArgs),
    /// Write an in-toto Statement v1 (RFC 8785 JSON) about a report and its dumps.
    Attest(AttestArgs),
    /// Start N local ranks of a command (default: this foldprint); stop all when one fails.
    Launch(LaunchArgs),
    /// Run experiments under a matrix of configurations (libraries, targets,
    /// kernels, env) and compare every digest with the baseline's.
    Audit(audit::AuditArgs),
}

#[derive(Args)]
struct AttestArgs {
    /// The report to attest.
    report: PathBuf,
    /// A `--dump` directory of the same run: its arenas become subjects too.
    #[arg(long)]
    dump: Option<PathBuf>,
    /// Where to write the statement.
    #[arg(long)]
    out: PathBuf,
}

#[derive(Args)]
struct LaunchArgs {
    /// Number of ranks to start.
    #[arg(short = 'n', long = "ranks")]
    ranks: usize,
    /// Run ARGS[0] as the program instead of this foldprint binary.
    #[arg(long)]
    exec: bool,
    /// Let every rank print to stdout (default: rank 0 only).
    #[arg(long)]
    all_output: bool,
    /// Run more ranks than there are GPUs: each rank gets its own NCCL host
    /// id (NCCL_HOSTID) and a GPU round-robin, so NCCL carries the traffic
    /// over its network transport on loopback. A correctness run of NCCL's
    /// inter-node path, never a bandwidth measurement.
    #[arg(long)]
    emulate_hosts: bool,
    /// With --emulate-hosts: which host id each rank gets (`reversed`
    /// changes the topology NCCL builds, never the fixed-order bits).
    #[arg(
        long,
        value_enum,
        default_value = "ascending",
        requires = "emulate_hosts"
    )]
    host_ids: foldprint::dist::launch::HostIds,
    /// Arguments of each rank, after `--`.
    #[arg(last = true, required = true)]
    args: Vec<std::ffi::OsString>,
}

#[derive(Args)]
struct Common {
    /// Experiment files, or directories of *.toml files.
    #[arg(required = true)]
    paths: Vec<PathBuf>,
    /// Where the reduction runs.
    #[arg(long, value_enum, default_value_t = BackendChoice::Auto)]
    backend: BackendChoice,
    /// NaN handling before hashing (see docs/SPEC.md).
    #[arg(long, default_value = "canonical", value_parser = parse_nan_policy)]
    nan_policy: NanPolicy,
    /// Print the report as JSON on stdout instead of the table.
    #[arg(long)]
    json: bool,
    /// Write the JSON report here (atomically).
    #[arg(long)]
    out: Option<PathBuf>,
    /// Also write the result as JUnit XML (one testcase per case and group).
    #[arg(long)]
    junit: Option<PathBuf>,
    #[command(flatten)]
    cuda: CudaArgs,
}

/// Settings of the CUDA backend (ignored by the CPU backend).
#[derive(Args, Clone)]
struct CudaArgs {
    /// Fold kernel variant: `fast` (vectorized) or `seed` (one thread per element).
    #[arg(long, default_value = "fast", value_parser = ["fast", "seed"])]
    kernel: String,
    /// Compile target: `auto` (CUBIN for the device's sm_XY when NVRTC can),
    /// `sm_XY` (CUBIN) or `compute_XY` (PTX, JIT-compiled by the driver).
    #[arg(long, default_value = "auto", value_parser = parse_target)]
    target: foldprint::backend::cuda::Target,
    /// Threads per block of the fold kernel.
    #[arg(long)]
    block: Option<u32>,
    /// Streams the exchange copies race on (0: one stream, in delivery order).
    #[arg(long, default_value_t = 0)]
    copy_streams: usize,
    /// Negative control: compile the fold with --ftz=true (flushes subnormals).
    #[arg(long)]
    ftz: bool,
    /// NCCL backend, one process: number of GPUs (one thread and rank each).
    /// Under torchrun, Slurm, Open MPI or `foldprint launch` the launcher decides.
    #[arg(long, default_value_t = 1)]
    gpus: usize,
    /// NCCL backend: seconds allowed for rendezvous + communicator init.
    #[arg(long, default_value_t = 120)]
    init_timeout: u64,
    /// NCCL backend: seconds allowed for each collective window.
    #[arg(long, default_value_t = 300)]
    timeout: u64,
}

fn parse_target(s: &str) -> Result<foldprint::backend::cuda::Target, String> {
    use foldprint::backend::cuda::Target;
    let num = |t: &str| {
        t.parse::<u32>()
            .map_err(|_| format!("`{s}`: expected auto, sm_XY or compute_XY"))
    };
    if s == "auto" {
        Ok(Target::Auto)
    } else if let Some(x) = s.strip_prefix("sm_") {
        Ok(Target::Cubin(num(x)?))
    } else if let Some(x) = s.strip_prefix("compute_") {
        Ok(Target::Ptx(num(x)?))
    } else {
        Err(format!("`{s}`: expected auto, sm_XY or compute_XY"))
    }
}

impl CudaArgs {
    fn options(&self, experiments: &[Experiment]) -> backend::BackendOptions {
        use foldprint::backend::cuda::{CudaConfig, KernelVariant};
        let mut cuda = CudaConfig {
            variant: if self.kernel == "seed" {
                KernelVariant::Seed
            } else {
                KernelVariant::Fast
            },
            copy_streams: self.copy_streams,
            ..CudaConfig::default()
        };
        cuda.compile.target = self.target;
        cuda.compile.ftz = self.ftz;
        if let Some(b) = self.block {
            cuda.tuning.fast_block = b;
            cuda.tuning.seed_block = b;
        }
        // What every NCCL rank must be about to run, bit for bit.
        let mut plan: Vec<String> = experiments
            .iter()
            .map(|e| format!("experiment\t{}\t{}", e.name, e.sha256))
            .collect();
        plan.extend(
            experiments
                .iter()
                .flat_map(|e| &e.cases)
                .map(|c| format!("{}\t{}", c.key(), c.id)),
        );
        let names: Vec<String> = experiments
            .iter()
            .map(|e| format!("{}@{}", e.name, &e.sha256[..12]))
            .collect();
        let cases: usize = experiments.iter().map(|e| e.cases.len()).sum();
        backend::BackendOptions {
            cuda,
            gpus: self.gpus,
            init_timeout: std::time::Duration::from_secs(self.init_timeout),
            timeout: std::time::Duration::from_secs(self.timeout),
            plan,
            plan_summary: format!("{cases} cases of {}", names.join(", ")),
        }
    }
}

#[derive(Args)]
struct RunArgs {
    #[command(flatten)]
    common: Common,
    /// Write each reduced arena as .bin plus a SHA256SUMS for `sha256sum -c`.
    #[arg(long)]
    dump: Option<PathBuf>,
}

#[derive(Args)]
struct CompareArgs {
    /// Two or more report files (or `--dump` directories, compared element
    /// by element); all are compared with the first.
    #[arg(required = true, num_args = 2..)]
    reports: Vec<PathBuf>,
    /// Compare only the cases present in every report.
    #[arg(long)]
    allow_missing: bool,
    /// Print the result as JSON.
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
struct VerifyArgs {
    #[command(flatten)]
    common: Common,
    /// Directory of golden files (one <experiment>.json each).
    #[arg(long)]
    golden: PathBuf,
}

#[derive(Args)]
struct GoldenArgs {
    /// Experiment files, or directories of *.toml files.
    #[arg(required = true)]
    paths: Vec<PathBuf>,
    /// Directory to write <experiment>.json goldens into.
    #[arg(long)]
    golden: PathBuf,
    /// NaN policy the goldens are made with (recorded in each file; `verify`
    /// must then use the same one).
    #[arg(long, default_value = "canonical", value_parser = parse_nan_policy)]
    nan_policy: NanPolicy,
}

#[derive(Args)]
struct DoctorArgs {
    #[arg(long)]
    json: bool,
}

fn parse_nan_policy(s: &str) -> Result<NanPolicy, String> {
    s.parse()
}

/// Exit codes, the CLI's contract with CI (README, "Exit codes").
pub const EXIT_CHECK_FAILED: i32 = 1;
pub const EXIT_UNAVAILABLE: i32 = 3;
pub const EXIT_INFRASTRUCTURE: i32 = 4;

/// An error that carries its exit code.
#[derive(Debug)]
pub struct Exit(pub i32, pub String);

impl std::fmt::Display for Exit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.1)
    }
}

impl std::error::Error for Exit {}

pub fn main() -> i32 {
    let cli = match Cli::try_parse() {
        Ok(c) => c,
        Err(e) => {
            let _ = e.print();
            return if e.use_stderr() { 2 } else { 0 };
        }
    };
    let result = match cli.command {
        Command::Run(a) => cmd_run(a),
        Command::Compare(a) => cmd_compare(a),
        Command::Verify(a) => cmd_verify(a),
        Command::Golden(a) => cmd_golden(a),
        Command::Doctor(a) => doctor::run(a.json),
        Command::Bench(a) => bench::run(a),
        Command::Launch(a) => cmd_launch(a),
        Command::Attest(a) => cmd_attest(a),
        Command::Audit(a) => audit::run(a),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            exit_code(&e)
        }
    }
}

fn exit_code(e: &anyhow::Error) -> i32 {
    for cause in e.chain() {
        if let Some(Exit(code, _)) = cause.downcast_ref::<Exit>() {
            return *code;
        }
        // `RunError::Backend` is transparent: look inside it too.
        let inner = match cause.downcast_ref::<foldprint::runner::RunError>() {
            Some(foldprint::runner::RunError::Backend(b)) => Some(b),
            _ => None,
        };
        if let Some(b) = cause.downcast_ref::<backend::BackendError>().or(inner) {
            return match b {
                backend::BackendError::Failed { .. } => EXIT_CHECK_FAILED,
                backend::BackendError::Infrastructure { .. } => EXIT_INFRASTRUCTURE,
                backend::BackendError::Unavailable { .. }
                | backend::BackendError::OutOfMemory { .. } => EXIT_UNAVAILABLE,
            };
        }
        if cause.downcast_ref::<foldprint::dist::DistError>().is_some() {
            return EXIT_INFRASTRUCTURE;
        }
        if cause
            .downcast_ref::<experiment::ExperimentError>()
            .is_some()
            || cause
                .downcast_ref::<foldprint::report::ReportError>()
                .is_some()
        {
            return 2;
        }
    }
    2
}

fn load(paths: &[PathBuf]) -> Result<Vec<Experiment>> {
    Ok(experiment::load_all(paths)?)
}

struct Bar(Option<indicatif::ProgressBar>);

impl Bar {
    fn new(total: usize) -> Bar {
        if !std::io::stderr().is_terminal() || total < 2 {
            return Bar(None);
        }
        let pb = indicatif::ProgressBar::new(total as u64);
        pb.set_style(
            indicatif::ProgressStyle::with_template("{spinner} [{pos}/{len}] {wide_msg} {elapsed}")
                .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
        );
        Bar(Some(pb))
    }
}

impl runner::Progress for Bar {
    fn start(&mut self, case: &experiment::Case, _i: usize, _n: usize) {
        if let Some(pb) = &self.0 {
            pb.set_message(format!("{}/{}", case.experiment, case.id));
        }
    }
    fn done(&mut self, _case: &experiment::Case) {
        if let Some(pb) = &self.0 {
            pb.inc(1);
        }
    }
}

impl Drop for Bar {
    fn drop(&mut self) {
        if let Some(pb) = &self.0 {
            pb.finish_and_clear();
        }
    }
}

/// Run the experiments; `None` on an NCCL rank other than 0, which only
/// takes part (rank 0 writes and prints the one report).
fn execute(
    common: &Common,
    experiments: &[Experiment],
    dump: Option<&std::path::Path>,
) -> Result<Option<Report>> {
    let t0 = std::time::Instant::now();
    let (mut be, note) = backend::select(common.backend, &common.cuda.options(experiments))?;
    let backend_init_ms = t0.elapsed().as_secs_f64() * 1e3;
    let reporting = be.is_reporting_rank();
    let dump = dump.filter(|_| reporting);
    if let Some(n) = &note {
        eprintln!("note: {n}");
    }
    if reporting {
        let prov = foldprint::env::provenance();
        if let Some(w) = foldprint::env::cpu_under_cuda_combination(be.name(), prov.as_ref()) {
            eprintln!("warning: {w}");
        }
    }
    let total = experiments.iter().map(|e| e.cases.len()).sum();
    let mut bar = Bar::new(total);
    let cfg = RunConfig {
        nan_policy: common.nan_policy,
        dump,
        notes: note.into_iter().collect(),
        backend_init_ms,
    };
    let report = runner::run(experiments, be.as_mut(), &cfg, &mut bar)?;
    drop(bar);
    if !reporting {
        return if report.summary.ok {
            Ok(None)
        } else {
            Err(Exit(
                1,
                format!(
                    "this rank's checks failed: {}",
                    report.summary.failures.join("; ")
                ),
            )
            .into())
        };
    }
    if let Some(out) = &common.out {
        report.write(out)?;
    }
    Ok(Some(report))
}

fn write_junit(common: &Common, report: &Report, problems: &[String]) -> Result<()> {
    if let Some(path) = &common.junit {
        foldprint::atomic_write(path, foldprint::report::junit(report, problems).as_bytes())
            .with_context(|| format!("{}: cannot write JUnit XML", path.display()))?;
    }
    Ok(())
}

fn cmd_run(a: RunArgs) -> Result<i32> {
    let exps = load(&a.common.paths)?;
    let Some(report) = execute(&a.common, &exps, a.dump.as_deref())? else {
        return Ok(0);
    };
    write_junit(&a.common, &report, &[])?;
    if a.common.json {
        print!("{}", report.to_json());
    } else {
        table::print_report(&report, a.common.out.as_deref(), a.dump.as_deref());
    }
    Ok(if report.summary.ok { 0 } else { 1 })
}

fn cmd_compare(a: CompareArgs) -> Result<i32> {
    use foldprint::report::localize;
    if a.reports.iter().all(|p| localize::is_dump_dir(p)) {
        let mut ok = true;
        for other in &a.reports[1..] {
            let cmp = localize::compare_dumps(&a.reports[0], other, 10)?;
            table::print_dump_comparison(&a.reports[0], other, &cmp);
            ok &= cmp.differing.is_empty() && cmp.unmatched.is_empty();
        }
        return Ok(if ok { 0 } else { 1 });
    }
    let mut reports = Vec::new();
    for p in &a.reports {
        reports.push((p.display().to_string(), Report::read(p)?));
    }
    for (path, r) in &reports {
        if let Some(n) = table::not_a_gpu_result(r) {
            eprintln!("warning: {path}: {n}");
        }
    }
    let cmp = compare(&reports, a.allow_missing);
    if a.json {
        let v = serde_json::json!({
            "compared": cmp.compared,
            "ok": cmp.ok(),
            "mismatches": cmp.mismatches.iter().map(|m| m.to_string()).collect::<Vec<_>>(),
        });
        println!("{}", serde_json::to_string_pretty(&v)?);
    } else {
        table::print_comparison(&reports, &cmp);
    }
    Ok(if cmp.ok() { 0 } else { 1 })
}

fn cmd_verify(a: VerifyArgs) -> Result<i32> {
    let exps = load(&a.common.paths)?;
    // Read every golden before running anything: a missing one is known early.
    let mut goldens = Vec::new();
    for e in &exps {
        let path = Golden::path_in(&a.golden, &e.name);
        if !path.exists() {
            return Err(Exit(
                1,
                format!(
                    "no golden for experiment `{}` at {} (generate it with `foldprint golden {} --golden {}`)",
                    e.name,
                    path.display(),
                    e.path.display(),
                    a.golden.display()
                ),
            )
            .into());
        }
        let g = Golden::read(&path)?;
        if g.nan_policy != a.common.nan_policy.name() {
            return Err(Exit(
                2,
                format!(
                    "{}: golden was made with NaN policy `{}`, this run uses `{}`",
                    path.display(),
                    g.nan_policy,
                    a.common.nan_policy
                ),
            )
            .into());
        }
        goldens.push((path, g));
    }
    let Some(report) = execute(&a.common, &exps, None)? else {
        return Ok(0);
    };
    let mut problems = Vec::new();
    for (path, g) in &goldens {
        let want: std::collections::BTreeMap<&str, &foldprint::report::GoldenCase> =
            g.cases.iter().map(|c| (c.key.as_str(), c)).collect();
        let mine: Vec<_> = report
            .cases
            .iter()
            .filter(|c| c.experiment == g.experiment)
            .collect();
        for c in &mine {
            match want.get(c.key.as_str()) {
                None => problems.push(format!(
                    "case `{}` ({}) of `{}` has no golden digest in {}",
                    c.id,
                    c.key,
                    g.experiment,
                    path.display()
                )),
                Some(gc) => {
                    for (i, (got, exp)) in c.arenas.iter().zip(&gc.arenas).enumerate() {
                        if got.sha256 != *exp {
                            problems.push(format!(
                                "case `{}` ({}) arena {i}: digest {} but golden {} says {}",
                                c.id,
                                c.key,
                                got.sha256,
                                path.display(),
                                exp
                            ));
                        }
                    }
                    if c.arenas.len() != gc.arenas.len() {
                        problems.push(format!(
                            "case `{}`: {} arenas, golden has {}",
                            c.id,
                            c.arenas.len(),
                            gc.arenas.len()
                        ));
                    }
                    problems.extend(g.mismatches_beyond_digests(gc, c));
                }
            }
        }
        let declared: std::collections::BTreeSet<String> = exps
            .iter()
            .filter(|e| e.name == g.experiment)
            .flat_map(|e| e.cases.iter().map(|c| c.key()))
            .collect();
        for gc in &g.cases {
            if !declared.contains(&gc.key) {
                problems.push(format!(
                    "golden {} lists case `{}` ({}) that the experiment no longer declares",
                    path.display(),
                    gc.id,
                    gc.key
                ));
            }
        }
    }
    problems.extend(report.summary.failures.iter().cloned());
    write_junit(&a.common, &report, &problems)?;
    if a.common.json {
        let v = serde_json::json!({ "ok": problems.is_empty(), "problems": problems, "report": report });
        println!("{}", serde_json::to_string_pretty(&v)?);
    } else {
        table::print_report(&report, a.common.out.as_deref(), None);
        table::print_verify(
            &goldens.iter().map(|(p, _)| p.clone()).collect::<Vec<_>>(),
            &report,
            &problems,
        );
    }
    Ok(if problems.is_empty() { 0 } else { 1 })
}

fn cmd_attest(a: AttestArgs) -> Result<i32> {
    use foldprint::report::attest;
    let report = Report::read(&a.report)?;
    let bytes =
        std::fs::read(&a.report).with_context(|| format!("{}: cannot read", a.report.display()))?;
    let name = a
        .report
        .file_name()
        .map_or("report.json".into(), |n| n.to_string_lossy().into_owned());
    let mut subjects = vec![attest::Subject {
        name,
        sha256: foldprint::digest::sha256_hex(&bytes),
    }];
    if let Some(dir) = &a.dump {
        let sums_path = dir.join("SHA256SUMS");
        let sums = std::fs::read_to_string(&sums_path)
            .with_context(|| format!("{}: cannot read", sums_path.display()))?;
        for line in sums.lines() {
            let (hash, file) = line.split_once("  ").ok_or_else(|| {
                Exit(
                    2,
                    format!("{}: malformed line `{line}`", sums_path.display()),
                )
            })?;
            let data = std::fs::read(dir.join(file))
                .with_context(|| format!("{}: cannot read", dir.join(file).display()))?;
            let actual = foldprint::digest::sha256_hex(&data);
            if actual != hash {
                return Err(Exit(
                    1,
                    format!(
                        "{}: SHA-256 is {actual}, SHA256SUMS says {hash}",
                        dir.join(file).display()
                    ),
                )
                .into());
            }
            subjects.push(attest::Subject {
                name: file.to_string(),
                sha256: actual,
            });
        }
    }
    let text = attest::canonical(&attest::statement(&report, &subjects));
    foldprint::atomic_write(&a.out, text.as_bytes())
        .with_context(|| format!("{}: cannot write", a.out.display()))?;
    println!(
        "wrote {} ({} subjects, predicate {})",
        a.out.display(),
        subjects.len(),
        attest::PREDICATE_TYPE
    );
    Ok(0)
}

/// Do the rank arguments select the NCCL backend (the ranks that need a GPU each)?
fn ranks_use_nccl(args: &[std::ffi::OsString]) -> bool {
    args.windows(2)
        .any(|w| w[0] == "--backend" && w[1] == "nccl")
        || args.iter().any(|a| a == "--backend=nccl")
}

fn cmd_launch(a: LaunchArgs) -> Result<i32> {
    use foldprint::dist::launch::{launch, Emulation, LaunchSpec};
    let (program, args) = if a.exec {
        let (p, rest) = a
            .args
            .split_first()
            .context("--exec needs a program after `--`")?;
        (p.clone(), rest.to_vec())
    } else {
        let me = std::env::current_exe().context("locating the foldprint binary")?;
        (me.into_os_string(), a.args.clone())
    };
    // One rank per GPU unless hosts are emulated; only NCCL ranks need one.
    let needs_gpus = !a.exec && ranks_use_nccl(&args);
    let gpus = if needs_gpus || a.emulate_hosts {
        foldprint::backend::cuda::probe().device_count
    } else {
        0
    };
    if needs_gpus && gpus == 0 {
        return Err(Exit(
            EXIT_UNAVAILABLE,
            "launch: no GPU is visible, and every NCCL rank needs one (see `foldprint doctor`)"
                .into(),
        )
        .into());
    }
    if needs_gpus && a.ranks > gpus && !a.emulate_hosts {
        return Err(Exit(
            2,
            format!(
                "launch -n {n}: {gpus} GPU(s) visible, and NCCL refuses two ranks of one host on one GPU. \
                 To run {n} ranks here anyway, add --emulate-hosts: each rank becomes its own NCCL host \
                 and NCCL uses its network transport over loopback (a correctness run, not a bandwidth one)",
                n = a.ranks
            ),
        )
        .into());
    }
    let spec = LaunchSpec {
        ranks: a.ranks,
        program,
        args,
        all_stdout: a.all_output,
        settle: std::time::Duration::from_secs(5),
        grace: std::time::Duration::from_secs(5),
        emulate: a.emulate_hosts.then(|| Emulation {
            gpus: gpus.max(1),
            host_ids: a.host_ids,
        }),
        nccl_logs: !a.exec,
    };
    let outcome = launch(&spec).map_err(|e| match e {
        foldprint::dist::DistError::Launch(m) if m.starts_with("-n ") => {
            anyhow::Error::new(Exit(2, format!("launch: {m}")))
        }
        other => other.into(),
    })?;
    if let Some(sig) = outcome.interrupted {
        eprintln!("launch: stopped every rank on signal {sig}");
    }
    if let Some((rank, what)) = &outcome.first_failure {
        eprintln!("error: rank {rank} of {} failed first ({what})", a.ranks);
    }
    if outcome.first_failure.is_some() || outcome.interrupted.is_some() {
        for (r, how) in &outcome.others {
            eprintln!("       rank {r}: {how}");
        }
        for w in &outcome.warnings {
            eprintln!("       {w}");
        }
        if let Some(dir) = &outcome.kept_logs {
            eprintln!("       NCCL logs of every rank kept in {}", dir.display());
        }
    }
    Ok(outcome.code)
}

fn cmd_golden(a: GoldenArgs) -> Result<i32> {
    let exps = load(&a.paths)?;
    let common = Common {
        paths: a.paths.clone(),
        backend: BackendChoice::Cpu,
        nan_policy: a.nan_policy,
        json: false,
        out: None,
        junit: None,
        cuda: CudaArgs {
            kernel: "fast".into(),
            target: foldprint::backend::cuda::Target::Auto,
            block: None,
            copy_streams: 0,
            ftz: false,
            gpus: 1,
            init_timeout: 120,
            timeout: 300,
        },
    };
    let report = execute(&common, &exps, None)?.context("goldens come from the CPU oracle")?;
    if !report.summary.ok {
        table::print_report(&report, None, None);
        return Err(Exit(
            1,
            "the run failed its own checks; no goldens written".into(),
        )
        .into());
    }
    std::fs::create_dir_all(&a.golden)
        .with_context(|| format!("creating {}", a.golden.display()))?;
    for e in &exps {
        let path = Golden::path_in(&a.golden, &e.name);
        Golden::from_report(&report, &e.name).write(&path)?;
        println!("wrote {} ({} cases)", path.display(), e.cases.len());
    }
    Ok(0)
}
