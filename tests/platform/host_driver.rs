//! Finding the host's CUDA driver off NixOS, and reports that must not pass
//! for a GPU result. No GPU needed: the driver here is a set of shared
//! libraries compiled on the spot that carry the driver's sonames and file
//! names but no CUDA entry points, so foldprint loads them and then says
//! exactly which symbols are missing; it never calls into them.

use assert_cmd::Command;
use std::path::{Path, PathBuf};

fn fp() -> Command {
    let mut c = Command::cargo_bin("foldprint").unwrap();
    c.env_remove("LD_LIBRARY_PATH")
        .env_remove("FOLDPRINT_PROVENANCE")
        .env_remove("FOLDPRINT_DRIVER_ROOT");
    c
}

fn multiarch() -> &'static str {
    if cfg!(target_arch = "aarch64") {
        "aarch64-linux-gnu"
    } else {
        "x86_64-linux-gnu"
    }
}

/// A shared library with the given soname, compiled with the system's C
/// compiler (CI has gcc).
fn shared_lib(dir: &Path, file: &str, soname: &str) {
    std::fs::create_dir_all(dir).unwrap();
    let src = dir.join("empty.c");
    std::fs::write(&src, "int foldprint_test_marker(void) { return 7; }\n").unwrap();
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let st = std::process::Command::new(&cc)
        .args(["-shared", "-fPIC", "-o"])
        .arg(dir.join(file))
        .arg(format!("-Wl,-soname,{soname}"))
        .arg(&src)
        .status()
        .unwrap_or_else(|e| panic!("{cc}: {e} (this test needs a C compiler)"));
    assert!(st.success(), "{cc} failed");
    std::fs::remove_file(src).unwrap();
}

/// A driver root like a Debian host's: the 580.95.05 driver's libcuda,
/// libnvidia-ml and libnvidia-ptxjitcompiler (no nvvm, no gpucomp), plus a
/// libnvidia-ml of another driver version and unrelated host libraries.
fn fake_root() -> (tempfile::TempDir, PathBuf) {
    let root = tempfile::tempdir().unwrap();
    let lib = root.path().join("usr/lib").join(multiarch());
    shared_lib(&lib, "libcuda.so.580.95.05", "libcuda.so.1");
    shared_lib(&lib, "libnvidia-ml.so.580.95.05", "libnvidia-ml.so.1");
    shared_lib(
        &lib,
        "libnvidia-ptxjitcompiler.so.580.95.05",
        "libnvidia-ptxjitcompiler.so.1",
    );
    shared_lib(&lib, "libnvidia-ml.so.550.54.14", "libnvidia-ml.so.1");
    shared_lib(&lib, "libz.so.1.2.13", "libz.so.1");
    std::os::unix::fs::symlink("libcuda.so.580.95.05", lib.join("libcuda.so.1")).unwrap();
    (root, lib)
}

/// Whether the machine's own loader can find a libcuda (a GPU host): then
/// bare-name lookups may reach that one, and the fake is only preloaded.
fn host_has_libcuda() -> bool {
    std::process::Command::new("/sbin/ldconfig")
        .arg("-p")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).contains("libcuda.so"))
        .unwrap_or(false)
}

