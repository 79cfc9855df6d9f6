//! `foldprint world`: every rank a launcher started runs it. Discovery and
//! the rendezvous only, no GPU work: rank 0 prints the world as the ranks
//! agreed on it (ranks, hosts, local ranks, the device each would use), so a
//! launcher, an allocation or a firewall can be checked before a real run.

use super::args::WorldArgs;
use foldprint::exit::Failure;
use foldprint::ranks::rendezvous::{self, Member, Plan};
use foldprint::ranks::{discover, job, placement};
type Result<T, E = Failure> = std::result::Result<T, E>;

pub(super) fn run(a: WorldArgs) -> Result<i32> {
    foldprint::interrupt::install();
    let Some(e) = discover::from_process_env()? else {
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
    let mut me = Member::this(&e);
    // Where a driver answers, the device this rank would use (or why it
    // has none); elsewhere devices are not checked, and the table says so.
    if let Some(n) = devices {
        let hostid_set = me.nccl_hostid.is_some();
        match placement::place(&e, n, emulate, &job_id, hostid_set) {
            Ok(p) => {
                me.device = Some(p.device);
                if p.nccl_hostid.is_some() {
                    me.nccl_hostid = p.nccl_hostid;
                }
            }
            Err(err) => me.problem = Some(err.to_string()),
        }
    }
    // Ranks of another foldprint version disagree here, not mid-run.
    let plan = Plan::new(
        &[format!("foldprint world {}", env!("CARGO_PKG_VERSION"))],
        format!("foldprint {} world check", env!("CARGO_PKG_VERSION")),
    );
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(a.init_timeout);
    let agreed = rendezvous::exchange(&e, &me, &plan, &[], deadline)?;
    if e.rank != 0 {
        return Ok(if me.problem.is_some() { 3 } else { 0 });
    }
    let hosts: std::collections::BTreeSet<&str> =
        agreed.members.iter().map(|m| m.host.as_str()).collect();
    let problems: Vec<&Member> = agreed
        .members
        .iter()
        .filter(|m| m.problem.is_some())
        .collect();
    if a.json {
        let v = serde_json::json!({
            "world": e.world,
            "launcher": e.source,
            "variables": e.variables.iter().cloned().collect::<std::collections::BTreeMap<_, _>>(),
            "other_launchers": e.others_json(),
            "rendezvous": agreed.how,
            "job": job_id,
            "token_source": token_source,
            "hosts": hosts.len(),
            "devices_checked": devices.is_some(),
            "emulated_hosts": emulate,
            "members": agreed.members,
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
            agreed.how
        );
        let rows: Vec<Vec<String>> = agreed
            .members
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
