//! CLI edge: argument parsing, exit codes, and human or JSON output.
//!
//! Exit codes: [`foldprint::exit::ExitCode`] (0 all checks passed; 1 a
//! check failed; 2 bad input; 3 a resource is missing; 4 the
//! infrastructure failed mid-run; 128+N stopped by signal N).

/// `println!` for stdout that never panics: a closed pipe (`| head -1`)
/// silences the rest of the output, any other write error (a full disk)
/// is reported once the command ends (see [`finish_stdout`]).
macro_rules! outln {
    () => { $crate::cli::stdout_write(format_args!("\n")) };
    ($($arg:tt)*) => { $crate::cli::stdout_write(format_args!("{}\n", format_args!($($arg)*))) };
}

/// `print!` counterpart of [`outln!`].
macro_rules! out {
    ($($arg:tt)*) => { $crate::cli::stdout_write(format_args!($($arg)*)) };
}

mod audit;
mod bench;
mod doctor;
mod table;

use foldprint::exit::{Context, Failure, HasExitCode};
type Result<T, E = Failure> = std::result::Result<T, E>;
use clap::{Args, Parser, Subcommand};
use foldprint::backend::{self, BackendChoice};
use foldprint::digest::NanPolicy;
use foldprint::exit::ExitCode;
use foldprint::experiment::{self, Experiment};
use foldprint::report::{golden, Golden, Report};
use foldprint::runner::{self, RunConfig};
use std::io::IsTerminal;
use std::path::PathBuf;

#[derive(Parser)]
#[command(
    name = "foldprint",
    version,
    about = "Bitwise-reproducible fixed-order float32 reduction, with SHA-256 digests of the reduced arenas",
    after_help = EXIT_CODES_HELP
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

/// The exit codes, as `--help` shows them (README, "Exit codes", has the same table).
const EXIT_CODES_HELP: &str = "\
Exit codes:
  0      every check held
  1      a check failed: a digest, a rank copy, an invariance group, a golden or a comparison differs; or nothing was checked (every case skipped, no case shared, no dump listed, a report whose own run failed)
  2      bad input: usage, a malformed experiment, a corrupt or inconsistent report, an unusable output path
  3      a resource is missing: no GPU, driver or library, not enough memory or disk space
  4      the infrastructure failed mid-run: an NCCL error, a dead peer, the watchdog, the rendezvous
  128+N  stopped by signal N (130 SIGINT, 143 SIGTERM, 129 SIGHUP) at a case boundary; nothing written";

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
    host_ids: foldprint::ranks::launch::HostIds,
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
    /// NaN handling before hashing: `canonical` (every NaN hashed as one
    /// quiet NaN) or `preserve` (each NaN's sign and payload hashed as it
    /// is); see docs/SPEC.md.
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
    #[command(flatten)]
    nccl: NcclArgs,
}

/// Settings of the fold on a GPU (CUDA and NCCL backends; ignored by the CPU backend).
#[derive(Args, Clone)]
struct CudaArgs {
    /// Fold kernel variant: `fast` (vectorized) or `seed` (one thread per element).
    #[arg(long, default_value = "fast", value_parser = ["fast", "seed"])]
    kernel: String,
    /// Compile target: `auto` (CUBIN for the device's sm_XY when NVRTC can),
    /// `sm_XY` (CUBIN) or `compute_XY` (PTX, JIT-compiled by the driver).
    #[arg(long, default_value = "auto", value_parser = str::parse::<foldprint::gpu::Target>)]
    target: foldprint::gpu::Target,
    /// Threads per block of the fold kernel.
    #[arg(long)]
    block: Option<u32>,
    /// Streams the exchange copies race on (0: one stream, in delivery order).
    #[arg(long, default_value_t = 0)]
    copy_streams: usize,
    /// Negative control: compile the fold with --ftz=true (flushes subnormals).
    #[arg(long)]
    ftz: bool,
    /// How ranks 1..W-1's copies are checked against rank 0's: `device`
    /// (bitwise on the GPU, per chunk; only differing copies are read back)
    /// or `host` (every copy read back and hashed).
    #[arg(long, default_value = "device", value_parser = ["device", "host"])]
    rank_check: String,
    /// Compile the kernels with NVRTC, neither reading nor writing the
    /// on-disk kernel cache ($XDG_CACHE_HOME/foldprint/kernels).
    #[arg(long)]
    no_kernel_cache: bool,
}

