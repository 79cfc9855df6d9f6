//! `doctor`: which backends can run here, and what is missing.

use anyhow::Result;

pub fn run(json: bool) -> Result<i32> {
    let host = foldprint::env::host();
    let cpu = serde_json::json!({
        "usable": true,
        "threads": rayon::current_num_threads(),
        "available_memory": foldprint::backend::cpu::available_memory(),
    });
    let v = serde_json::json!({ "host": host, "cpu": cpu });
    if json {
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(0);
    }
    println!(
        "host  {} · {} · {} cores",
        host["os"].as_str().unwrap_or(""),
        host["cpu"].as_str().unwrap_or(""),
        host["cores"]
    );
    println!(
        "cpu   usable · {} threads · {} MiB available",
        cpu["threads"],
        cpu["available_memory"]
            .as_u64()
            .map_or("?".into(), |b| (b >> 20).to_string())
    );
    Ok(0)
}
