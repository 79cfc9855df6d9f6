//! `foldprint audit MATRIX.toml`: run a matrix of configurations, print the
//! configurations, the digest matrix against the baseline and the negative
//! controls, and exit 0 / 1 / 2 / 3 (docs/AUDIT.md).

use super::output::print_grid;
use foldprint::exit::{Context, Failure};
type Result<T, E = Failure> = std::result::Result<T, E>;
use clap::Args;
use foldprint::audit::{
    self, AuditResult, CaseRow, Cell, Config, ConfigOutcome, ControlCell, Status,
};
use std::path::PathBuf;

#[derive(Args)]
pub struct AuditArgs {
    /// The audit matrix (TOML): experiments, [defaults] and [[config]] entries.
    matrix: PathBuf,
    /// Write the whole result as JSON here (atomically).
    #[arg(long)]
    out: Option<PathBuf>,
    /// Print the result as JSON on stdout instead of the tables.
    #[arg(long)]
    json: bool,
    /// Keep each configuration's library links, report, stderr and command
    /// line under DIR/<name>/ (DIR must be new or empty).
    #[arg(long, value_name = "DIR")]
    keep: Option<PathBuf>,
}

struct StderrProgress;

impl audit::Progress for StderrProgress {
    fn oracle_start(&mut self, cases: usize) {
        eprintln!("audit: CPU oracle and contract controls over {cases} case(s)");
    }
    fn oracle_done(&mut self, seconds: f64) {
        eprintln!("audit: CPU oracle done in {}", fmt_s(seconds));
    }
    fn config_start(&mut self, index: usize, total: usize, c: &Config) {
        eprintln!(
            "audit: [{}/{total}] {}{}: running (backend {}, {})",
            index + 1,
            c.name,
            if c.control { " (control)" } else { "" },
            c.backend,
            c.describe()
        );
    }
    fn config_done(&mut self, o: &ConfigOutcome) {
        match &o.error {
            None => eprintln!(
                "audit:   {}: {}, {} case(s), {}",
                o.name,
                status_text(o.status),
                o.cases,
                fmt_s(o.duration_s)
            ),
            Some(e) => eprintln!("audit:   {}: {e}", o.name),
        }
    }
}

pub fn run(a: AuditArgs) -> Result<i32> {
    if let Some(out) = &a.out {
        super::check_output("--out", out)?;
    }
    let matrix = audit::load(&a.matrix)?;
    if let Some(out) = &a.out {
        super::checks::refuse_inputs("--out", out, &super::checks::audit_inputs(&matrix))?;
    }
    let exe = std::env::current_exe().context("locating the foldprint binary")?;
    let opts = audit::Options { exe, keep: a.keep };
    // A signal is recorded, passed on to the running child, and ends the
    // audit (128 + N) once the child is reaped and the work area removed.
    foldprint::interrupt::install();
    let result = audit::run(&matrix, &opts, &mut StderrProgress)?;
    if let Some(out) = &a.out {
        result.write(out)?;
    }
    if a.json {
        out!("{}", result.to_json());
        for f in &result.failures {
            eprintln!("audit: {f}");
        }
    } else {
        print_result(&result, &matrix);
        if let Some(out) = &a.out {
            outln!("wrote {}", out.display());
        }
    }
    if result.exit_code >= 2 {
        for o in result
            .configurations
            .iter()
            .filter(|o| matches!(o.status, Status::Rejected | Status::CouldNotRun))
        {
            eprintln!(
                "error: configuration `{}` did not give a report: {}",
                o.name,
                o.error.as_deref().unwrap_or("no reason recorded")
            );
            for line in o.stderr_tail.lines() {
                eprintln!("  | {line}");
            }
        }
    }
    Ok(result.exit_code)
}

fn fmt_s(s: f64) -> String {
    if s >= 1.0 {
        format!("{s:.1} s")
    } else {
        format!("{:.0} ms", s * 1000.0)
    }
}

fn status_text(s: Status) -> &'static str {
    match s {
        Status::Ok => "ok",
        Status::ChecksFailed => "checks failed",
        Status::Rejected => "rejected",
        Status::CouldNotRun => "could not run",
        Status::NotRun => "not run",
    }
}

fn short16(d: &str) -> &str {
    &d[..d.len().min(16)]
}

/// Column labels: 1, 2 ... for configurations, c1, c2 ... for controls.
fn labels(r: &AuditResult) -> Vec<String> {
    let (mut n, mut c) = (0, 0);
    r.configurations
        .iter()
        .map(|o| {
            if o.control {
                c += 1;
                format!("c{c}")
            } else {
                n += 1;
                n.to_string()
            }
        })
        .collect()
}

