//! `foldprint launch`: N local ranks of a command.

use super::args::LaunchArgs;
use foldprint::exit::{Context, Failure};
type Result<T, E = Failure> = std::result::Result<T, E>;

pub(super) fn run(a: LaunchArgs) -> Result<i32> {
    use foldprint::ranks::launch::{launch, ranks_need_gpus, Emulation, LaunchSpec};
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
    let needs_gpus = !a.exec && ranks_need_gpus(&args);
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
        torchrun_vars: a.exec,
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
