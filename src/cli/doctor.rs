//! `doctor`: which backends can run here, and what is missing.

use anyhow::Result;
use foldprint::backend::cuda::{probe, probe::version_text};

fn lib_line(name: &str, l: &foldprint::backend::cuda::probe::LibraryProbe) -> String {
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

pub fn run(json: bool) -> Result<i32> {
    let host = foldprint::env::host();
    let cpu = serde_json::json!({
        "usable": true,
        "threads": rayon::current_num_threads(),
        "available_memory": foldprint::backend::cpu::available_memory(),
    });
    let cuda = probe();
    if json {
        let v = serde_json::json!({ "host": host, "cpu": cpu, "cuda": cuda });
        outln!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(0);
    }
    outln!(
        "host   {} · {} · {} cores",
        host["os"].as_str().unwrap_or(""),
        host["cpu"].as_str().unwrap_or(""),
        host["cores"]
    );
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
    outln!(
        "auto   would use {}",
        if cuda.usable { "cuda" } else { "cpu" }
    );
    Ok(0)
}
