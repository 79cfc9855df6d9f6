//! The typed shape of a report's `environment.backend` block, and the
//! library files it lists. The GPU backends write it; the audit and the
//! tables read it. It depends on no backend (only on `digest`, for the
//! libraries' SHA-256), so readers need not know any backend.
//!
//! The JSON is an object whose keys are written in sorted order: `kind`,
//! and for the GPU backends `libraries` (files mapped, from
//! /proc/self/maps) and `env` (CUDA_*, NCCL_*, LD_LIBRARY_PATH), next to
//! facts that only one backend has (device, driver, NVRTC, NCCL, programs),
//! kept as they are in `extra`. Library versions sit in `{"version": ...}`
//! objects under `nvrtc`, `driver` and `nccl`, at the top (CUDA loopback)
//! or in each of `devices` (NCCL).

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use std::collections::BTreeMap;

/// A report's `environment`, assembled in one place (`runner`). Its fields
/// are declared in sorted order, the order every report writes them.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Environment {
    /// What the backend says of itself.
    pub backend: BackendEnvironment,
    /// Time to start the backend (probe, context, compile or cache).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backend_init_ms: Option<f64>,
    pub host: HostFacts,
    /// Facts of the platform under the backend (`host_driver`: how the host's
    /// CUDA driver was found, when the process looked), and any key an
    /// older report carries that this type does not know.
    #[serde(flatten)]
    pub platform: Map<String, Value>,
    /// Things worth knowing about the run (e.g. why `auto` fell back to the
    /// CPU).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub notes: Vec<String>,
    /// The provenance file a packaged build points at.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provenance: Option<Provenance>,
}

/// The machine a report was made on (`environment.host`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HostFacts {
    /// The architecture foldprint was built for (`std::env::consts::ARCH`).
    pub arch: String,
    pub cores: usize,
    pub cpu: String,
    /// Whether the process runs under user-mode emulation; `None` unknown.
    pub emulated: Option<bool>,
    /// `little` or `big`.
    pub endian: String,
    pub hostname: String,
    pub kernel: String,
    /// The kernel's own architecture (`/proc/sys/kernel/arch`).
    pub kernel_arch: Option<String>,
    /// What `uname(2)` tells this process.
    pub machine: Option<String>,
    /// The NVIDIA kernel module's release, when one is loaded.
    pub nvidia_kernel_driver: Option<String>,
    pub os: String,
}

/// `environment.provenance`: the file `FOLDPRINT_PROVENANCE` names, embedded
/// verbatim (`content`), or why it could not be read (`error`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Provenance {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// Why the pinned libraries were not used (a CPU run under a CUDA
    /// combination).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
    pub path: String,
    /// `false` when the pinned libraries were not used.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub used: Option<bool>,
}

impl Provenance {
    /// A text field of the embedded file, by its path of keys.
    pub fn content_str(&self, keys: &[&str]) -> Option<&str> {
        let mut v = self.content.as_ref()?;
        for k in keys {
            v = v.get(k)?;
        }
        v.as_str()
    }

    /// The CUDA combination the package pins libraries for: `combination`
    /// when the file's `cuda` block is set (the CPU package has `cuda: null`).
    pub fn cuda_combination(&self) -> Option<String> {
        let c = self.content.as_ref()?;
        if c.get("cuda").is_none_or(Value::is_null) {
            return None;
        }
        Some(
            self.content_str(&["combination"])
                .unwrap_or("unknown")
                .to_string(),
        )
    }
}

impl BackendEnvironment {
    /// What the backend ran on, for a table's banner: the GPU's name, or
    /// the CPU oracle's thread count.
    pub fn on_what(&self) -> String {
        let device = self
            .fact("gpu")
            .and_then(|g| g.get("name"))
            .and_then(Value::as_str);
        match (device, self.extra.get("threads").and_then(Value::as_u64)) {
            (Some(d), _) => d.to_string(),
            (None, Some(t)) => format!("{t} threads"),
            _ => String::new(),
        }
    }

    /// The emulated-hosts layout (several NCCL ranks on one GPU), if any.
    pub fn emulated_hosts(&self) -> Option<&str> {
        self.extra.get("emulated_hosts")?.get("layout")?.as_str()
    }
}

/// One mapped library file, as `environment.backend.libraries` lists it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LoadedLibrary {
    /// Which family it belongs to: `cuda`, `nvrtc`, `nvrtc-builtins`,
    /// `nvidia-ptxjitcompiler`, `nvidia-nvvm`, `nvidia-gpucomp`,
    /// `nvidia-ml` or `nccl`.
    pub family: String,
    pub path: String,
    /// SHA-256 of the file's bytes; `None` when it could not be read.
    #[serde(default)]
    pub sha256: Option<crate::digest::Sha256>,
    #[serde(default)]
    pub bytes: Option<u64>,
}

