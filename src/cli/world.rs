//! `foldprint world`: every rank a launcher started runs it. Discovery and
//! the rendezvous only, no GPU work: rank 0 prints the world as the ranks
//! agreed on it (ranks, hosts, local ranks, the device each would use), so a
//! launcher, an allocation or a firewall can be checked before a real run.

use super::args::WorldArgs;
use foldprint::exit::Failure;
use foldprint::ranks::rendezvous::{Member, Plan};
use foldprint::ranks::world::{self, Launch, World};
use foldprint::ranks::{job, placement};
type Result<T, E = Failure> = std::result::Result<T, E>;

pub(super) fn run(a: WorldArgs) -> Result<i32> {
    foldprint::interrupt::install();
    let Launch::PerRank(e) = world::discover(1)? else {
        return Err(Failure::Refused(
            "world: no launcher's rank variables are set; run it under torchrun, srun, mpirun \
             or `foldprint launch -n N -- world`"
                .into(),
        ));
    };
    let probe = foldprint::gpu::probe();
    let devices = probe.usable.then_some(probe.device_count);
    let (_, job_id, token_source) = job::identity();
    let emulate = placement::emulation_requested(a.emulate_hosts, |k| std::env::var(k).ok())
        .map_err(Failure::Refused)?;
    // Ranks of another foldprint version disagree here, not mid-run.
    let plan = Plan::new(
        &[format!("foldprint world {}", env!("CARGO_PKG_VERSION"))],
        format!("foldprint {} world check", env!("CARGO_PKG_VERSION")),
    );
    let init_timeout = std::time::Duration::from_secs(a.init_timeout);
    let mut w =
        World::new(Launch::PerRank(e.clone()), plan, init_timeout).with_emulated_hosts(emulate);
    // Where a driver answers, the device this rank would use; a rank with
    // none says why when the ranks meet, instead of failing, so rank 0
    // lists it. Elsewhere devices are not checked, and the table says so.
    if let Some(n) = devices {
        let _ = w.place(n);
    }
    w.meet(&[], std::time::Instant::now() + init_timeout)?;
    if e.rank != 0 {
        return Ok(if w.problem().is_some() { 3 } else { 0 });
    }
    let hosts: std::collections::BTreeSet<&str> =
        w.members().iter().map(|m| m.host.as_str()).collect();
    let problems: Vec<&Member> = w.members().iter().filter(|m| m.problem.is_some()).collect();
    if a.json {
        let v = serde_json::json!({
            "world": e.world,
            "launcher": e.source,
            "variables": e.variables.iter().cloned().collect::<std::collections::BTreeMap<_, _>>(),
            "other_launchers": e.others_json(),
            "rendezvous": w.how(),
            "job": job_id,
            "token_source": token_source,
            "hosts": hosts.len(),
            "devices_checked": devices.is_some(),
            "emulated_hosts": emulate,
            "members": w.members(),
        });
        outln!("{}", serde_json::to_string_pretty(&v)?);
    } else {
        let note = e
            .launcher_note()
            .map_or(String::new(), |n| format!(" ({n})"));
        outln!(
            "world of {} rank(s) under {}{note}, {} host(s); rendezvous {}; job {job_id}, token: {token_source}",
            e.world,
            e.source,
            hosts.len(),
            w.how()
        );
        let rows: Vec<Vec<String>> = w
            .members()
            .iter()
            .map(|m| {
                vec![
                    m.rank.to_string(),
                    m.local_rank.to_string(),
                    m.host.clone(),
                    m.pid.to_string(),
                    m.device.map_or("-".into(), |d| d.to_string()),
                    m.nccl_hostid.clone().unwrap_or_else(|| "-".into()),
                ]
            })
            .collect();
        let head = ["RANK", "LOCAL", "HOST", "PID", "DEVICE", "NCCL_HOSTID"].map(String::from);
        super::output::print_grid("", &head, &rows, usize::MAX);
        if devices.is_none() {
            outln!(
                "devices not checked on rank 0's host: {}",
                probe.short_reason()
            );
        }
        for m in &problems {
            outln!(
                "PROBLEM {}: {}",
                m.who(),
                m.problem.as_deref().unwrap_or("")
            );
        }
        if problems.is_empty() {
            outln!("ok: {} rank(s) met and agreed", e.world);
        }
    }
    Ok(if problems.is_empty() { 0 } else { 3 })
}