#[test]
fn doctor_finds_and_loads_the_driver_by_path_when_the_loader_cannot() {
    let (root, lib) = fake_root();
    let out = fp()
        .arg("doctor")
        .env("FOLDPRINT_DRIVER_ROOT", root.path())
        .output()
        .unwrap();
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    let cuda = lib.join("libcuda.so.580.95.05");
    assert!(
        text.contains("found by foldprint and loaded by full path"),
        "{text}"
    );
    for f in [
        "libcuda.so",
        "libnvidia-ml.so",
        "libnvidia-ptxjitcompiler.so",
    ] {
        let want = lib.join(format!("{f}.580.95.05"));
        assert!(text.contains(&want.display().to_string()), "{f}: {text}");
    }
    assert!(
        text.contains("libnvidia-nvvm             MISSING: not found"),
        "{text}"
    );
    assert!(text.contains("libnvidia-gpucomp"), "{text}");
    assert!(text.contains("driver libraries 580.95.05"), "{text}");
    assert!(
        text.contains("ignored (another driver version)") && text.contains("550.54.14"),
        "{text}"
    );
    assert!(
        !text.contains("libz"),
        "host libraries must not be listed: {text}"
    );
    if !host_has_libcuda() {
        // cudarc's lookup of `libcuda.so.1` by bare name reached the file
        // opened by path (same soname), and the probe says what it lacks.
        assert!(
            text.contains(&format!("driver: libcuda.so.1 -> {}", cuda.display())),
            "{text}"
        );
        assert!(
            text.contains(&format!(
                "the CUDA driver library {} lacks ",
                cuda.display()
            )),
            "{text}"
        );
    }

    let out = fp()
        .args(["doctor", "--json"])
        .env("FOLDPRINT_DRIVER_ROOT", root.path())
        .output()
        .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["host_driver"]["how"], "found", "{v}");
    let loaded: Vec<&str> = v["host_driver"]["loaded"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_str().unwrap())
        .collect();
    assert_eq!(loaded.len(), 3, "{loaded:?}");
    assert_eq!(*loaded.last().unwrap(), cuda.display().to_string());
    assert!(
        !loaded
            .iter()
            .any(|p| p.contains("550.54.14") || p.contains("libz")),
        "{loaded:?}"
    );
}

#[test]
fn doctor_names_every_missing_library_without_a_driver() {
    let empty = tempfile::tempdir().unwrap();
    let out = fp()
        .arg("doctor")
        .env("FOLDPRINT_DRIVER_ROOT", empty.path())
        .output()
        .unwrap();
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("no libcuda found"), "{text}");
    for l in [
        "libcuda",
        "libnvidia-ml",
        "libnvidia-ptxjitcompiler",
        "libnvidia-nvvm",
        "libnvidia-gpucomp",
    ] {
        assert!(
            text.lines()
                .any(|x| x.trim_start().starts_with(l) && x.contains("MISSING")),
            "{l}: {text}"
        );
    }
    assert!(text.contains("needed for NCCL (NVML)"), "{text}");
    assert!(
        text.contains(&format!(
            "searched: {}",
            empty.path().join("run/opengl-driver/lib").display()
        )),
        "{text}"
    );
}

fn provenance(dir: &Path, cuda: bool) -> PathBuf {
    let p = dir.join("provenance.json");
    let v = serde_json::json!({
        "format": "foldprint-provenance",
        "combination": if cuda { "cuda12_9" } else { "cpu" },
        "cuda": if cuda { serde_json::json!({"package_set": "cudaPackages_12_9", "version": "12.9"}) } else { serde_json::Value::Null },
        "foldprint": {"version": "0.1.0", "git": "0123456789abcdef0123456789abcdef01234567"},
    });
    std::fs::write(&p, v.to_string()).unwrap();
    p
}