fn cell_text(cell: &Cell) -> String {
    let marked = |prefix: &str, digests: &[foldprint::digest::Sha256], arena: usize| {
        let d = digests.get(arena).map_or("none".into(), |d| d.short(8));
        if arena == 0 {
            format!("{prefix}{d}")
        } else {
            format!("{prefix}a{arena}:{d}")
        }
    };
    match cell {
        Cell::Baseline { digests } => digests.first().map_or("(no arena)".into(), |d| d.short(8)),
        Cell::Equal => "=".into(),
        Cell::Differs { digests, arena } => marked("!", digests, *arena),
        Cell::Unchanged => "UNCHANGED".into(),
        Cell::Changed { .. } => "changed".into(),
        Cell::Uncompared { digests } => marked("?", digests, 0),
        Cell::Skipped { .. } => "skip".into(),
        Cell::Missing => "MISSING".into(),
        Cell::NotRun => "-".into(),
    }
}

fn control_text(c: &ControlCell) -> &'static str {
    match c {
        ControlCell::Changed { .. } => "changed",
        ControlCell::Unchanged => "UNCHANGED",
        ControlCell::NotApplicable { .. } => "n/a",
    }
}

fn sens_text(row: &CaseRow) -> String {
    match &row.sensitivity {
        None => "?".into(),
        Some(s) if s.verdict == "blind" => "blind".into(),
        Some(s) => format!("{:.1}%", s.fraction * 100.0),
    }
}

/// Text of `key` in an environment object, if it is a string.
fn text_of<'a>(obj: &'a serde_json::Map<String, serde_json::Value>, key: &str) -> Option<&'a str> {
    obj.get(key).and_then(serde_json::Value::as_str)
}

