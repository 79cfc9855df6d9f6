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
    use foldprint::backend::cuda::host_driver::{search, SearchPlan};
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