#[test]
fn a_cpu_run_under_a_cuda_combination_says_it_is_not_a_gpu_result() {
    let dir = tempfile::tempdir().unwrap();
    let prov = provenance(dir.path(), true);
    let report = dir.path().join("r.json");
    let out = fp()
        .args(["run", "experiments/smoke.toml", "--backend", "cpu", "--out"])
        .arg(&report)
        .env("FOLDPRINT_PROVENANCE", &prov)
        .output()
        .unwrap();
    assert!(out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stderr.contains("warning: the CPU backend ran under the CUDA combination `cuda12_9`"),
        "{stderr}"
    );
    assert_eq!(stdout.matches("NOT A GPU RESULT").count(), 2, "{stdout}");
    let r: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&report).unwrap()).unwrap();
    assert_eq!(r["backend"], "cpu");
    assert_eq!(r["environment"]["provenance"]["used"], false);
    let note = r["environment"]["provenance"]["note"].as_str().unwrap();
    assert!(note.contains("not a GPU result of `cuda12_9`"), "{note}");
    assert!(r["environment"]["notes"]
        .as_array()
        .unwrap()
        .iter()
        .any(|n| n == note));
    // The packaged binary carries no revision; the wrapper's provenance does.
    if option_env!("FOLDPRINT_GIT_REV").is_none() {
        assert_eq!(
            r["foldprint"]["git"],
            "0123456789abcdef0123456789abcdef01234567"
        );
    }

    // `doctor` under the same wrapper environment names the pins.
    let out = fp()
        .arg("doctor")
        .env("FOLDPRINT_PROVENANCE", &prov)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("pins   cuda12_9 (cudaPackages_12_9; NVRTC none; NCCL none) from"),
        "{text}"
    );

    // `compare` warns about it too.
    let out = fp()
        .args(["compare"])
        .arg(&report)
        .arg(&report)
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&out.stderr).contains("not a GPU result"));

    // Negative control: the CPU package (cuda: null) is not marked.
    let prov = provenance(dir.path(), false);
    let out = fp()
        .args(["run", "experiments/smoke.toml", "--backend", "cpu", "--out"])
        .arg(&report)
        .env("FOLDPRINT_PROVENANCE", &prov)
        .output()
        .unwrap();
    assert!(out.status.success());
    assert!(!String::from_utf8_lossy(&out.stdout).contains("NOT A GPU RESULT"));
    assert!(!String::from_utf8_lossy(&out.stderr).contains("warning"));
    let r: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&report).unwrap()).unwrap();
    assert!(r["environment"]["provenance"].get("used").is_none(), "{r}");
}

/// A driver directory known only to the loader cache (as /etc/ld.so.conf.d
/// entries make it on RPM hosts): the cache, written by the real ldconfig
/// (`-X`: no links; unprivileged), leads the search to it.
#[test]
fn the_loader_cache_leads_to_a_driver_directory_nothing_else_names() {
    use foldprint::gpu::host_driver::{search, SearchPlan};
    let ldconfig = ["/sbin/ldconfig", "/usr/sbin/ldconfig"]
        .into_iter()
        .find(|p| Path::new(p).exists())
        .expect("this test needs ldconfig");
    let dir = tempfile::tempdir().unwrap();
    let lib = dir.path().join("opt/nvidia/lib64");
    shared_lib(&lib, "libcuda.so.580.95.05", "libcuda.so.1");
    shared_lib(&lib, "libnvidia-ml.so.580.95.05", "libnvidia-ml.so.1");
    for l in ["libcuda", "libnvidia-ml"] {
        std::os::unix::fs::symlink(format!("{l}.so.580.95.05"), lib.join(format!("{l}.so.1")))
            .unwrap();
    }
    let plan = |conf_lines: &str| {
        let conf = dir.path().join("ld.so.conf");
        let cache = dir.path().join("ld.so.cache");
        std::fs::write(&conf, conf_lines).unwrap();
        let st = std::process::Command::new(ldconfig)
            .arg("-X")
            .arg("-C")
            .arg(&cache)
            .arg("-f")
            .arg(&conf)
            .status()
            .unwrap();
        assert!(st.success());
        SearchPlan {
            root: PathBuf::from("/"),
            first_dirs: vec![],
            cache,
            dirs: vec![],
            module_version_file: dir.path().join("no-module"),
        }
    };
    let s = search(&plan(&format!("{}\n", lib.display())));
    let found: Vec<(&str, &str)> = s.found.iter().map(|f| (f.name, f.path.as_str())).collect();
    let cuda = std::fs::canonicalize(lib.join("libcuda.so.580.95.05")).unwrap();
    let ml = std::fs::canonicalize(lib.join("libnvidia-ml.so.580.95.05")).unwrap();
    assert_eq!(
        found,
        [
            ("libnvidia-ml", ml.to_str().unwrap()),
            ("libcuda", cuda.to_str().unwrap())
        ]
    );
    assert!(
        s.found
            .iter()
            .all(|f| f.source.starts_with("loader cache ")),
        "{s:?}"
    );
    // Negative control: the same files, a cache that does not list them.
    let s = search(&plan("\n"));
    assert!(s.found.is_empty(), "{s:?}");
}

