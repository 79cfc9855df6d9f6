//! The command line's shape: every flag, its default and its help text.

use clap::{Args, Parser, Subcommand};
use foldprint::backend::{self, BackendChoice};
use foldprint::digest::NanPolicy;
use foldprint::gpu::KernelVariant;
use foldprint::gpu::RankCheck;
use std::path::PathBuf;

use super::{audit, bench};

#[derive(Parser)]
#[command(
    name = "foldprint",
    version,
    about = "Bitwise-reproducible fixed-order float32 reduction, with SHA-256 digests of the reduced arenas",
    after_help = EXIT_CODES_HELP
)]
pub(super) struct Cli {
    #[command(subcommand)]
    pub(super) command: Command,
}

/// The exit codes, as `--help` shows them (README, "Exit codes", has the same table).
const EXIT_CODES_HELP: &str = "\
Exit codes:
  0      every check held
  1      a check failed: a digest, a rank copy, an invariance group, a golden or a comparison differs; or nothing was checked (every case skipped, no case shared, no dump listed, a report whose own run failed); or a case differs from its `expect` file (`run --expect-gate` chooses which cases: all, none, or those of named contracts)
  2      bad input: usage, a malformed experiment, a corrupt or inconsistent report, an unusable output path; a rank file that is missing, malformed, changed during the run or unlike the other ranks'; a launcher variable that is malformed, out of range or contradicts another launcher's, or a rendezvous address rank 0 cannot listen on
  3      a resource is missing: no GPU (or none for this rank), driver or library, not enough memory or disk space
  4      the infrastructure failed mid-run: an NCCL error, a dead peer, the watchdog, the rendezvous
  128+N  stopped by signal N (130 SIGINT, 143 SIGTERM, 129 SIGHUP) at a case boundary, or at once while the ranks wait in the rendezvous or a run waits for another run's output lock; nothing written";

#[derive(Subcommand)]
pub(super) enum Command {
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
    /// Check the ranks a launcher started (torchrun, srun, mpirun, launch):
    /// discovery and rendezvous only, no GPU work; rank 0 prints the world.
    ///
    /// Where several launchers' variables are set (mpirun or torchrun inside
    /// a Slurm job), they must agree on the rank and world size, or every
    /// rank refuses (exit 2) until FOLDPRINT_LAUNCHER=foldprint|torchrun|
    /// slurm|openmpi names the launcher that started it.
    World(WorldArgs),
    /// Draw the ULP distances of a report's `expect` differences, or of two
    /// `--dump` directories, per arena or file, as an SVG (exit 0 when written).
    Plot(PlotArgs),
}

#[derive(Args)]
pub(super) struct PlotArgs {
    /// One report (its cases against their `expect` files), or two dump
    /// directories (the second against the first).
    #[arg(required = true, num_args = 1..=2)]
    pub(super) inputs: Vec<PathBuf>,
    /// Where to write the SVG (atomically).
    #[arg(short = 'o', long = "out")]
    pub(super) out: PathBuf,
}

#[derive(Args)]
pub(super) struct WorldArgs {
    /// Check the placement `--emulate-hosts` would give a run (ranks share
    /// devices by local rank, each its own NCCL host).
    #[arg(long)]
    pub(super) emulate_hosts: bool,
    /// Seconds allowed for every rank to join.
    #[arg(long, default_value_t = 60)]
    pub(super) init_timeout: u64,
    /// Print the world as JSON.
    #[arg(long)]
    pub(super) json: bool,
}

#[derive(Args)]
pub(super) struct AttestArgs {
    /// The report to attest.
    pub(super) report: PathBuf,
    /// A `--dump` directory of the same run: its arenas become subjects too.
    #[arg(long)]
    pub(super) dump: Option<PathBuf>,
    /// Where to write the statement.
    #[arg(long)]
    pub(super) out: PathBuf,
}

#[derive(Args)]
pub(super) struct LaunchArgs {
    /// Number of ranks to start.
    #[arg(short = 'n', long = "ranks")]
    pub(super) ranks: usize,
    /// Run ARGS[0] as the program instead of this foldprint binary. Each
    /// rank also gets torchrun's variables (RANK, WORLD_SIZE, LOCAL_RANK,
    /// LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT), equal to foldprint's,
    /// so a script written for torchrun runs unchanged.
    #[arg(long)]
    pub(super) exec: bool,
    /// Let every rank print to stdout, every line of each rank's stdout and
    /// stderr prefixed `[rank R] ` (default: rank 0's stdout only, unprefixed).
    #[arg(long)]
    pub(super) all_output: bool,
    /// Run more ranks than there are GPUs: each rank gets its own NCCL host
    /// id (NCCL_HOSTID) and a GPU round-robin, so NCCL carries the traffic
    /// over its network transport on loopback. A correctness run of NCCL's
    /// inter-node path, never a bandwidth measurement.
    #[arg(long)]
    pub(super) emulate_hosts: bool,
    /// With --emulate-hosts: which host id each rank gets (`reversed`
    /// changes the topology NCCL builds, never the fixed-order bits).
    #[arg(
        long,
        value_enum,
        default_value = "ascending",
        requires = "emulate_hosts"
    )]
    pub(super) host_ids: foldprint::ranks::launch::HostIds,
    /// Arguments of each rank, after `--`.
    #[arg(last = true, required = true)]
    pub(super) args: Vec<std::ffi::OsString>,
}

