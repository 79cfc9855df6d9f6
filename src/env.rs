//! The host part of a report's environment block (the backend adds its own).

use serde_json::{json, Value};

fn read_trimmed(path: &str) -> Option<String> {
    std::fs::read_to_string(path)
        .ok()
        .map(|s| s.trim().to_string())
}

fn cpu_model() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|t| {
            t.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, v)| v.trim().to_string())
        })
        .unwrap_or_else(|| std::env::consts::ARCH.to_string())
}

fn os_release() -> String {
    std::fs::read_to_string("/etc/os-release")
        .ok()
        .and_then(|t| {
            t.lines()
                .find_map(|l| l.strip_prefix("PRETTY_NAME="))
                .map(|v| v.trim_matches('"').to_string())
        })
        .unwrap_or_else(|| std::env::consts::OS.to_string())
}

/// The NVIDIA kernel driver release (e.g. 580.159.04), when one is loaded.
fn nvidia_driver() -> Option<String> {
    let text = std::fs::read_to_string("/proc/driver/nvidia/version").ok()?;
    let line = text.lines().next()?;
    let after = line.split("Kernel Module").nth(1)?;
    after.split_whitespace().next().map(str::to_string)
}

/// Byte order of the machine the binary was built for and runs on. The
/// digests never depend on it: the hashed bytes are little-endian everywhere
/// (docs/SPEC.md), which a big-endian machine proves.
pub fn endian() -> &'static str {
    if cfg!(target_endian = "big") {
        "big"
    } else {
        "little"
    }
}

/// The machine name this process is given by `uname(2)` (`uname -m`). A
/// user-mode emulator (qemu-user, directly or through binfmt_misc) answers
/// with the architecture it emulates.
fn uname_machine() -> Option<String> {
    // SAFETY: `uname` fills the zeroed struct; each field is NUL-terminated.
    let mut u: libc::utsname = unsafe { std::mem::zeroed() };
    if unsafe { libc::uname(&mut u) } != 0 {
        return None;
    }
    let bytes: Vec<u8> = u
        .machine
        .iter()
        .take_while(|&&c| c != 0)
        .map(|&c| c as u8)
        .collect();
    String::from_utf8(bytes).ok().filter(|s| !s.is_empty())
}

/// Whether the process runs under user-mode emulation: the kernel's own
/// architecture (`/proc/sys/kernel/arch`, read from the kernel and not
/// rewritten by an emulator) differs from the machine `uname(2)` reports to
/// this process. `None` when either is unknown (older kernels lack the file).
pub fn emulated(machine: Option<&str>, kernel_arch: Option<&str>) -> Option<bool> {
    match (machine, kernel_arch) {
        (Some(m), Some(k)) if !m.is_empty() && !k.is_empty() => Some(m != k),
        _ => None,
    }
}

pub fn host() -> Value {
    let machine = uname_machine();
    let kernel_arch = read_trimmed("/proc/sys/kernel/arch").filter(|s| !s.is_empty());
    json!({
        "hostname": read_trimmed("/proc/sys/kernel/hostname").unwrap_or_default(),
        "os": os_release(),
        "kernel": read_trimmed("/proc/sys/kernel/osrelease").unwrap_or_default(),
        "arch": std::env::consts::ARCH,
        "endian": endian(),
        "machine": machine,
        "kernel_arch": kernel_arch,
        "emulated": emulated(machine.as_deref(), kernel_arch.as_deref()),
        "cpu": cpu_model(),
        "cores": std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1),
        "nvidia_kernel_driver": nvidia_driver(),
    })
}

/// The provenance file a packaged build points at (`FOLDPRINT_PROVENANCE`):
/// which toolchain, CUDA and NCCL store paths the package pins. Embedded
/// verbatim; a named but unreadable file is recorded as an error, not hidden.
pub fn provenance() -> Option<Value> {
    let path = std::env::var_os("FOLDPRINT_PROVENANCE")?;
    let shown = std::path::Path::new(&path).display().to_string();
    Some(match std::fs::read_to_string(&path) {
        Err(e) => json!({ "path": shown, "error": e.to_string() }),
        Ok(text) => match serde_json::from_str::<Value>(&text) {
            Ok(v) => json!({ "path": shown, "content": v }),
            Err(e) => json!({ "path": shown, "error": format!("not JSON: {e}") }),
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn emulation_is_a_process_machine_other_than_the_kernels() {
        assert_eq!(emulated(Some("x86_64"), Some("x86_64")), Some(false));
        assert_eq!(emulated(Some("s390x"), Some("x86_64")), Some(true));
        assert_eq!(emulated(Some("aarch64"), Some("x86_64")), Some(true));
        assert_eq!(emulated(Some("x86_64"), None), None);
        assert_eq!(emulated(None, Some("x86_64")), None);
        assert_eq!(emulated(Some(""), Some("x86_64")), None);
    }

    #[test]
    fn host_records_architecture_byte_order_and_emulation() {
        let h = host();
        assert_eq!(h["arch"], std::env::consts::ARCH);
        // The byte order from memory itself, not from the cfg the code uses.
        let first = 1u32.to_ne_bytes()[0];
        assert_eq!(h["endian"], if first == 1 { "little" } else { "big" });
        let machine = h["machine"].as_str().expect("uname gives a machine name");
        assert!(!machine.is_empty());
        match (h["kernel_arch"].as_str(), &h["emulated"]) {
            (Some(k), Value::Bool(e)) => assert_eq!(*e, k != machine),
            (None, Value::Null) => {}
            other => panic!("kernel_arch and emulated disagree: {other:?}"),
        }
    }
}