/// `doctor --json` under a driver root: which files were loaded by path.
fn doctor_json(root: &Path) -> serde_json::Value {
    let out = fp()
        .args(["doctor", "--json"])
        .env("FOLDPRINT_DRIVER_ROOT", root)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    serde_json::from_slice(&out.stdout).unwrap()
}

fn found_path(v: &serde_json::Value, name: &str) -> Option<String> {
    v["driver_libraries"]["found"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["name"] == name)
        .map(|f| f["path"].as_str().unwrap().to_string())
}

/// A stale libcuda of an old `.run` install comes first in the search
/// order; the running kernel module's version picks the other one.
#[test]
fn the_running_kernel_module_picks_its_own_libcuda_over_a_stale_one() {
    let root = tempfile::tempdir().unwrap();
    let stale = root.path().join("usr/lib").join(multiarch());
    shared_lib(&stale, "libcuda.so.535.104.05", "libcuda.so.1");
    let current = root.path().join("usr/local/nvidia/lib64");
    shared_lib(&current, "libcuda.so.580.95.05", "libcuda.so.1");
    shared_lib(&current, "libnvidia-ml.so.580.95.05", "libnvidia-ml.so.1");
    let canon = |p: PathBuf| std::fs::canonicalize(p).unwrap().display().to_string();
    let stale_cuda = canon(stale.join("libcuda.so.535.104.05"));
    let current_cuda = canon(current.join("libcuda.so.580.95.05"));

    // Negative control: without a loaded module, the first one found wins.
    let v = doctor_json(root.path());
    assert_eq!(found_path(&v, "libcuda"), Some(stale_cuda.clone()), "{v}");

    let proc = root.path().join("proc/driver/nvidia");
    std::fs::create_dir_all(&proc).unwrap();
    std::fs::write(
        proc.join("version"),
        "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.95.05  Release Build  (dvs-builder@U16-I3-B03-4-3)  Tue Sep 23 09:47:39 UTC 2025\n\
         GCC version:  gcc version 13.3.0 (Ubuntu 13.3.0-6ubuntu2~24.04)\n",
    )
    .unwrap();
    let v = doctor_json(root.path());
    assert_eq!(found_path(&v, "libcuda"), Some(current_cuda.clone()), "{v}");
    assert_eq!(v["driver_libraries"]["kernel_module"], "580.95.05", "{v}");
    assert!(
        v["driver_libraries"]["ignored"]
            .as_array()
            .unwrap()
            .iter()
            .any(|p| p.as_str() == Some(stale_cuda.as_str())),
        "{v}"
    );
    let loaded = v["host_driver"]["loaded"].as_array().unwrap();
    assert!(
        loaded
            .iter()
            .all(|p| p.as_str() != Some(stale_cuda.as_str())),
        "{v}"
    );
}

