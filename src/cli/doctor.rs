//! `doctor`: which backends can run here, and what is missing.

use foldprint::exit::Failure;
type Result<T, E = Failure> = std::result::Result<T, E>;
use foldprint::gpu::{host_driver, probe, probe::version_text};

fn lib_line(name: &str, l: &foldprint::gpu::probe::LibraryProbe) -> String {
    match (&l.opened_name, &l.path) {
        (Some(n), Some(p)) => format!("{name}: {n} -> {p}"),
        (Some(n), None) => format!("{name}: {n}"),
        (None, _) => format!(
            "{name}: NOT FOUND (tried {}{}){}",
            l.names_tried
                .iter()
                .take(3)
                .cloned()
                .collect::<Vec<_>>()
                .join(", "),
            if l.names_tried.len() > 3 {
                format!(" and {} more", l.names_tried.len() - 3)
            } else {
                String::new()
            },
            l.error
                .as_ref()
                .map_or(String::new(), |e| format!("; loader: {e}"))
        ),
    }
}

/// The host driver's libraries: how libcuda was obtained, then every
/// library of the driver with where it is, or why it is missing.
fn print_host_driver(kernel_module: Option<&str>) {
    let Some(d) = host_driver::state() else {
        return;
    };
    let how = match d.how {
        "loader" => "libraries: libcuda found by the dynamic loader (LD_LIBRARY_PATH, /run/opengl-driver/lib, or the system's own cache)",
        "found" => "libraries: libcuda not on the loader's path, found by foldprint and loaded by full path",
        _ => "libraries: no libcuda found",
    };
    outln!("driver {how}");
    // In `loader` mode no search ran; run one now, for the listing only.
    let own;
    let search = match &d.search {
        Some(s) => s,
        None => {
            own = host_driver::search(&host_driver::SearchPlan::from_env().0);
            &own
        }
    };
    for lib in host_driver::DRIVER_LIBRARIES.iter().rev() {
        if let Some(f) = search.found.iter().find(|f| f.name == lib.name) {
            outln!("       {:<26} {} ({})", lib.name, f.path, f.source);
        } else if let Some(m) = search
            .missing
            .iter()
            .find(|m| m.name == lib.name && (m.name != "libdxcore" || search.wsl))
        {
            outln!(
                "       {:<26} MISSING: {}; needed for {}",
                lib.name,
                m.reason,
                m.needed_for
            );
        }
    }
    let kernel_module = search.kernel_module.as_deref().or(kernel_module);
    match (search.driver_version.as_deref(), kernel_module) {
        (Some(v), Some(k)) if v != k => outln!(
            "       driver libraries {v} but kernel module {k}: cuInit will refuse (reboot or reinstall the driver)"
        ),
        (Some(v), Some(_)) => outln!("       driver libraries {v}, the running kernel module's"),
        (Some(v), _) => outln!("       driver libraries {v}"),
        _ => {}
    }
    if !search.ignored.is_empty() {
        outln!(
            "       ignored (another driver version): {}",
            search.ignored.join(", ")
        );
    }
    for e in &d.load_errors {
        outln!("       could not load {e}");
    }
    outln!("       searched: {}", search.searched.join(", "));
    for dir in host_driver::foreign_libc_dirs() {
        outln!(
            "warning: LD_LIBRARY_PATH holds {dir}, which has a C library other than this program's: \
             a Nix-built foldprint would load the host's glibc under Nix's loader. Unset it or \
             name only the driver's own directory (foldprint finds the driver by itself)"
        );
    }
}