/// Settings of the NCCL backend's world (ignored by the other backends).
#[derive(Args, Clone)]
struct NcclArgs {
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

impl Default for CudaArgs {
    fn default() -> Self {
        CudaArgs {
            kernel: "fast".into(),
            target: foldprint::gpu::Target::Auto,
            block: None,
            copy_streams: 0,
            ftz: false,
            rank_check: "device".into(),
            no_kernel_cache: false,
        }
    }
}

impl Default for NcclArgs {
    fn default() -> Self {
        NcclArgs {
            gpus: 1,
            init_timeout: 120,
            timeout: 300,
        }
    }
}

impl Common {
    fn options(&self, experiments: &[Experiment]) -> backend::BackendOptions {
        let (c, n) = (&self.cuda, &self.nccl);
        use foldprint::backend::cuda::CudaConfig;
        use foldprint::gpu::KernelVariant;
        let mut cuda = CudaConfig {
            variant: if c.kernel == "seed" {
                KernelVariant::PerElement
            } else {
                KernelVariant::Fast
            },
            copy_streams: c.copy_streams,
            rank_check: if c.rank_check == "host" {
                foldprint::backend::cuda::world::RankCheck::Host
            } else {
                foldprint::backend::cuda::world::RankCheck::Device
            },
            ..CudaConfig::default()
        };
        cuda.compile.target = c.target;
        cuda.compile.ftz = c.ftz;
        cuda.compile.disk_cache = !c.no_kernel_cache;
        if let Some(b) = c.block {
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
            gpus: n.gpus,
            init_timeout: std::time::Duration::from_secs(n.init_timeout),
            timeout: std::time::Duration::from_secs(n.timeout),
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
    /// NaN policy the goldens are made with, `canonical` or `preserve`
    /// (recorded in each file; `verify` must then use the same one).
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

/// What went wrong writing stdout, if anything (a closed pipe is not an error).
static STDOUT_STATE: std::sync::Mutex<(bool, Option<std::io::Error>)> =
    std::sync::Mutex::new((false, None));

pub(crate) fn stdout_write(args: std::fmt::Arguments<'_>) {
    use std::io::Write;
    let mut state = STDOUT_STATE.lock().unwrap_or_else(|p| p.into_inner());
    if state.0 || state.1.is_some() {
        return;
    }
    let text = args.to_string();
    let text = foldprint::report::printable(&text);
    if let Err(e) = std::io::stdout().lock().write_all(text.as_bytes()) {
        if e.kind() == std::io::ErrorKind::BrokenPipe {
            state.0 = true;
        } else {
            state.1 = Some(e);
        }
    }
}

/// Flush stdout; a write error turns a success into an error exit.
fn finish_stdout(code: i32) -> i32 {
    use std::io::Write;
    let mut state = STDOUT_STATE.lock().unwrap_or_else(|p| p.into_inner());
    if !state.0 && state.1.is_none() {
        if let Err(e) = std::io::stdout().lock().flush() {
            if e.kind() != std::io::ErrorKind::BrokenPipe {
                state.1 = Some(e);
            }
        }
    }
    match state.1.take() {
        Some(e) => {
            eprintln!("error: cannot write to standard output: {e}");
            if code == 0 {
                foldprint::exit::io_exit_code(&e).code()
            } else {
                code
            }
        }
        None => code,
    }
}

pub fn main() -> i32 {
    let cli = match Cli::try_parse() {
        Ok(c) => c,
        Err(e) => {
            let printed = e.print();
            if e.use_stderr() {
                return 2;
            }
            // --help and --version: a failed write (a full disk) is an
            // error, as for any other output; a closed pipe is not.
            use std::io::Write;
            return match printed.and_then(|()| std::io::stdout().flush()) {
                Err(err) if err.kind() != std::io::ErrorKind::BrokenPipe => {
                    eprintln!("error: cannot write to standard output: {err}");
                    foldprint::exit::io_exit_code(&err).code()
                }
                _ => 0,
            };
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
    let code = match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {}", foldprint::report::printable(&e.message()));
            e.exit_code().code()
        }
    };
    finish_stdout(code)
}

/// Start the worker threads now, so that a machine that cannot start them
/// gets a clear error (exit 3) instead of a panic at the first parallel step.
pub(crate) fn start_threads() -> Result<()> {
    // Under an address-space limit a thread can start and then abort the
    // process while setting up its signal stack: refuse before spawning.
    let threads = std::env::var("RAYON_NUM_THREADS")
        .ok()
        .and_then(|v| v.parse::<u64>().ok())
        .filter(|&t| t > 0)
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get() as u64));
    let stack = std::env::var("RUST_MIN_STACK")
        .ok()
        .and_then(|v| v.parse::<u64>().ok())
        .unwrap_or(2 << 20);
    // Each thread maps its stack plus a guard page and a signal stack.
    let need = threads.saturating_mul(stack + (64 << 10));
    if let Some(left) = foldprint::memory::address_space_left() {
        if need > left {
            return Err(Failure::Unavailable(format!(
                "cannot start worker threads: {threads} threads need {} MiB of address space, \
                     the limit (RLIMIT_AS) leaves {} MiB; lower RAYON_NUM_THREADS",
                need >> 20,
                left >> 20
            )));
        }
    }
    rayon::ThreadPoolBuilder::new()
        .build_global()
        .map_err(|e| Failure::Unavailable(format!("cannot start worker threads: {e}")))
}

/// Check an output path before any work (exit 2 when it cannot be used).
pub(crate) fn check_output(flag: &str, path: &std::path::Path) -> Result<()> {
    foldprint::check_writable(path).map_err(|e| {
        Failure::Refused(format!(
            "{flag} {}: cannot write there: {e}",
            path.display()
        ))
    })
}

/// Refuse an output that is one of the inputs, or another output.
fn refuse_same(
    flag: &str,
    out: &std::path::Path,
    other: &str,
    path: &std::path::Path,
) -> Result<()> {
    if foldprint::same_file(out, path) {
        return Err(Failure::Refused(format!(
            "{flag} {} is {other} {}; refusing to overwrite it",
            out.display(),
            path.display()
        )));
    }
    Ok(())
}

/// Whether `path` lies inside directory `dir` (once both are resolved).
fn inside(path: &std::path::Path, dir: &std::path::Path) -> bool {
    let (p, d) = (
        foldprint::atomic::resolved(path),
        foldprint::atomic::resolved(dir),
    );
    p != d && p.starts_with(&d)
}

/// Every output of a run, checked before the backend starts: writable,
/// not an input, not another output, not inside the dump directory.
fn check_outputs(
    common: &Common,
    experiments: &[Experiment],
    dump: Option<&std::path::Path>,
    also_inputs: &[PathBuf],
) -> Result<()> {
    let outs: Vec<(&str, &PathBuf)> = [("--out", &common.out), ("--junit", &common.junit)]
        .into_iter()
        .filter_map(|(f, p)| p.as_ref().map(|p| (f, p)))
        .collect();
    for (flag, path) in &outs {
        check_output(flag, path)?;
        for e in experiments {
            refuse_same(flag, path, "the experiment", &e.path)?;
        }
        for i in also_inputs {
            refuse_same(flag, path, "the input", i)?;
        }
        if let Some(d) = dump {
            if inside(path, d) || foldprint::same_file(path, d) {
                return Err(Failure::Refused(format!(
                    "{flag} {} is inside the --dump directory {}, which a run replaces whole",
                    path.display(),
                    d.display()
                )));
            }
        }
    }
    if let (Some(o), Some(j)) = (&common.out, &common.junit) {
        refuse_same("--junit", j, "also the report (--out)", o)?;
    }
    if let Some(d) = dump {
        // Every case's dump file name must fit, before any case runs.
        let cases: Vec<(&str, &str, usize)> = experiments
            .iter()
            .flat_map(|e| &e.cases)
            .map(|c| (c.experiment.as_str(), c.id.as_str(), c.arenas.len()))
            .collect();
        let bad = |e: String| -> Failure {
            Failure::Refused(format!("--dump {}: cannot use it: {e}", d.display()))
        };
        let names = foldprint::dumpdir::dump_names(&cases).map_err(bad)?;
        foldprint::dumpdir::preflight(d, names.values().map(|n| n.as_str()))
            .map_err(|e| bad(e.to_string()))?;
        for e in experiments {
            if inside(&e.path, d) {
                return Err(Failure::Refused(format!(
                    "--dump {}: the experiment {} is inside it",
                    d.display(),
                    e.path.display()
                )));
            }
        }
    }
    Ok(())
}

/// An interruption says which outputs were left as they were.
fn interrupted(e: runner::RunError, common: &Common, dump: Option<&std::path::Path>) -> Failure {
    if let runner::RunError::Interrupted { signal, .. } = &e {
        let kept: Vec<String> = [common.out.as_deref(), common.junit.as_deref(), dump]
            .into_iter()
            .flatten()
            .map(|p| p.display().to_string())
            .collect();
        let tail = if kept.is_empty() {
            String::new()
        } else {
            format!("; {} left as they were", kept.join(", "))
        };
        return Failure::Interrupted {
            signal: *signal,
            message: format!("{e}{tail}"),
        };
    }
    e.into()
}

fn load(paths: &[PathBuf]) -> Result<Vec<Experiment>> {
    Ok(experiment::load_all(paths)?)
}

/// Progress of a run: a bar on a terminal (stderr), ticking even while one
/// long case runs, and, when asked, each case's table row printed as soon
/// as the case finishes (so a piped run streams its rows).
struct Bar {
    pb: Option<indicatif::ProgressBar>,
    /// (name, path, cases, SHA-256 column width) of each experiment, when
    /// rows are streamed.
    rows: Option<Vec<(String, String, usize, usize)>>,
    current: Option<String>,
}

impl Bar {
    fn new(total: usize, rows: Option<Vec<(String, String, usize, usize)>>) -> Bar {
        let pb = (std::io::stderr().is_terminal() && total >= 1).then(|| {
            let pb = indicatif::ProgressBar::new(total as u64);
            pb.set_style(
                indicatif::ProgressStyle::with_template(
                    "{spinner} [{pos}/{len}] {wide_msg} {elapsed}",
                )
                .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
            );
            pb.enable_steady_tick(std::time::Duration::from_millis(200));
            pb
        });
        Bar {
            pb,
            rows,
            current: None,
        }
    }