/// Library versions an environment names (as text: the driver's is a
/// number in the JSON).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Versions {
    pub nvrtc: Option<String>,
    pub nccl: Option<String>,
    pub driver: Option<String>,
}

/// `environment.backend` of a report.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(into = "Map<String, Value>", try_from = "Map<String, Value>")]
pub struct BackendEnvironment {
    /// `cpu`, `cuda-loopback` or `nccl`.
    pub kind: String,
    /// Every tracked library file the process mapped; absent for the CPU.
    pub libraries: Option<Vec<LoadedLibrary>>,
    /// The variables that steer CUDA and NCCL; absent for the CPU.
    pub env: Option<BTreeMap<String, String>>,
    /// Everything else, as the backend wrote it.
    pub extra: Map<String, Value>,
}

const KIND: &str = "kind";
const LIBRARIES: &str = "libraries";
const ENV: &str = "env";

impl BackendEnvironment {
    /// An environment of `kind` with the given backend-specific facts.
    pub fn new(kind: &str, extra: Map<String, Value>) -> Self {
        BackendEnvironment {
            kind: kind.to_string(),
            libraries: None,
            env: None,
            extra,
        }
    }

    /// The JSON object (keys sorted, as every report writes them).
    pub fn to_value(&self) -> Value {
        Value::Object(self.clone().into())
    }

    /// Read it back from a report's `environment.backend`.
    pub fn from_value(v: &Value) -> Result<Self, String> {
        match v {
            Value::Object(map) => Self::try_from(map.clone()),
            Value::Null => Err("no backend environment".into()),
            _ => Err("the backend environment is not an object".into()),
        }
    }

    /// The first object under `key`: at the top, else in the first of
    /// `devices` that has it (the NCCL backend lists one per local rank).
    pub fn fact(&self, key: &str) -> Option<&Map<String, Value>> {
        self.extra.get(key).and_then(Value::as_object).or_else(|| {
            self.extra
                .get("devices")
                .and_then(Value::as_array)?
                .iter()
                .find_map(|d| d.get(key).and_then(Value::as_object))
        })
    }

    /// `version` of the `key` object, as text.
    fn version(&self, key: &str) -> Option<String> {
        match self.fact(key)?.get("version")? {
            Value::String(s) => Some(s.clone()),
            Value::Number(n) => Some(n.to_string()),
            _ => None,
        }
    }

    /// The NVRTC, NCCL and driver versions named.
    pub fn versions(&self) -> Versions {
        Versions {
            nvrtc: self.version("nvrtc"),
            nccl: self.version("nccl"),
            driver: self.version("driver"),
        }
    }
}

impl From<BackendEnvironment> for Map<String, Value> {
    fn from(e: BackendEnvironment) -> Self {
        let mut map = e.extra;
        map.insert(KIND.into(), Value::String(e.kind));
        if let Some(libs) = e.libraries {
            map.insert(
                LIBRARIES.into(),
                Value::Array(
                    libs.into_iter()
                        .map(|l| serde_json::to_value(l).unwrap_or(Value::Null))
                        .collect(),
                ),
            );
        }
        if let Some(env) = e.env {
            map.insert(
                ENV.into(),
                Value::Object(
                    env.into_iter()
                        .map(|(k, v)| (k, Value::String(v)))
                        .collect(),
                ),
            );
        }
        map
    }
}

impl TryFrom<Map<String, Value>> for BackendEnvironment {
    type Error = String;

