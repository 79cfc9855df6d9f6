//! GPU diagnostics that check nothing themselves: they write files or
//! print tables for a person (or another tool) to read. The fold benchmark
//! proper is `foldprint bench --backend cuda`.
//!
//! ```text
//! cargo run --release --example gpu_diagnostics -- tuning-sweep
//! cargo run --release --example gpu_diagnostics -- fold16-sweep
//! cargo run --release --example gpu_diagnostics -- torch-peer-files DIR
//! cargo run --release --example gpu_diagnostics -- fold-images DIR
//! ```
//!
//! - `tuning-sweep`: the fast fold at 12 launch shapes (256-1024 threads,
//!   4-64 blocks per SM) and W from 8 to 128, 50 launches each; exits 1 if
//!   any shape's bits differ from the others'.
//! - `fold16-sweep`: for bf16 then f16, the 16-bit fold at the bench's
//!   shapes: the production `seed` and `fast`, every kernel of
//!   `fold16_trials.cu`, and the D2D copy of the same bytes, 100 launches
//!   each, with each row's ratio to the copy; exits 1 if any row's bits
//!   differ from `seed`'s or from the host's sample.
//! - `torch-peer-files DIR`: the addends and foldprint's reduced arena of
//!   W = 8, n = 2^25, mixed-magnitude, fixed order (~1 GiB) for
//!   `bench/torch_peer.py`.
//! - `fold-images DIR`: the fold program as NVRTC builds it, with ftz off
//!   and on, as PTX and CUBIN, plus a variant with plain `+` adds, for
//!   `cuobjdump`; prints how many adds of each rounding each image holds.

use foldprint::backend::cuda::CudaBackend;
use foldprint::data::Distribution;
use foldprint::dtype::Dtype;
use foldprint::experiment::{Case, DeliveryOrder};
use foldprint::fold::Contract;
use foldprint::gpu::{self, bench, kernels, DeviceConfig, LaunchTuning};
use std::path::PathBuf;
use std::process::ExitCode;

/// A failure, said in words with what was being done.
type Result<T> = std::result::Result<T, String>;

trait Context<T> {
    fn context(self, what: impl std::fmt::Display) -> Result<T>;
}

impl<T, E: std::fmt::Display> Context<T> for std::result::Result<T, E> {
    fn context(self, what: impl std::fmt::Display) -> Result<T> {
        self.map_err(|e| format!("{what}: {e}"))
    }
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let done = match args
        .iter()
        .map(String::as_str)
        .collect::<Vec<_>>()
        .as_slice()
    {
        ["tuning-sweep"] => tuning_sweep(),
        ["fold16-sweep"] => fold16_sweep(),
        ["torch-peer-files", dir] => torch_peer_files(PathBuf::from(dir)),
        ["fold-images", dir] => fold_images(PathBuf::from(dir)),
        _ => Err(
            "usage: gpu_diagnostics tuning-sweep | fold16-sweep | torch-peer-files DIR | fold-images DIR"
                .into(),
        ),
    };
    done.unwrap_or_else(|e| {
        eprintln!("error: {e}");
        ExitCode::from(2)
    })
}

fn tuning_sweep() -> Result<ExitCode> {
    let mut extra = Vec::new();
    for fast_block in [256u32, 512, 1024] {
        for fast_blocks_per_sm in [4u32, 8, 16, 64] {
            extra.push(LaunchTuning {
                seed_block: 256,
                fast_block,
                fast_blocks_per_sm,
            });
        }
    }
    let cfg = bench::BenchConfig {
        // About the same bytes per launch at every W, from the 8 of the
        // large case to 128.
        shapes: vec![
            (8, 1 << 25),
            (16, 1 << 22),
            (32, 1 << 21),
            (48, 3 << 19),
            (64, 1 << 20),
            (128, 1 << 19),
        ],
        iters: 50,
        extra_fast: extra,
        ..bench::BenchConfig::default()
    };
    let report = bench::bench_fold(&cfg).context("tuning sweep")?;
    let mut differ = false;
    for r in &report.rows {
        println!(
            "W={:<3} n={:<9} {:<18} median {:>8.4} ms {:>6.3} TB/s bits_ok={:?}",
            r.world, r.n, r.what, r.median_ms, r.effective_tb_s, r.bits_ok
        );
        differ |= r.bits_ok == Some(false);
    }
    Ok(if differ {
        eprintln!("error: a launch shape's bits differ from the others'");
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    })
}

