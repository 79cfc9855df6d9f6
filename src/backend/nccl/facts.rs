//! What a report says about how NCCL ran: emulated hosts and the
//! transports NCCL's own log names.

/// Set by `foldprint launch --emulate-hosts`: how the ranks share GPUs, and
/// this rank's NCCL host id.
pub fn emulated_hosts() -> Option<serde_json::Value> {
    let what = std::env::var(crate::ranks::launch::EMULATED_HOSTS_VAR).ok()?;
    Some(serde_json::json!({
        "enabled": true,
        "layout": what,
        "nccl_hostid": std::env::var("NCCL_HOSTID").ok(),
        "note": "every rank is its own NCCL host: traffic goes over NCCL's network transport on loopback, never NVLink or PCIe peer access; a correctness run, not a bandwidth result",
    }))
}

/// NCCL's INIT/NET log routed into a private file of this process, so the
/// report names the transports NCCL chose under any launcher, not only
/// under `foldprint launch` (which routes its ranks' logs itself). The
/// file is removed when this is dropped.
pub struct OwnLog {
    path: tempfile::TempPath,
}

impl OwnLog {
    /// Route NCCL's log, unless the user (or `launch`) already does
    /// (`NCCL_DEBUG` or `NCCL_DEBUG_FILE` set). Call before NCCL's first
    /// call, which reads these once.
    pub fn start() -> Option<OwnLog> {
        if std::env::var_os("NCCL_DEBUG").is_some() || std::env::var_os("NCCL_DEBUG_FILE").is_some()
        {
            return None;
        }
        let path = tempfile::Builder::new()
            .prefix("foldprint-nccl-")
            .suffix(".log")
            .tempfile()
            .ok()?
            .into_temp_path();
        std::env::set_var("NCCL_DEBUG", "INFO");
        std::env::set_var("NCCL_DEBUG_SUBSYS", "INIT,NET");
        std::env::set_var("NCCL_DEBUG_FILE", &path);
        Some(OwnLog { path })
    }

    /// NCCL's WARN lines so far (at most 20): what it would have printed
    /// to the terminal had its log not been routed here.
    pub fn warnings(&self) -> Vec<String> {
        let text = std::fs::read_to_string(&self.path).unwrap_or_default();
        text.lines()
            .filter(|l| l.contains("NCCL WARN"))
            .take(20)
            .map(str::to_string)
            .collect()
    }
}

/// What NCCL's own log (INIT/NET, as `foldprint launch` routes it) says
/// about the transports it chose: the network plugin and the connections
/// by transport. `None` when no readable per-process log file is set.
pub fn transport_from_log() -> Option<serde_json::Value> {
    let path = std::env::var("NCCL_DEBUG_FILE")
        .ok()
        .filter(|p| !p.contains('%'))?;
    let text = std::fs::read_to_string(path).ok()?;
    Some(summarize_nccl_log(&text))
}

fn summarize_nccl_log(text: &str) -> serde_json::Value {
    let mut network = None;
    let mut via: std::collections::BTreeMap<String, usize> = Default::default();
    for line in text.lines() {
        if let Some(rest) = line.split("NCCL INFO Using network ").nth(1) {
            network = Some(rest.trim().to_string());
        }
        if line.contains("NCCL INFO Channel") {
            if let Some(t) = line.split(" via ").nth(1) {
                *via.entry(t.trim().to_string()).or_default() += 1;
            }
        }
    }
    serde_json::json!({
        "source": "NCCL's INIT/NET log of the reporting rank",
        "network": network,
        "connections": via,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_log_summary_names_the_network_and_counts_connections_by_transport() {
        let log = "\
node:10:11 [0] NCCL INFO NCCL version 2.28.3+cuda13.0
node:10:11 [0] NCCL INFO Using network Socket
node:10:12 [0] NCCL INFO Channel 00/0 : 1[0] -> 0[0] [receive] via NET/Socket/0
node:10:12 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[0] [send] via NET/Socket/0
node:10:12 [0] NCCL INFO Channel 01/0 : 0[0] -> 2[0] [send] via NET/Socket/0/Shared
node:10:12 [0] NCCL INFO Channel 00 : 0[0] -> 1[1] via P2P/CUMEM
";
        let v = summarize_nccl_log(log);
        assert_eq!(v["network"], "Socket");
        assert_eq!(v["connections"]["NET/Socket/0"], 2);
        assert_eq!(v["connections"]["NET/Socket/0/Shared"], 1);
        assert_eq!(v["connections"]["P2P/CUMEM"], 1);
        let none = summarize_nccl_log("node:1:1 [0] NCCL INFO Bootstrap : Using eth0\n");
        assert!(none["network"].is_null());
        assert_eq!(none["connections"].as_object().unwrap().len(), 0);
    }
}