fn print_result(r: &AuditResult, m: &audit::Matrix) {
    let labels = labels(r);
    let controls = r.configurations.iter().filter(|o| o.control).count();
    outln!(
        "foldprint audit · {} ({}) · {} configuration(s), {} control(s) · {} case(s) · baseline `{}`",
        r.matrix.path,
        r.matrix.name,
        r.configurations.len() - controls,
        controls,
        r.cases.len(),
        r.baseline
    );
    if !r.matrix.description.is_empty() {
        outln!("{}", r.matrix.description);
    }

    outln!();
    outln!("configurations");
    let mut rows = Vec::new();
    for (o, label) in r.configurations.iter().zip(&labels) {
        let cfg = m.configs.iter().find(|c| c.name == o.name);
        rows.push(vec![
            label.clone(),
            o.name.clone(),
            o.backend
                .clone()
                .or_else(|| cfg.map(|c| c.backend.clone()))
                .unwrap_or_default(),
            status_text(o.status).to_string(),
            o.ending.clone(),
            fmt_s(o.duration_s),
            cfg.map(Config::describe).unwrap_or_default(),
        ]);
    }
    let headers: Vec<String> = [
        "#", "NAME", "BACKEND", "STATUS", "ENDING", "TIME", "SETTINGS",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    print_grid("  ", &headers, &rows, 8);
    for (o, label) in r.configurations.iter().zip(&labels) {
        let mut lines = Vec::new();
        for check in &o.requested {
            let version = match check.family {
                audit::Family::Nvrtc => o.versions.nvrtc.as_deref(),
                audit::Family::Nccl => o.versions.nccl.as_deref(),
            };
            let verdict = if check.ok { "as requested" } else { "MISMATCH" };
            lines.push(format!(
                "{} {}  loaded {}  sha256 {}  {verdict}",
                check.family.name(),
                version.unwrap_or("?"),
                if check.loaded.is_empty() {
                    "nothing".to_string()
                } else {
                    check.loaded.join(", ")
                },
                check.sha256.map_or("-".into(), |d| d.short(16)),
            ));
            if let Some(msg) = &check.message {
                lines.push(format!("  {msg}"));
            }
        }
        for lib in &o.libraries {
            let family = lib.family.as_str();
            if !matches!(family, "nvrtc" | "nccl")
                || o.requested.iter().any(|c| c.family.name() == family)
            {
                continue;
            }
            let version = if family == "nvrtc" {
                o.versions.nvrtc.as_deref()
            } else {
                o.versions.nccl.as_deref()
            };
            lines.push(format!(
                "{family} {}  loaded {}  sha256 {}  (not pinned by the matrix)",
                version.unwrap_or("?"),
                lib.path,
                lib.sha256.map_or("-".into(), |d| d.short(16))
            ));
        }
        // Device facts sit at the top (CUDA loopback) or per device (NCCL).
        let fact = |key: &str| o.environment.as_ref().and_then(|e| e.fact(key));
        if let Some(gpu) = fact("gpu") {
            lines.push(format!(
                "device {} (cc {}), driver {}",
                text_of(gpu, "name").unwrap_or("?"),
                text_of(gpu, "compute_capability").unwrap_or("?"),
                fact("driver")
                    .and_then(|d| text_of(d, "cuda_driver_api"))
                    .unwrap_or("?")
            ));
        }
        if let Some(f) = fact("fold_program") {
            lines.push(format!(
                "fold program {} (NVRTC {})  sha256 {}{}",
                text_of(f, "target").unwrap_or("?"),
                text_of(f, "nvrtc_version").unwrap_or("?"),
                text_of(f, "sha256").map_or("-", short16),
                text_of(f, "note")
                    .filter(|n| !n.is_empty())
                    .map_or(String::new(), |n| format!("  note: {n}"))
            ));
        }
        if let Some(k) = &o.kept {
            lines.push(format!("kept in {k}"));
        }
        for l in lines {
            outln!(
                "  {:<3} {l}",
                if l.starts_with("  ") {
                    ""
                } else {
                    label.as_str()
                }
            );
        }
    }

    let baseline_ran = r
        .configurations
        .iter()
        .any(|o| o.baseline && matches!(o.status, Status::Ok | Status::ChecksFailed));
    if r.cases.is_empty() || !baseline_ran {
        outln!();
        outln!(
            "no digest matrix: the baseline `{}` gave no report",
            r.baseline
        );
        print_problems(r);
        print_verdict(r);
        return;
    }
    let label_width = 60;
    let case_label = |row: &CaseRow| format!("{}/{}", row.experiment, row.id);

    outln!();
    outln!(
        "digests against the baseline (column {}: first 8 hex of arena 0; = same digests; !hex the first differing arena; skip / MISSING / - not run{})",
        labels
            .iter()
            .zip(&r.configurations)
            .find(|(_, o)| o.baseline)
            .map_or("1", |(l, _)| l.as_str()),
        if r.oracle { "; cpu: the CPU oracle" } else { "" }
    );
    let plain: Vec<usize> = (0..r.configurations.len())
        .filter(|&i| !r.configurations[i].control)
        .collect();
    let mut headers = vec!["CASE".to_string(), "SENS".to_string()];
    headers.extend(plain.iter().map(|&i| labels[i].clone()));
    if r.oracle {
        headers.push("cpu".into());
    }
    let rows: Vec<Vec<String>> = r
        .cases
        .iter()
        .map(|row| {
            let mut cells = vec![case_label(row), sens_text(row)];
            cells.extend(plain.iter().map(|&i| cell_text(&row.cells[i].cell)));
            if let Some(o) = &row.oracle {
                cells.push(cell_text(&o.vs_baseline));
            }
            cells
        })
        .collect();
    print_grid("  ", &headers, &rows, label_width);

    let control_idx: Vec<usize> = (0..r.configurations.len())
        .filter(|&i| r.configurations[i].control)
        .collect();
    if r.oracle || !control_idx.is_empty() {
        outln!();
        outln!(
            "negative controls (changed: the digests differ, as a control's must; UNCHANGED: they do not; SENS says whether the data can show a reordering)"
        );
        let mut headers = vec!["CASE".to_string(), "SENS".to_string()];
        if r.oracle {
            headers.push("ARRIVAL-REVERSED".into());
            headers.push("PAIRWISE-TREE".into());
        }
        headers.extend(
            control_idx
                .iter()
                .map(|&i| format!("{} {}", labels[i], r.configurations[i].name)),
        );
        let rows: Vec<Vec<String>> = r
            .cases
            .iter()
            .map(|row| {
                let mut cells = vec![case_label(row), sens_text(row)];
                if let Some(o) = &row.oracle {
                    cells.push(control_text(&o.arrival_reversed).into());
                    cells.push(control_text(&o.pairwise_tree).into());
                }
                cells.extend(control_idx.iter().map(|&i| cell_text(&row.cells[i].cell)));
                cells
            })
            .collect();
        print_grid("  ", &headers, &rows, label_width);
        if r.oracle {
            outln!("  (contract controls run on the CPU oracle and compare with the case's own CPU digests; n/a: W <= 2 for a reversed order, W <= 3 or the case itself for the tree)");
        }
    }

    print_problems(r);
    print_verdict(r);
}

fn print_verdict(r: &AuditResult) {
    let plain_count = r.configurations.iter().filter(|o| !o.control).count();
    match r.exit_code {
        0 => outln!(
            "audit PASSED: {} configuration(s) gave the baseline `{}`'s digests on all {} case(s){}{}",
            plain_count,
            r.baseline,
            r.cases.len(),
            if r.configurations.iter().any(|o| !o.requested.is_empty()) {
                "; every requested library was the one loaded"
            } else {
                ""
            },
            if r.oracle { "; the CPU oracle agrees" } else { "" }
        ),
        code => outln!(
            "audit FAILED (exit {code}): {} problem(s), listed above",
            r.failures.len()
        ),
    }
}

/// Warnings and failures, each under its heading.
fn print_problems(r: &AuditResult) {
    if !r.warnings.is_empty() {
        outln!();
        outln!("warnings");
        for w in &r.warnings {
            outln!("  - {w}");
        }
    }
    if !r.failures.is_empty() {
        outln!();
        outln!("failures");
        for f in &r.failures {
            outln!("  - {f}");
        }
    }
    outln!();
}
