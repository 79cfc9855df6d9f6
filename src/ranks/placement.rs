//! Which device a rank uses, and whether it is its own emulated host.
//!
//! A launcher gives each rank a local rank. Without emulation the local
//! rank is the device ordinal, so a local rank at or beyond the visible
//! device count is refused here, before any rendezvous, with the fix named.
//! With emulation (`--emulate-hosts` or `FOLDPRINT_EMULATE_HOSTS=1` under
//! torchrun, srun or mpirun) ranks share devices round-robin by local rank,
//! and each gets an `NCCL_HOSTID` from its global rank, so NCCL treats every
//! process as a separate node: what `foldprint launch --emulate-hosts` does
//! for the ranks it starts itself.

use super::discover::RankEnv;
use super::launch::{host_id, HostIds, EMULATED_HOSTS_VAR};
use super::RankError;

/// Set to 1 to ask for emulated hosts without the command-line flag (a
/// launcher passes variables more easily than arguments).
pub const EMULATE_VAR: &str = "FOLDPRINT_EMULATE_HOSTS";

/// Where one rank runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placement {
    /// The CUDA device ordinal.
    pub device: usize,
    /// The `NCCL_HOSTID` this rank must run under, when it emulates a host
    /// and nobody set one already.
    pub nccl_hostid: Option<String>,
    /// What `environment.backend.emulated_hosts.layout` says, when emulated.
    pub layout: Option<String>,
}

/// Whether emulated hosts were asked for by the flag or by [`EMULATE_VAR`];
/// a value of that variable that is neither yes nor no is an error, so a
/// typo never silently runs without emulation.
pub fn emulation_requested(
    flag: bool,
    get: impl Fn(&str) -> Option<String>,
) -> Result<bool, String> {
    let var = match get(EMULATE_VAR) {
        None => false,
        Some(v) => match v.trim() {
            "1" | "true" | "yes" => true,
            "" | "0" | "false" | "no" => false,
            other => {
                return Err(format!(
                    "{EMULATE_VAR}={other:?}: expected 1 (emulate hosts) or 0"
                ))
            }
        },
    };
    Ok(flag || var)
}

/// The placement of rank `e` on a host with `devices` visible devices.
/// `hostid_set`: `NCCL_HOSTID` is already set (a launcher or the user chose
/// it; it is kept).
pub fn place(
    e: &RankEnv,
    devices: usize,
    emulate: bool,
    job: &str,
    hostid_set: bool,
) -> Result<Placement, RankError> {
    if devices == 0 {
        return Err(RankError::Placement(format!(
            "rank {} ({}): no CUDA device is visible to this process (CUDA_VISIBLE_DEVICES={})",
            e.rank,
            e.source,
            std::env::var("CUDA_VISIBLE_DEVICES").unwrap_or_else(|_| "unset".into())
        )));
    }
    if !emulate {
        if e.local_rank >= devices {
            return Err(RankError::Placement(format!(
                "rank {}: local rank {} ({} launcher) but only {devices} CUDA device(s) are visible, \
                 so it has no device of its own. Start at most {devices} rank(s) per host, or add \
                 --emulate-hosts (or set {EMULATE_VAR}=1) to share devices, each rank its own NCCL \
                 host: a correctness run over NCCL's network transport, not a bandwidth result",
                e.rank, e.local_rank, e.source
            )));
        }
        return Ok(Placement {
            device: e.local_rank,
            nccl_hostid: None,
            layout: None,
        });
    }
    Ok(Placement {
        device: e.local_rank % devices,
        nccl_hostid: (!hostid_set).then(|| host_id(job, e.rank, e.world, HostIds::Ascending)),
        layout: Some(format!(
            "{} ranks under {}, device = local rank mod {devices}",
            e.world, e.source
        )),
    })
}

/// Put an emulated placement into this process's environment, where NCCL
/// (which reads `NCCL_HOSTID` once, at its first call) and the report find
/// it. Call before NCCL is first used and before other threads read the
/// environment.
pub fn export(p: &Placement) {
    if let Some(id) = &p.nccl_hostid {
        std::env::set_var("NCCL_HOSTID", id);
    }
    if let Some(layout) = &p.layout {
        std::env::set_var(EMULATED_HOSTS_VAR, layout);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rank(rank: usize, world: usize, local_rank: usize) -> RankEnv {
        RankEnv {
            rank,
            world,
            local_rank,
            source: "torchrun",
            master: None,
            variables: Vec::new(),
            others: Vec::new(),
        }
    }

    #[test]
    fn without_emulation_the_local_rank_is_the_device_and_must_exist() {
        let p = place(&rank(1, 2, 1), 2, false, "job", false).unwrap();
        assert_eq!((p.device, p.nccl_hostid, p.layout), (1, None, None));
        // Negative control: local rank 3 on a 1-device host is refused,
        // naming both fixes.
        let e = place(&rank(3, 4, 3), 1, false, "job", false)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("local rank 3") && e.contains("--emulate-hosts") && e.contains(EMULATE_VAR),
            "{e}"
        );
        assert!(place(&rank(0, 1, 0), 0, true, "job", false).is_err());
    }

    #[test]
    fn emulated_ranks_share_devices_round_robin_with_their_own_host_ids() {
        let ps: Vec<Placement> = (0..8)
            .map(|r| place(&rank(r, 8, r % 4), 3, true, "abcdef123", false).unwrap())
            .collect();
        let devices: Vec<usize> = ps.iter().map(|p| p.device).collect();
        // Local ranks 0 1 2 3 0 1 2 3 over 3 devices.
        assert_eq!(devices, [0, 1, 2, 0, 0, 1, 2, 0]);
        let ids: std::collections::BTreeSet<_> =
            ps.iter().map(|p| p.nccl_hostid.clone().unwrap()).collect();
        assert_eq!(ids.len(), 8, "{ids:?}");
        assert_eq!(
            ps[5].nccl_hostid.as_deref(),
            Some("foldprint-abcdef12-host0005")
        );
        // A host id someone already set is kept.
        assert_eq!(
            place(&rank(5, 8, 1), 3, true, "j", true)
                .unwrap()
                .nccl_hostid,
            None
        );
    }

    #[test]
    fn emulation_is_asked_for_by_flag_or_variable() {
        let none = |_: &str| None;
        assert_eq!(emulation_requested(false, none), Ok(false));
        assert_eq!(emulation_requested(true, none), Ok(true));
        assert_eq!(
            emulation_requested(false, |_: &str| Some("1".into())),
            Ok(true)
        );
        assert_eq!(
            emulation_requested(false, |_: &str| Some("0".into())),
            Ok(false)
        );
        let typo = emulation_requested(true, |_: &str| Some("ye".into())).unwrap_err();
        assert!(
            typo.contains(EMULATE_VAR) && typo.contains("\"ye\""),
            "{typo}"
        );
    }
}