fn fold16_sweep() -> Result<ExitCode> {
    let mut differ = false;
    for dtype in [Dtype::Bf16, Dtype::F16] {
        let cfg = bench::BenchConfig {
            dtype,
            fold16_trials: true,
            ..bench::BenchConfig::default()
        };
        let report = bench::bench_fold(&cfg).context(format_args!("{dtype} fold sweep"))?;
        println!(
            "{dtype} on {} (NVRTC {}, {})",
            report.device, report.nvrtc, report.target
        );
        for r in &report.rows {
            let copy = report
                .rows
                .iter()
                .find(|c| (c.world, c.n, c.what.as_str()) == (r.world, r.n, "d2d-copy"))
                .map_or(f64::NAN, |c| c.effective_tb_s);
            println!(
                "{dtype:<5} W={:<3} n={:<9} {:<20} median {:>8.4} ms {:>6.3} TB/s {:>5.3}x copy bits_ok={:?}",
                r.world,
                r.n,
                r.what,
                r.median_ms,
                r.effective_tb_s,
                r.effective_tb_s / copy,
                r.bits_ok
            );
            differ |= r.bits_ok == Some(false);
        }
    }
    Ok(if differ {
        eprintln!("error: a kernel's bits differ from seed's or the host's");
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    })
}

fn torch_peer_files(dir: PathBuf) -> Result<ExitCode> {
    let mut be = CudaBackend::new(DeviceConfig::default()).context("CUDA backend")?;
    let case = Case::builder(8, [1 << 25])
        .experiment("torch-peer")
        .id("w8-2^25")
        .distribution(Distribution::MixedMagnitude)
        .contract(Contract::FixedOrder)
        .order(DeliveryOrder::Ascending)
        .build()
        .context("the case")?;
    let files = be
        .write_peer_files(&case, &dir)
        .context(format_args!("writing peer files into {}", dir.display()))?;
    println!("{}", serde_json::to_string_pretty(&files).context("JSON")?);
    Ok(ExitCode::SUCCESS)
}

fn fold_images(dir: PathBuf) -> Result<ExitCode> {
    std::fs::create_dir_all(&dir).context(format_args!("creating {}", dir.display()))?;
    let probe = gpu::probe();
    let d = probe.devices.first().ok_or("no CUDA device")?;
    let arch = (d.compute_capability.0 * 10 + d.compute_capability.1) as u32;
    let plain = kernels::FOLD_SRC
        .replace("__fadd_rn(a, b)", "a + b")
        .replace("__fmul_rn(a, s)", "a * s");
    for (src_name, src) in [("fold", kernels::FOLD_SRC.to_string()), ("plainadd", plain)] {
        for ftz in [false, true] {
            for kind in ["ptx", "cubin"] {
                let t = kernels::ResolvedTarget { kind, arch };
                let opts = kernels::option_list(false, ftz, t);
                let img = kernels::nvrtc_compile("dump", &src, &opts, t)
                    .context(format_args!("compiling {src_name} ftz={ftz} as {kind}"))?;
                let name = format!("{src_name}-ftz{ftz}.{kind}");
                let data = img.data.strip_suffix(&[0]).unwrap_or(&img.data);
                let path = dir.join(&name);
                std::fs::write(&path, data).context(format_args!("writing {}", path.display()))?;
                let text = String::from_utf8_lossy(data);
                println!(
                    "{name}: nvrtc {:?} sha {} add.rn.ftz.f32 x{} add.rn.f32 x{} add.ftz.f32 x{}",
                    img.nvrtc_version,
                    &img.sha256[..16],
                    text.matches("add.rn.ftz.f32").count(),
                    text.matches("add.rn.f32").count(),
                    text.matches("add.ftz.f32").count()
                );
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}
