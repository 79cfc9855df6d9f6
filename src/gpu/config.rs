//! The device options a GPU backend is started with, as the command line
//! sets them: both GPU backends take the same [`DeviceConfig`].

use super::kernels::{CompileOptions, KernelVariant};
use super::LaunchTuning;
use serde::Serialize;

/// How a GPU backend uses its device. The NCCL backend takes its device
/// from the rank's placement, keeps one stream and reader per rank and
/// hashes every rank's copy where it is: it reads `variant`, `compile`,
/// `tuning` and `chunk` only.
#[derive(Debug, Clone, Serialize)]
pub struct DeviceConfig {
    pub ordinal: usize,
    pub variant: KernelVariant,
    pub compile: CompileOptions,
    /// Streams the exchange copies are spread over; below 2 they are issued
    /// in delivery order on one stream.
    pub copy_streams: usize,
    pub tuning: LaunchTuning,
    /// Host threads reading back and hashing ranks; 0 = one per core (max 16).
    pub readers: usize,
    /// Elements per pinned staging chunk.
    pub chunk: usize,
    /// How ranks 1..W-1's copies are checked against rank 0's.
    pub rank_check: RankCheck,
}

impl Default for DeviceConfig {
    fn default() -> Self {
        DeviceConfig {
            ordinal: 0,
            variant: KernelVariant::Fast,
            compile: CompileOptions::default(),
            copy_streams: 0,
            tuning: LaunchTuning::default(),
            readers: 0,
            // 1 MiB: the span being hashed stays in the hashing core's L2.
            // On the H200 host the SHA-256 of a 128 MiB arena took a few ms
            // less than with 8 MiB chunks (docs/BENCHMARKS.md).
            chunk: 1 << 18,
            rank_check: RankCheck::Device,
        }
    }
}

/// How the copies of ranks 1..W-1 on one device are checked against rank
/// 0's (the device side is [`super::Device::rank_diff`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum RankCheck {
    /// Compared bit for bit with rank 0's on the device, per chunk; only a
    /// rank that differs is read back and hashed.
    #[default]
    Device,
    /// Every rank's copy read back and hashed on the host.
    Host,
}

impl RankCheck {
    pub const fn describe(self) -> &'static str {
        match self {
            RankCheck::Device => "ranks 1..W-1 compared bit for bit with rank 0 on the device per 64 Ki-element chunk; rank 0, and any rank that differs, read back and hashed on the host",
            RankCheck::Host => "every rank's copy read back and hashed on the host",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The CUDA backend writes this config into every report
    /// (`environment.backend.config`): its keys and words are the format's.
    #[test]
    fn the_config_reports_write_keeps_its_shape() {
        let v = serde_json::to_value(DeviceConfig::default()).unwrap();
        let keys: std::collections::BTreeSet<&str> =
            v.as_object().unwrap().keys().map(String::as_str).collect();
        let want = [
            "chunk",
            "compile",
            "copy_streams",
            "ordinal",
            "rank_check",
            "readers",
            "tuning",
            "variant",
        ];
        assert_eq!(keys, want.into_iter().collect());
        assert_eq!(v["rank_check"], "device");
        assert_eq!(v["chunk"], 1 << 18);
        let host = DeviceConfig {
            rank_check: RankCheck::Host,
            ..DeviceConfig::default()
        };
        assert_eq!(serde_json::to_value(host).unwrap()["rank_check"], "host");
    }
}