    /// Print without tearing the bar.
    fn print(&self, f: impl FnOnce()) {
        match &self.pb {
            Some(pb) => pb.suspend(f),
            None => f(),
        }
    }
}

impl runner::Progress for Bar {
    fn start(&mut self, case: &experiment::Case, _i: usize, _n: usize) {
        if let Some(pb) = &self.pb {
            pb.set_message(format!(
                "{}/{}",
                case.experiment,
                foldprint::report::printable(&case.id)
            ));
        }
        if let Some(rows) = &self.rows {
            if self.current.as_deref() != Some(case.experiment.as_str()) {
                if let Some((name, path, n, w)) = rows.iter().find(|r| r.0 == case.experiment) {
                    self.print(|| table::experiment_header(name, path, *n, *w));
                }
                self.current = Some(case.experiment.clone());
            }
        }
    }
    fn done(&mut self, _case: &experiment::Case, result: Option<&foldprint::report::CaseReport>) {
        if let (Some(rows), Some(c)) = (&self.rows, result) {
            let w = rows.iter().find(|r| r.0 == c.experiment).map_or(0, |r| r.3);
            self.print(|| table::case_row(c, w));
        }
        if let Some(pb) = &self.pb {
            pb.inc(1);
        }
    }
}

impl Drop for Bar {
    fn drop(&mut self) {
        if let Some(pb) = &self.pb {
            pb.finish_and_clear();
        }
    }
}

/// A finished run whose outputs are not yet in place.
struct Executed {
    report: Report,
    dump: Option<foldprint::dumpdir::DumpDir>,
    dump_path: Option<PathBuf>,
    /// Held until the outputs are committed.
    _locks: Vec<foldprint::outputs::Lock>,
}

impl Executed {
    /// Stage the report (`--out`) and `junit`, then put every output in
    /// place as one unit (`foldprint::outputs`).
    fn commit(&mut self, common: &Common, junit: Option<String>) -> Result<()> {
        let mut files = Vec::new();
        if let Some(out) = &common.out {
            files.push(foldprint::outputs::stage(
                out,
                self.report.to_json().as_bytes(),
            )?);
        }
        if let (Some(path), Some(xml)) = (&common.junit, junit) {
            files.push(foldprint::outputs::stage(path, xml.as_bytes())?);
        }
        let cases = self.report.cases.len() + self.report.skipped.len();
        foldprint::outputs::commit(self.dump.take(), files, cases)
            .map_err(|e| interrupted(e, common, self.dump_path.as_deref()))
    }
}

/// Run the experiments; `None` on an NCCL rank other than 0, which only
/// takes part (rank 0 writes and prints the one report).
fn execute(
    common: &Common,
    experiments: &[Experiment],
    dump: Option<&std::path::Path>,
    stream: bool,
) -> Result<Option<Executed>> {
    let t0 = std::time::Instant::now();
    let (mut be, note) = backend::select(common.backend, &common.options(experiments))?;
    let backend_init_ms = t0.elapsed().as_secs_f64() * 1e3;
    let reporting = be.is_reporting_rank();
    let dump = dump.filter(|_| reporting);
    if let Some(n) = &note {
        eprintln!("note: {n}");
    }
    let mut not_gpu = None;
    if reporting {
        let prov = foldprint::env::provenance();
        if let Some(w) = foldprint::env::cpu_under_cuda_combination(be.name(), prov.as_ref()) {
            eprintln!("warning: {w}");
            not_gpu = Some(w);
        }
    }
    let total = experiments.iter().map(|e| e.cases.len()).sum();
    let stream = stream && reporting;
    if stream {
        table::banner(
            env!("CARGO_PKG_VERSION"),
            be.name(),
            &be.environment(),
            common.nan_policy.name(),
        );
        if let Some(w) = &not_gpu {
            outln!("NOT A GPU RESULT: {w}");
        }
    }
    let rows = stream.then(|| {
        experiments
            .iter()
            .map(|e| {
                let info = foldprint::report::ExperimentInfo::from(e);
                let arenas = e.cases.iter().map(|c| c.arenas.len()).max().unwrap_or(0);
                (
                    info.name,
                    info.path,
                    info.cases,
                    table::digest_width(arenas),
                )
            })
            .collect()
    });
    let mut bar = Bar::new(total, rows);
    let cfg = RunConfig {
        nan_policy: common.nan_policy,
        dump,
        notes: note.into_iter().collect(),
        backend_init_ms,
    };
    // Two runs writing the same outputs take turns, from before the first
    // case to the last rename (only the rank that writes them locks).
    let outputs: Vec<&std::path::Path> = [common.out.as_deref(), common.junit.as_deref(), dump]
        .into_iter()
        .flatten()
        .collect();
    let locks = if reporting {
        foldprint::outputs::lock_all(&outputs, &mut |p| {
            eprintln!(
                "note: waiting for another foldprint run writing {}",
                p.display()
            )
        })
        .context("locking the outputs")?
    } else {
        Vec::new()
    };
    let (report, staged) = runner::run_staged(experiments, be.as_mut(), &cfg, &mut bar)
        .map_err(|e| interrupted(e, common, dump))?;
    drop(bar);
    if !reporting {
        return if report.summary.ok {
            Ok(None)
        } else {
            Err(Failure::CheckFailed(format!(
                "this rank's checks failed: {}",
                report.summary.failures.join("; ")
            )))
        };
    }
    Ok(Some(Executed {
        report,
        dump: staged,
        dump_path: dump.map(|d| d.to_path_buf()),
        _locks: locks,
    }))
}

fn junit_of(common: &Common, report: &Report, problems: &[String]) -> Option<String> {
    common
        .junit
        .as_ref()
        .map(|_| foldprint::report::junit(report, problems))
}

fn cmd_run(a: RunArgs) -> Result<i32> {
    let exps = load(&a.common.paths)?;
    check_outputs(&a.common, &exps, a.dump.as_deref(), &[])?;
    start_threads()?;
    foldprint::interrupt::install();
    let stream = !a.common.json;
    let Some(mut run) = execute(&a.common, &exps, a.dump.as_deref(), stream)? else {
        return Ok(0);
    };
    let junit = junit_of(&a.common, &run.report, &[]);
    run.commit(&a.common, junit)?;
    let report = run.report;
    if a.common.json {
        out!("{}", report.to_json());
    } else {
        // The banner and case rows were printed as the cases finished.
        table::print_tail(&report, a.common.out.as_deref(), a.dump.as_deref());
    }
    Ok(ExitCode::verdict(report.summary.ok).code())
}

fn cmd_compare(a: CompareArgs) -> Result<i32> {
    use foldprint::report::{compare_sources, localize, Source};
    if a.reports.iter().all(|p| p.is_dir()) {
        let mut ok = true;
        let mut all = Vec::new();
        for other in &a.reports[1..] {
            let cmp = localize::compare_dumps(&a.reports[0], other, 10)?;
            if !a.json {
                table::print_dump_comparison(&a.reports[0], other, &cmp);
            }
            // Two empty SHA256SUMS "agree" about nothing.
            let compared = cmp.identical + cmp.differing.len();
            ok &= compared > 0 && cmp.differing.is_empty() && cmp.unmatched.is_empty();
            let mut v = serde_json::to_value(&cmp)?;
            v["left"] = serde_json::json!(a.reports[0]);
            v["right"] = serde_json::json!(other);
            v["compared"] = serde_json::json!(compared);
            all.push(v);
        }
        if a.json {
            let v = serde_json::json!({ "ok": ok, "comparisons": all });
            outln!("{}", serde_json::to_string_pretty(&v)?);
        }
        return Ok(ExitCode::verdict(ok).code());
    }
    if let Some(dir) = a.reports.iter().find(|p| p.is_dir()) {
        let file = a.reports.iter().find(|p| !p.is_dir()).unwrap_or(dir);
        return Err(Failure::Refused(format!(
                "{} is a dump directory and {} is a report: compare reports with reports, dump directories with dump directories",
                dir.display(),
                file.display()
            ),
        ));
    }
    let mut sources = Vec::new();
    for p in &a.reports {
        sources.push((p.display().to_string(), Source::read(p)?));
    }
    for (path, s) in &sources {
        if let Source::Report(r) = s {
            if let Some(n) = table::not_a_gpu_result(r) {
                eprintln!("warning: {path}: {n}");
            }
        }
    }
    let cmp = compare_sources(&sources, a.allow_missing);
    if a.json {
        let v = serde_json::json!({
            "compared": cmp.compared,
            "ok": cmp.ok(),
            "mismatches": cmp.mismatches.iter().map(|m| m.to_string()).collect::<Vec<_>>(),
        });
        outln!("{}", serde_json::to_string_pretty(&v)?);
    } else {
        table::print_comparison(&sources, &cmp);
    }
    Ok(ExitCode::verdict(cmp.ok()).code())
}

fn cmd_verify(a: VerifyArgs) -> Result<i32> {
    let exps = load(&a.common.paths)?;
    let golden_files: Vec<PathBuf> = exps
        .iter()
        .map(|e| Golden::path_in(&a.golden, &e.name))
        .collect();
    check_outputs(&a.common, &exps, None, &golden_files)?;
    // Read every golden before running anything: a missing one is known early.
    let goldens = golden::load(&exps, &a.golden, a.common.nan_policy)?;
    start_threads()?;
    foldprint::interrupt::install();
    // Rows stream as cases finish, as for `run`, so a piped verify is not
    // silent until the end.
    let Some(mut run) = execute(&a.common, &exps, None, !a.common.json)? else {
        return Ok(0);
    };
    let mut problems: Vec<String> = golden::check(&goldens, &exps, &run.report)
        .iter()
        .map(|p| p.to_string())
        .collect();
    problems.extend(run.report.summary.failures.iter().cloned());
    let junit = junit_of(&a.common, &run.report, &problems);
    run.commit(&a.common, junit)?;
    let report = run.report;
    if a.common.json {
        let v = serde_json::json!({ "ok": problems.is_empty(), "problems": problems, "report": report });
        outln!("{}", serde_json::to_string_pretty(&v)?);
    } else {
        table::print_tail(&report, a.common.out.as_deref(), None);
        table::print_verify(
            &goldens.iter().map(|g| g.path.clone()).collect::<Vec<_>>(),
            &report,
            &problems,
        );
    }
    Ok(ExitCode::verdict(problems.is_empty()).code())
}

fn cmd_attest(a: AttestArgs) -> Result<i32> {
    use foldprint::report::attest;
    check_output("--out", &a.out)?;
    refuse_same("--out", &a.out, "the report", &a.report)?;
    if let Some(d) = &a.dump {
        if inside(&a.out, d) {
            return Err(Failure::Refused(format!(
                "--out {} is inside the dump directory {}; refusing to write there",
                a.out.display(),
                d.display()
            )));
        }
    }
    let report = Report::read(&a.report)?;
    // The statement records the verdict; a failed run is said loudly and
    // exits 1 so that no pipeline publishes it as a pass.
    let failed = (!report.summary.ok).then(|| {
        format!(
            "{}: its own run FAILED its checks (summary.ok = false: {}); the statement records verdict ok = false",
            a.report.display(),
            report.summary.failures.join("; ")
        )
    });
    let bytes = foldprint::env::read_capped(&a.report, foldprint::env::MAX_REPORT_BYTES)
        .with_context(|| format!("{}: cannot read", a.report.display()))?;
    let name = a
        .report
        .file_name()
        .map_or("report.json".into(), |n| n.to_string_lossy().into_owned());
    let mut subjects = vec![attest::Subject {
        name,
        sha256: foldprint::digest::sha256_hex(&bytes),
    }];
    if let Some(dir) = &a.dump {
        subjects.extend(attest::dump_subjects(&report, dir)?);
    }
    let text = attest::canonical(&attest::statement(&report, &subjects));
    foldprint::atomic_write(&a.out, text.as_bytes())
        .with_context(|| format!("{}: cannot write", a.out.display()))?;
    outln!(
        "wrote {} ({} subjects, predicate {})",
        a.out.display(),
        subjects.len(),
        attest::PREDICATE_TYPE
    );
    if let Some(f) = failed {
        eprintln!("FAILED RUN: {f}");
        return Ok(ExitCode::CheckFailed.code());
    }
    Ok(0)
}

/// Do the rank arguments select the NCCL backend (the ranks that need a GPU each)?
fn ranks_use_nccl(args: &[std::ffi::OsString]) -> bool {
    args.windows(2)
        .any(|w| w[0] == "--backend" && w[1] == "nccl")
        || args.iter().any(|a| a == "--backend=nccl")
}

fn cmd_launch(a: LaunchArgs) -> Result<i32> {
    use foldprint::ranks::launch::{launch, Emulation, LaunchSpec};
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
        foldprint::gpu::probe().device_count
    } else {
        0
    };
    if needs_gpus && gpus == 0 {
        return Err(Failure::Unavailable(
            "launch: no GPU is visible, and every NCCL rank needs one (see `foldprint doctor`)"
                .into(),
        ));
    }
    if needs_gpus && a.ranks > gpus && !a.emulate_hosts {
        return Err(Failure::Refused(format!(
                "launch -n {n}: {gpus} GPU(s) visible, and NCCL refuses two ranks of one host on one GPU. \
                 To run {n} ranks here anyway, add --emulate-hosts: each rank becomes its own NCCL host \
                 and NCCL uses its network transport over loopback (a correctness run, not a bandwidth one)",
                n = a.ranks
            ),
        ));
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
    let outcome = launch(&spec)?;
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
    for e in &exps {
        check_output("--golden", &Golden::path_in(&a.golden, &e.name)).or_else(|err| {
            // A golden directory that does not exist yet is made below.
            if a.golden.exists() {
                Err(err)
            } else {
                Ok(())
            }
        })?;
    }
    // A golden that does not parse may be a conflicted merge or another
    // tool's file: refuse, before running, rather than overwrite it unseen.
    let mut old = Vec::with_capacity(exps.len());
    for e in &exps {
        let path = Golden::path_in(&a.golden, &e.name);
        old.push(if path.exists() {
            Some(Golden::read(&path).map_err(|err| {
                Failure::Refused(format!(
                    "{err}\nrefusing to overwrite {}: it is not a golden this foldprint reads; \
                         look at it, then fix or delete it",
                    path.display()
                ))
            })?)
        } else {
            None
        });
    }
    start_threads()?;
    foldprint::interrupt::install();
    let common = Common {
        paths: a.paths.clone(),
        backend: BackendChoice::Cpu,
        nan_policy: a.nan_policy,
        json: false,
        out: None,
        junit: None,
        cuda: CudaArgs::default(),
        nccl: NcclArgs::default(),
    };
    let report = execute(&common, &exps, None, false)?
        .context("goldens come from the CPU oracle")?
        .report;
    if !report.summary.ok {
        table::print_report(&report, None, None);
        return Err(Failure::CheckFailed(
            "the run failed its own checks; no goldens written".into(),
        ));
    }
    // A golden of no case would vouch for nothing: check every experiment
    // before writing any.
    let goldens: Vec<Golden> = exps
        .iter()
        .map(|e| Golden::from_report(&report, &e.name))
        .collect();
    for (e, g) in exps.iter().zip(&goldens) {
        if g.cases.is_empty() {
            return Err(Failure::CheckFailed(format!(
                    "{}: the CPU oracle skipped all {} case(s) of experiment `{}` ({}); no goldens written",
                    foldprint::report::NOTHING_CHECKED,
                    e.cases.len(),
                    e.name,
                    e.path.display()
                ),
            ));
        }
    }
    std::fs::create_dir_all(&a.golden)
        .with_context(|| format!("creating {}", a.golden.display()))?;
    for ((e, golden), old) in exps.iter().zip(&goldens).zip(&old) {
        let path = Golden::path_in(&a.golden, &e.name);
        golden.write(&path)?;
        let skipped = report
            .skipped
            .iter()
            .filter(|s| s.experiment == e.name)
            .count();
        outln!(
            "wrote {} ({} cases{})",
            path.display(),
            golden.cases.len(),
            if skipped == 0 {
                String::new()
            } else {
                format!("; {skipped} skipped by the CPU oracle, not pinned")
            }
        );
        let Some(old) = old else { continue };
        let mut changes = golden.changes_from(old);
        if old.experiment != golden.experiment {
            changes.insert(0, format!("it held experiment `{}`", old.experiment));
        }
        if !changes.is_empty() {
            eprintln!(
                "warning: {} changed: {}; review the difference before committing it",
                path.display(),
                changes.join(", ")
            );
        }
    }
    Ok(0)
}
