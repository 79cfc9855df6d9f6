//! The host part of a report's environment block (the backend adds its
//! own), and the provenance a packaged build points at.

pub use crate::environment::{HostFacts, Provenance};
use serde_json::Value;

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
    kernel_module_version(&std::fs::read_to_string("/proc/driver/nvidia/version").ok()?)
}

/// The version in `/proc/driver/nvidia/version`'s first line: the first
/// dotted number after "Kernel Module" (open modules insert "for x86_64"
/// before it, proprietary ones do not).
pub fn kernel_module_version(text: &str) -> Option<String> {
    let after = text.lines().next()?.split("Kernel Module").nth(1)?;
    after
        .split_whitespace()
        .find(|t| {
            t.split('.').count() >= 2
                && t.split('.')
                    .all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))
        })
        .map(str::to_string)
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
    // SAFETY: utsname is plain bytes; all-zero is a valid value.
    let mut u: libc::utsname = unsafe { std::mem::zeroed() };
    // SAFETY: `uname` fills the struct; each field is NUL-terminated.
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

pub fn facts() -> HostFacts {
    let machine = uname_machine();
    let kernel_arch = read_trimmed("/proc/sys/kernel/arch").filter(|s| !s.is_empty());
    HostFacts {
        hostname: hostname(),
        os: os_release(),
        kernel: read_trimmed("/proc/sys/kernel/osrelease").unwrap_or_default(),
        arch: std::env::consts::ARCH.to_string(),
        endian: endian().to_string(),
        emulated: emulated(machine.as_deref(), kernel_arch.as_deref()),
        machine,
        kernel_arch,
        cpu: cpu_model(),
        cores: std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1),
        nvidia_kernel_driver: nvidia_driver(),
    }
}

/// The provenance file a packaged build points at (`FOLDPRINT_PROVENANCE`):
/// which toolchain, CUDA and NCCL store paths the package pins. Embedded
/// verbatim; a named but unreadable file is recorded as an error, not hidden.
pub fn provenance() -> Option<Provenance> {
    let path = std::env::var_os("FOLDPRINT_PROVENANCE")?;
    let (content, error) = match std::fs::read_to_string(&path) {
        Err(e) => (None, Some(e.to_string())),
        Ok(text) => match serde_json::from_str::<Value>(&text) {
            Ok(v) => (Some(v), None),
            Err(e) => (None, Some(format!("not JSON: {e}"))),
        },
    };
    Some(Provenance {
        content,
        error,
        note: None,
        path: std::path::Path::new(&path).display().to_string(),
        used: None,
    })
}

/// When the CPU backend runs under a package that pins CUDA libraries (a
/// fallback of `--backend auto`, or `--backend cpu`), the sentence saying
/// that this is not that combination's GPU result; `None` otherwise.
pub fn cpu_under_cuda_combination(
    backend: &str,
    provenance: Option<&Provenance>,
) -> Option<String> {
    if backend != "cpu" {
        return None;
    }
    let combo = provenance?.cuda_combination()?;
    Some(format!(
        "the CPU backend ran under the CUDA combination `{combo}`: its pinned NVRTC/NCCL were not used, \
         so this is the CPU oracle's result, not a GPU result of `{combo}`"
    ))
}

/// This machine's host name (the kernel's, as `hostname` prints it).
pub fn hostname() -> String {
    read_trimmed("/proc/sys/kernel/hostname").unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_kernel_module_version_is_read_from_both_module_flavours() {
        let open = "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.159.04  Release Build  (dvs-builder@U22-I3-AE18-23-3)  Thu Jul 31 22:24:33 UTC 2025\nGCC version:  gcc version 12.3.0\n";
        assert_eq!(kernel_module_version(open).as_deref(), Some("580.159.04"));
        let proprietary = "NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.104.05  Sat Aug 19 01:15:15 UTC 2023\n";
        assert_eq!(
            kernel_module_version(proprietary).as_deref(),
            Some("535.104.05")
        );
        assert_eq!(
            kernel_module_version("NVRM version: something else\n"),
            None
        );
    }

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
        let h = facts();
        assert_eq!(h.arch, std::env::consts::ARCH);
        // The byte order from memory itself, not from the cfg the code uses.
        let first = 1u32.to_ne_bytes()[0];
        assert_eq!(h.endian, if first == 1 { "little" } else { "big" });
        let machine = h.machine.as_deref().expect("uname gives a machine name");
        assert!(!machine.is_empty());
        match (h.kernel_arch.as_deref(), h.emulated) {
            (Some(k), Some(e)) => assert_eq!(e, k != machine),
            (None, None) => {}
            other => panic!("kernel_arch and emulated disagree: {other:?}"),
        }
    }
}