#[derive(Args)]
pub(super) struct Common {
    /// Experiment files, or directories of *.toml files.
    #[arg(required = true)]
    pub(super) paths: Vec<PathBuf>,
    /// Where the reduction runs.
    #[arg(long, default_value = "auto", value_parser = BackendParser)]
    pub(super) backend: BackendChoice,
    /// NaN handling before hashing: `canonical` (every NaN hashed as one
    /// quiet NaN) or `preserve` (each NaN's sign and payload hashed as it
    /// is); see docs/SPEC.md.
    #[arg(long, default_value = "canonical", value_parser = parse_nan_policy)]
    pub(super) nan_policy: NanPolicy,
    /// Print the report as JSON on stdout instead of the table.
    #[arg(long)]
    pub(super) json: bool,
    /// Write the JSON report here (atomically).
    #[arg(long)]
    pub(super) out: Option<PathBuf>,
    /// Also write the result as JUnit XML (one testcase per case and group).
    #[arg(long)]
    pub(super) junit: Option<PathBuf>,
    #[command(flatten)]
    pub(super) cuda: CudaArgs,
    #[command(flatten)]
    pub(super) nccl: NcclArgs,
}

/// Settings of the fold on a GPU (CUDA and NCCL backends; ignored by the CPU backend).
#[derive(Args, Clone)]
pub(super) struct CudaArgs {
    /// Fold kernel variant: `fast` (vectorized) or `seed` (one thread per element).
    #[arg(long, value_enum, default_value_t = KernelVariant::Fast)]
    pub(super) kernel: KernelVariant,
    /// Compile target: `auto` (CUBIN for the device's sm_XY when NVRTC can),
    /// `sm_XY` (CUBIN) or `compute_XY` (PTX, JIT-compiled by the driver).
    #[arg(long, default_value = "auto", value_parser = str::parse::<foldprint::gpu::Target>)]
    pub(super) target: foldprint::gpu::Target,
    /// Threads per block of the fold kernel.
    #[arg(long)]
    pub(super) block: Option<u32>,
    /// Streams the exchange copies race on (0: one stream, in delivery order).
    #[arg(long, default_value_t = 0)]
    pub(super) copy_streams: usize,
    /// Negative control: compile the fold with --ftz=true (flushes subnormals).
    #[arg(long)]
    pub(super) ftz: bool,
    /// How ranks 1..W-1's copies are checked against rank 0's: `device`
    /// (bitwise on the GPU, per chunk; only differing copies are read back)
    /// or `host` (every copy read back and hashed).
    #[arg(long, value_enum, default_value_t = RankCheck::Device)]
    pub(super) rank_check: RankCheck,
    /// Compile the kernels with NVRTC, neither reading nor writing the
    /// on-disk kernel cache ($XDG_CACHE_HOME/foldprint/kernels).
    #[arg(long)]
    pub(super) no_kernel_cache: bool,
}

/// Settings of the NCCL backend's world (ignored by the other backends).
#[derive(Args, Clone)]
pub(super) struct NcclArgs {
    /// NCCL backend, one process: number of GPUs (one thread and rank each).
    /// Under torchrun, Slurm, Open MPI or `foldprint launch` the launcher decides.
    #[arg(long, default_value_t = 1)]
    pub(super) gpus: usize,
    /// NCCL backend: seconds allowed for rendezvous + communicator init.
    #[arg(long, default_value_t = foldprint::ranks::world::DEFAULT_INIT_TIMEOUT_S)]
    pub(super) init_timeout: u64,
    /// NCCL backend: seconds allowed for each collective window.
    #[arg(long, default_value_t = backend::DEFAULT_TIMEOUT_S)]
    pub(super) timeout: u64,
    /// NCCL backend under torchrun, srun or mpirun: ranks share the visible
    /// GPUs by local rank, each its own NCCL host (its NCCL_HOSTID from its
    /// global rank), as `foldprint launch --emulate-hosts` does. Also
    /// FOLDPRINT_EMULATE_HOSTS=1. A correctness run over NCCL's network
    /// transport, not a bandwidth result.
    #[arg(long)]
    pub(super) emulate_hosts: bool,
}