    fn try_from(mut map: Map<String, Value>) -> Result<Self, String> {
        let kind = match map.remove(KIND) {
            Some(Value::String(k)) => k,
            Some(_) => return Err("`kind` is not a string".into()),
            None => return Err("no `kind`".into()),
        };
        let libraries = map
            .remove(LIBRARIES)
            .map(|v| serde_json::from_value(v).map_err(|e| format!("`libraries`: {e}")))
            .transpose()?;
        let env = map
            .remove(ENV)
            .map(|v| serde_json::from_value(v).map_err(|e| format!("`env`: {e}")))
            .transpose()?;
        Ok(BackendEnvironment {
            kind,
            libraries,
            env,
            extra: map,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What the CUDA loopback backend wrote before this type existed
    /// (docs/audit/h200.json, one configuration's block, trimmed).
    const CUDA: &str = r#"{
  "config": {"chunk": 2097152, "compile": {"fmad": false, "ftz": false, "target": {"cubin": 90}}, "copy_streams": 0},
  "driver": {"cuda_driver_api": "13.0", "version": 13000},
  "env": {"CUDA_HOME": "/usr/local/cuda", "NCCL_VERSION": "2.28.3-1"},
  "fold_program": {"bytes": 40416, "log": "", "note": null, "nvrtc_version": "13.0", "sha256": "cb"},
  "gpu": {"compute_capability": "9.0", "name": "NVIDIA H200", "sm_count": 132},
  "kind": "cuda-loopback",
  "libraries": [
    {"bytes": 4380616, "family": "nvrtc-builtins", "path": "/x/libnvrtc-builtins.so.13.0.88", "sha256": "9191919191919191919191919191919191919191919191919191919191919191"},
    {"bytes": null, "family": "cuda", "path": "/y/libcuda.so.580.159.04", "sha256": null}
  ],
  "nvrtc": {"supported_archs": [75, 90], "version": "13.0"}
}"#;

    fn pretty(v: &Value) -> String {
        serde_json::to_string_pretty(v).unwrap()
    }

    #[test]
    fn saved_blocks_round_trip_to_the_same_bytes() {
        for text in [CUDA, r#"{"kind": "cpu", "threads": 2}"#] {
            let v: Value = serde_json::from_str(text).unwrap();
            let e = BackendEnvironment::from_value(&v).unwrap();
            assert_eq!(pretty(&e.to_value()), pretty(&v));
            // Serializing the struct itself writes the same bytes.
            assert_eq!(serde_json::to_string_pretty(&e).unwrap(), pretty(&v));
            let back: BackendEnvironment = serde_json::from_str(text).unwrap();
            assert_eq!(back, e);
        }
        let e = BackendEnvironment::from_value(&serde_json::from_str(CUDA).unwrap()).unwrap();
        assert_eq!(e.kind, "cuda-loopback");
        let libs = e.libraries.as_deref().unwrap();
        assert_eq!(libs[0].family, "nvrtc-builtins");
        assert_eq!(libs[1].sha256, None);
        assert_eq!(e.env.as_ref().unwrap()["CUDA_HOME"], "/usr/local/cuda");
        assert!(!e.extra.contains_key("kind") && e.extra.contains_key("gpu"));
    }

    #[test]
    fn every_saved_audit_block_round_trips() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/audit");
        let mut seen = 0;
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.extension().is_none_or(|x| x != "json") {
                continue;
            }
            let v: Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
            for c in v["configurations"].as_array().unwrap() {
                let env = &c["environment"];
                if env.is_null() {
                    continue;
                }
                let e = BackendEnvironment::from_value(env).unwrap();
                assert_eq!(pretty(&e.to_value()), pretty(env), "{}", path.display());
                // The audit's own fields were read from these blocks.
                let want: Versions = Versions {
                    nvrtc: c["versions"]["nvrtc"].as_str().map(str::to_string),
                    nccl: c["versions"]["nccl"].as_str().map(str::to_string),
                    driver: c["versions"]["driver"].as_str().map(str::to_string),
                };
                assert_eq!(e.versions(), want, "{}", path.display());
                seen += 1;
            }
        }
        assert!(seen > 10, "only {seen} saved blocks");
    }

    #[test]
    fn versions_are_found_where_backends_put_them() {
        let env = |v: Value| BackendEnvironment::from_value(&v).unwrap().versions();
        let cuda = env(serde_json::json!({
            "kind": "cuda-loopback", "nvrtc": {"version": "13.0"}, "driver": {"version": 13000}
        }));
        assert_eq!(cuda.nvrtc.as_deref(), Some("13.0"));
        assert_eq!(cuda.driver.as_deref(), Some("13000"));
        assert_eq!(cuda.nccl, None);
        let nccl = env(serde_json::json!({
            "kind": "nccl", "nccl": {"version": "2.28.3"},
            "devices": [{"gpu": {}}, {"nvrtc": {"version": "12.4"}}]
        }));
        assert_eq!(nccl.nvrtc.as_deref(), Some("12.4"));
        assert_eq!(nccl.nccl.as_deref(), Some("2.28.3"));
        assert_eq!(env(serde_json::json!({"kind": "cpu"})), Versions::default());
    }

    #[test]
    fn a_block_without_a_kind_is_refused() {
        let e = BackendEnvironment::from_value(&serde_json::json!({"threads": 2})).unwrap_err();
        assert!(e.contains("kind"), "{e}");
        let e = BackendEnvironment::from_value(
            &serde_json::json!({"kind": "cuda-loopback", "libraries": [{"path": "/a"}]}),
        )
        .unwrap_err();
        assert!(e.contains("`libraries`"), "{e}");
    }
}