/// The NCCL a run would load, from where and which version; or, name by
/// name, why none can be loaded. A report line, never an error: a machine
/// without NCCL still runs the other backends.
fn nccl_lines(p: &foldprint::backend::nccl::loader::NcclProbe) -> Vec<String> {
    const VAR: &str = "FOLDPRINT_NCCL_LIBRARY";
    let from = |name: &str| {
        let path = match &p.path {
            Some(x) if x != name => format!(" -> {x}"),
            _ => String::new(),
        };
        match &p.requested {
            Some(r) if r == name => format!("{VAR}={name}{path}"),
            _ => format!("{name}{path} (the loader's search)"),
        }
    };
    let mut lines = Vec::new();
    match (&p.opened, &p.version) {
        (Some(name), Some(v)) => lines.push(format!("nccl   NCCL {v}: {}", from(name))),
        (Some(name), None) => {
            lines.push(format!(
                "nccl   NOT usable: {} opens but is not a usable NCCL ({}); the NCCL backend would fail here",
                from(name),
                p.error.as_deref().unwrap_or("no version")
            ));
        }
        (None, _) => lines.push(
            "nccl   NOT FOUND: no NCCL library loads here, so the NCCL backend cannot run (cpu and cuda can)"
                .into(),
        ),
    }
    for f in &p.failed {
        let requested = p.requested.as_deref() == Some(f.name.as_str());
        // Once a later name opened, an earlier one missing is no news,
        // except the file the user named.
        if p.opened.is_some() && !requested {
            continue;
        }
        let who = match requested {
            true => format!("{VAR}={}", f.name),
            false => f.name.clone(),
        };
        // dlerror's text often starts with the name again.
        let why = f.reason.strip_prefix(&format!("{}: ", f.name));
        let why = why.unwrap_or(&f.reason);
        lines.push(format!("       could not load {who}: {why}"));
    }
    if p.opened.is_none() && p.requested.is_some() {
        lines.push(format!(
            "       a run refuses to start rather than load another NCCL: fix {VAR} or unset it"
        ));
    } else if p.opened.is_none() {
        lines.push(format!(
            "       install NCCL, put its lib directory on LD_LIBRARY_PATH, or set {VAR}=/path/to/libnccl.so.2"
        ));
    }
    lines
}

pub fn run(json: bool) -> Result<i32> {
    let host = foldprint::host::facts();
    let cpu = serde_json::json!({
        "usable": true,
        "threads": rayon::current_num_threads(),
        "available_memory": foldprint::memory::available_memory(),
    });
    let cuda = probe();
    let nccl = foldprint::backend::nccl::loader::probe();
    if json {
        let search = host_driver::state().map(|d| match &d.search {
            Some(s) => s.clone(),
            None => host_driver::search(&host_driver::SearchPlan::from_env().0),
        });
        let v = serde_json::json!({
            "host": host,
            "cpu": cpu,
            "cuda": cuda,
            "host_driver": host_driver::state(),
            "foreign_libc_on_library_path": host_driver::foreign_libc_dirs(),
            "driver_libraries": search,
            "nccl": nccl,
        });
        outln!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(0);
    }
    outln!("host   {} · {} · {} cores", host.os, host.cpu, host.cores);
    outln!(
        "cpu    usable · {} threads · {} MiB available",
        cpu["threads"],
        cpu["available_memory"]
            .as_u64()
            .map_or("?".into(), |b| (b >> 20).to_string())
    );
    outln!(
        "cuda   {}",
        if cuda.usable {
            "usable".to_string()
        } else {
            format!("NOT usable: {}", cuda.short_reason())
        }
    );
    outln!("       {}", lib_line("driver", &cuda.driver_library));
    if let Some(v) = cuda.driver_version {
        outln!("       driver API {}", version_text(v));
    }
    if let Some(e) = &cuda.driver_error {
        outln!("       driver error: {e}");
    }
    for d in &cuda.devices {
        outln!(
            "       device {}: {} · sm_{}{} · {} SMs · {} MiB",
            d.ordinal,
            d.name,
            d.compute_capability.0,
            d.compute_capability.1,
            d.sm_count,
            d.total_memory_bytes >> 20
        );
    }
    outln!("       {}", lib_line("nvrtc", &cuda.nvrtc_library));
    if let Some((a, b)) = cuda.nvrtc_version {
        outln!("       NVRTC {a}.{b}");
    }
    if let Some(e) = &cuda.nvrtc_error {
        outln!("       NVRTC error: {e}");
    }
    print_host_driver(host.nvidia_kernel_driver.as_deref());
    for l in nccl_lines(&nccl) {
        outln!("{l}");
    }
    if let Some(p) = foldprint::host::provenance() {
        let v = |lib: &str| p.content_str(&[lib, "version"]).unwrap_or("none");
        outln!(
            "pins   {} ({}; NVRTC {}; NCCL {}) from {}",
            p.content_str(&["combination"]).unwrap_or("?"),
            p.content_str(&["cuda", "package_set"])
                .unwrap_or("no CUDA set"),
            v("nvrtc"),
            v("nccl"),
            p.path
        );
        if let Some(e) = &p.error {
            outln!("       provenance file unreadable: {e}");
        }
    }
    outln!(
        "auto   would use {}",
        if cuda.usable { "cuda" } else { "cpu" }
    );
    Ok(0)
}