impl Common {
    /// The run these flags ask for, writing the report, JUnit file and
    /// `dump` where they say.
    pub(super) fn run_options(&self, dump: Option<PathBuf>) -> foldprint::run::Options {
        let (c, n) = (&self.cuda, &self.nccl);
        use foldprint::gpu::DeviceConfig;
        let mut cuda = DeviceConfig {
            variant: c.kernel,
            copy_streams: c.copy_streams,
            rank_check: c.rank_check,
            ..DeviceConfig::default()
        };
        cuda.compile.target = c.target;
        cuda.compile.ftz = c.ftz;
        cuda.compile.disk_cache = !c.no_kernel_cache;
        if let Some(b) = c.block {
            cuda.tuning.fast_block = b;
            cuda.tuning.seed_block = b;
        }
        foldprint::run::Options {
            paths: self.paths.clone(),
            backend: self.backend,
            nan_policy: self.nan_policy,
            device: cuda,
            gpus: n.gpus,
            init_timeout: std::time::Duration::from_secs(n.init_timeout),
            timeout: std::time::Duration::from_secs(n.timeout),
            emulate_hosts: n.emulate_hosts,
            out: self.out.clone(),
            junit: self.junit.clone(),
            dump,
        }
    }
}

#[derive(Args)]
pub(super) struct RunArgs {
    #[command(flatten)]
    pub(super) common: Common,
    /// Write each reduced arena as .bin plus a SHA256SUMS for `sha256sum -c`.
    #[arg(long)]
    pub(super) dump: Option<PathBuf>,
    /// Which differences from an `expect` file exit 1: `all` (any case),
    /// `none` (a finding in the report only, e.g. a recorded job asking
    /// which contract it equals), or contract names (`fixed-order`: exit 1
    /// unless the framework's result is the fixed-order one).
    #[arg(long, value_name = "GATE", default_value = "all", value_parser = super::gate::parse)]
    pub(super) expect_gate: super::gate::ExpectGate,
}

#[derive(Args)]
pub(super) struct CompareArgs {
    /// Two or more report files (or `--dump` directories, compared element
    /// by element); all are compared with the first.
    #[arg(required = true, num_args = 2..)]
    pub(super) reports: Vec<PathBuf>,
    /// Compare only the cases present in every report.
    #[arg(long)]
    pub(super) allow_missing: bool,
    /// Print the result as JSON.
    #[arg(long)]
    pub(super) json: bool,
}

#[derive(Args)]
pub(super) struct VerifyArgs {
    #[command(flatten)]
    pub(super) common: Common,
    /// Directory of golden files (one <experiment>.json each).
    #[arg(long)]
    pub(super) golden: PathBuf,
}

#[derive(Args)]
pub(super) struct GoldenArgs {
    /// Experiment files, or directories of *.toml files.
    #[arg(required = true)]
    pub(super) paths: Vec<PathBuf>,
    /// Directory to write <experiment>.json goldens into.
    #[arg(long)]
    pub(super) golden: PathBuf,
    /// NaN policy the goldens are made with, `canonical` or `preserve`
    /// (recorded in each file; `verify` must then use the same one).
    #[arg(long, default_value = "canonical", value_parser = parse_nan_policy)]
    pub(super) nan_policy: NanPolicy,
}

#[derive(Args)]
pub(super) struct DoctorArgs {
    #[arg(long)]
    pub(super) json: bool,
}

/// `--backend`, as clap's own enum parser, except that a value meaning
/// "a GPU" (`gpu`, which clap would take for a misspelt `cpu`) is told the
/// two GPU backends.
#[derive(Clone)]
pub(super) struct BackendParser;

impl clap::builder::TypedValueParser for BackendParser {
    type Value = BackendChoice;

    fn parse_ref(
        &self,
        cmd: &clap::Command,
        arg: Option<&clap::Arg>,
        value: &std::ffi::OsStr,
    ) -> Result<BackendChoice, clap::Error> {
        use clap::error::{ContextKind, ContextValue, ErrorKind};
        let plain = clap::builder::EnumValueParser::<BackendChoice>::new();
        let text = value.to_string_lossy().to_ascii_lowercase();
        if !matches!(text.as_str(), "gpu" | "gpus" | "nvidia") {
            return plain.parse_ref(cmd, arg, value);
        }
        let mut err = clap::Error::new(ErrorKind::InvalidValue).with_cmd(cmd);
        if let Some(a) = arg {
            err.insert(ContextKind::InvalidArg, ContextValue::String(a.to_string()));
        }
        err.insert(
            ContextKind::InvalidValue,
            ContextValue::String(value.to_string_lossy().into_owned()),
        );
        err.insert(
            ContextKind::ValidValue,
            ContextValue::Strings(["auto", "cpu", "cuda", "nccl"].map(String::from).to_vec()),
        );
        err.insert(
            ContextKind::Suggested,
            ContextValue::StyledStrs(vec![
                "on a GPU, name `cuda` (all W ranks on one GPU) or `nccl` (one rank per GPU over NCCL); `auto` takes cuda when a GPU is usable"
                    .into(),
            ]),
        );
        Err(err)
    }

    fn possible_values(
        &self,
    ) -> Option<Box<dyn Iterator<Item = clap::builder::PossibleValue> + '_>> {
        use clap::ValueEnum;
        Some(Box::new(
            BackendChoice::value_variants()
                .iter()
                .filter_map(|v| v.to_possible_value()),
        ))
    }
}

fn parse_nan_policy(s: &str) -> Result<NanPolicy, String> {
    s.parse()
}