/// WSL2: libcuda has no driver version in its name and needs libdxcore,
/// which is loaded by path from libcuda's own directory; without it the
/// search says why cuInit will fail.
#[test]
fn wsl_libcuda_is_loaded_with_its_libdxcore_or_the_missing_one_is_named() {
    let root = tempfile::tempdir().unwrap();
    let wsl = root.path().join("usr/lib/wsl/lib");
    shared_lib(&wsl, "libcuda.so.1.1", "libcuda.so.1");
    std::os::unix::fs::symlink("libcuda.so.1.1", wsl.join("libcuda.so.1")).unwrap();

    let v = doctor_json(root.path());
    assert_eq!(v["driver_libraries"]["wsl"], true, "{v}");
    let missing = v["driver_libraries"]["missing"].as_array().unwrap();
    let dx = missing.iter().find(|m| m["name"] == "libdxcore").unwrap();
    assert!(
        dx["reason"]
            .as_str()
            .unwrap()
            .contains("beside WSL2's libcuda"),
        "{v}"
    );
    let out = fp()
        .arg("doctor")
        .env("FOLDPRINT_DRIVER_ROOT", root.path())
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.lines()
            .any(|l| l.trim_start().starts_with("libdxcore") && l.contains("MISSING")),
        "{text}"
    );

    shared_lib(&wsl, "libdxcore.so", "libdxcore.so");
    let v = doctor_json(root.path());
    let dx = std::fs::canonicalize(wsl.join("libdxcore.so")).unwrap();
    assert_eq!(
        found_path(&v, "libdxcore"),
        Some(dx.display().to_string()),
        "{v}"
    );
    let loaded: Vec<&str> = v["host_driver"]["loaded"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_str().unwrap())
        .collect();
    assert!(loaded.contains(&dx.to_str().unwrap()), "{loaded:?}");
    assert!(
        loaded.last().unwrap().ends_with("libcuda.so.1.1"),
        "{loaded:?}"
    );
}

/// Off WSL, a missing libdxcore is not worth a line; the confidential-
/// computing libraries are found and loaded beside libcuda when present.
#[test]
fn the_confidential_computing_libraries_are_loaded_beside_libcuda() {
    let (root, lib) = fake_root();
    shared_lib(
        &lib,
        "libnvidia-pkcs11.so.580.95.05",
        "libnvidia-pkcs11.so.580.95.05",
    );
    let v = doctor_json(root.path());
    let want = lib.join("libnvidia-pkcs11.so.580.95.05");
    assert_eq!(
        found_path(&v, "libnvidia-pkcs11"),
        Some(std::fs::canonicalize(&want).unwrap().display().to_string()),
        "{v}"
    );
    assert!(
        v["host_driver"]["loaded"]
            .as_array()
            .unwrap()
            .iter()
            .any(|p| p
                .as_str()
                .unwrap()
                .ends_with("libnvidia-pkcs11.so.580.95.05")),
        "{v}"
    );
    let out = fp()
        .arg("doctor")
        .env("FOLDPRINT_DRIVER_ROOT", root.path())
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(!text.contains("libdxcore"), "{text}");
    assert!(text.contains("libnvidia-pkcs11-openssl3"), "{text}");
}

/// The C library this test process runs on, from its own mappings.
fn own_libc() -> PathBuf {
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
    maps.lines()
        .filter_map(|l| l.splitn(6, ' ').nth(5).map(str::trim_start))
        .find(|p| p.rsplit('/').next() == Some("libc.so.6"))
        .map(PathBuf::from)
        .expect("this test needs a glibc-linked test binary")
}

/// A directory on LD_LIBRARY_PATH with another C library than the one
/// beside the loader is named by `doctor`; the loader's own is not.
#[test]
fn doctor_warns_of_a_foreign_c_library_on_the_library_path() {
    let libc = own_libc();
    let foreign = tempfile::tempdir().unwrap();
    // A copy: another file, so another C library as far as the check can
    // tell, and one this process's loader still runs with.
    std::fs::copy(&libc, foreign.path().join("libc.so.6")).unwrap();
    let same = tempfile::tempdir().unwrap();
    std::os::unix::fs::symlink(&libc, same.path().join("libc.so.6")).unwrap();
    let empty = tempfile::tempdir().unwrap();
    let doctor = |path: &Path| {
        let out = fp()
            .arg("doctor")
            .env("FOLDPRINT_DRIVER_ROOT", empty.path())
            .env("LD_LIBRARY_PATH", path)
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let text = doctor(foreign.path());
    assert!(
        text.contains(&format!(
            "warning: LD_LIBRARY_PATH holds {}",
            foreign.path().display()
        )),
        "{text}"
    );
    // Negative control: the loader's own C library, through a link.
    let text = doctor(same.path());
    assert!(!text.contains("warning: LD_LIBRARY_PATH"), "{text}");
}
