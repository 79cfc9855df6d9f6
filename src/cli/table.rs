//! Human-readable output: one line per case, then invariance groups, then a
//! one-line verdict. Everything here is also in the JSON report.

use foldprint::environment::BackendEnvironment;
use foldprint::report::{Comparison, Report, Source};
use foldprint::sensitivity::Verdict;
use std::path::{Path, PathBuf};

fn fmt_ms(ms: f64) -> String {
    if ms >= 1000.0 {
        format!("{:.2} s", ms / 1000.0)
    } else {
        format!("{ms:.1} ms")
    }
}

/// The report's own sentence when it is a CPU run under a package that pins
/// CUDA libraries (`environment.provenance.used == false`).
pub fn not_a_gpu_result(r: &Report) -> Option<String> {
    let p = r.environment.provenance.as_ref()?;
    (p.used == Some(false)).then(|| {
        p.note
            .clone()
            .unwrap_or_else(|| "CPU run under a CUDA combination".into())
    })
}

/// The first line of a run's output. `backend_env` says whether hosts
/// were emulated (several NCCL ranks on one GPU).
pub fn banner(version: &str, backend: &str, backend_env: &BackendEnvironment, nan_policy: &str) {
    let on = backend_env.on_what();
    let emulated = match backend_env.emulated_hosts() {
        Some(layout) => format!(" · emulated hosts: yes ({layout})"),
        None => String::new(),
    };
    outln!("foldprint {version} · backend {backend} ({on}) · NaN policy {nan_policy}{emulated}");
}

/// Most arena digests a row shows; a case of more shows the first
/// `DIGESTS_SHOWN - 1` and how many more there are (every one is in the
/// report, `--out` or `--json`).
const DIGESTS_SHOWN: usize = 8;

/// Width of the SHA-256 column for cases of up to `arenas` arenas: 16 hex
/// digits per arena shown, so TIME stays aligned however many there are.
pub fn digest_width(arenas: usize) -> usize {
    (17 * arenas.min(DIGESTS_SHOWN)).saturating_sub(1).max(35)
}

/// The ARENAS and SHA-256 cells of a row: every length and digest, or for
/// a case of more than [`DIGESTS_SHOWN`] arenas (an MoE model's gradients
/// in one file) their count and the first digests.
fn arena_cells(c: &foldprint::report::CaseReport) -> (String, String) {
    let n = c.arenas.len();
    if n <= DIGESTS_SHOWN {
        let lens: Vec<String> = c.params.arenas.iter().map(|n| n.to_string()).collect();
        let digests: Vec<String> = c.arenas.iter().map(|a| a.sha256.short(16)).collect();
        return (with_dtype(c, &lens.join("+")), digests.join(" "));
    }
    let mut digests: Vec<String> = c.arenas[..DIGESTS_SHOWN - 1]
        .iter()
        .map(|a| a.sha256.short(16))
        .collect();
    digests.push(format!("+{} more", n - (DIGESTS_SHOWN - 1)));
    (with_dtype(c, &format!("{n} arenas")), digests.join(" "))
}

/// The ARENAS cell: the lengths, then a 16-bit case's dtype (`1001+7
/// bf16`; lengths cut first, so the dtype always shows). An f32 case's
/// cell is its lengths alone, as before the dtypes.
fn with_dtype(c: &foldprint::report::CaseReport, lens: &str) -> String {
    match c.params.dtype.filter(|d| !d.is_f32()) {
        None => truncate(lens, 16),
        Some(d) => format!("{} {d}", truncate(lens, 16 - 1 - d.name().len())),
    }
}

/// The title and column header of one experiment's rows; `width` is its
/// SHA-256 column's ([`digest_width`]).
pub fn experiment_header(name: &str, path: &str, cases: usize, width: usize) {
    outln!();
    outln!("{name} — {path} ({cases} cases)");
    outln!(
        "  {:<4} {:<40} {:>4} {:<16} {:<13} {:<12} {:>6}  {:<width$} {:>9}",
        "",
        "CASE",
        "W",
        "ARENAS",
        "CONTRACT",
        "ORDER",
        "SENS",
        "SHA-256 (per arena, first 16 hex)",
        "TIME"
    );
}

/// One case's row (and its failure lines), under a header of `width`.
pub fn case_row(c: &foldprint::report::CaseReport, width: usize) {
    case_row_judged(c, width, &[])
}

/// [`case_row`] of a case that also contradicts what `problems` say (its
/// golden, under `verify`): its row is `FAIL`, with one line each.
pub fn case_row_judged(c: &foldprint::report::CaseReport, width: usize, problems: &[String]) {
    let ok = c.ranks_identical && c.rounds_identical && problems.is_empty();
    let differs = c.expect_outcomes().any(|e| !e.equal);
    let (lens, digests) = arena_cells(c);
    let sens = match c.sensitivity.verdict {
        Verdict::Blind => Verdict::Blind.name().to_string(),
        Verdict::Weak | Verdict::Sensitive => format!("{:.1}%", c.sensitivity.fraction * 100.0),
    };
    let best = c
        .timings
        .rounds
        .iter()
        .map(|t| t.total_ms)
        .fold(f64::INFINITY, f64::min);
    outln!(
        "  {:<4} {:<40} {:>4} {:<16} {:<13} {:<12} {:>6}  {:<width$} {:>9}",
        match (ok, differs) {
            (false, _) => "FAIL",
            (true, true) => "DIFF",
            (true, false) => "ok",
        },
        truncate(&c.id, 40),
        c.params.world,
        lens,
        c.params.contract.name(),
        truncate(&c.params.order, 12),
        sens,
        digests,
        if best.is_finite() {
            fmt_ms(best)
        } else {
            "-".into()
        }
    );
    if !c.ranks_identical {
        outln!("       ranks ended with different arenas");
    }
    if !c.rounds_identical {
        outln!("       rounds gave different digests");
    }
    for p in problems {
        outln!("       {p}");
    }
    for e in c.expect_outcomes().filter(|e| !e.equal) {
        let n: usize = e.arenas.iter().map(|a| a.differing).sum();
        let ulp = e.arenas.iter().filter_map(|a| a.max_ulp).max();
        let of = match c.params.dtype.filter(|d| !d.is_f32()) {
            Some(d) => format!(" of {d}"),
            None => String::new(),
        };
        outln!(
            "       differs from {}: {n} element(s){}",
            e.path,
            ulp.map_or(String::new(), |u| format!(", up to {u} ULP{of}"))
        );
    }
}

pub fn print_report(r: &Report, out: Option<&Path>, dump: Option<&Path>) {
    banner(
        &r.foldprint.version,
        &r.backend,
        &r.environment.backend,
        r.nan_policy.name(),
    );
    if let Some(n) = not_a_gpu_result(r) {
        outln!("NOT A GPU RESULT: {n}");
    }
    for e in &r.experiments {
        let cases = || r.cases.iter().filter(|c| c.experiment == e.name);
        let width = digest_width(cases().map(|c| c.arenas.len()).max().unwrap_or(0));
        experiment_header(&e.name, &e.path, e.cases, width);
        for c in cases() {
            case_row(c, width);
        }
    }
    print_tail(r, out, dump);
}

/// Everything after the case rows: groups, skipped cases, notes, verdict.
pub fn print_tail(r: &Report, out: Option<&Path>, dump: Option<&Path>) {
    print_tail_judged(r, out, dump, 0)
}

/// [`print_tail`] of a run with `against_golden` problems against its
/// goldens (`verify`): its verdict line never says every check passed.
pub fn print_tail_judged(
    r: &Report,
    out: Option<&Path>,
    dump: Option<&Path>,
    against_golden: usize,
) {
    if !r.groups.is_empty() {
        outln!();
        outln!("invariance groups (cases differing only in delivery order)");
        for g in &r.groups {
            outln!(
                "  {:<4} {:<13} expect {:<8} got {:<12} {}",
                if g.ok { "PASS" } else { "FAIL" },
                g.contract.name(),
                g.expect.name(),
                g.verdict.name(),
                g.key
            );
            outln!("       {}", g.note);
        }
    }
    if !r.skipped.is_empty() {
        let mut reasons: Vec<&str> = r.skipped.iter().map(|s| s.reason.as_str()).collect();
        reasons.sort_unstable();
        reasons.dedup();
        outln!();
        outln!(
            "skipped {} case(s) this backend cannot run: {}",
            r.skipped.len(),
            truncate(&reasons.join("; "), 300)
        );
    }
    let blind: Vec<&str> = r
        .cases
        .iter()
        .filter(|c| match c.sensitivity.verdict {
            Verdict::Sensitive => false,
            Verdict::Weak | Verdict::Blind => true,
        })
        .map(|c| c.id.as_str())
        .collect();
    if !blind.is_empty() {
        outln!();
        outln!(
            "note: {} case(s) have data that barely or never sees fold order (SENS < 1% or blind): {}",
            blind.len(),
            truncate(&blind.join(", "), 200)
        );
    }
    outln!();
    if let Some(n) = not_a_gpu_result(r) {
        outln!("NOT A GPU RESULT: {n}");
    }
    for c in &r.cases {
        for e in c.expect_outcomes().filter(|e| e.equal) {
            outln!(
                "expect: case `{}` equals {} bit for bit ({} arenas)",
                c.id,
                e.path,
                e.arenas.len()
            );
        }
    }
    if !r.summary.differs_from_expect.is_empty() {
        outln!(
            "DIFFERS FROM EXPECT: {} case(s)",
            r.summary.differs_from_expect.len()
        );
        for f in &r.summary.differs_from_expect {
            outln!("  - {f}");
        }
    }
    if r.summary.ok && against_golden > 0 {
        out!(
            "FAILED against the goldens: {against_golden} problem(s), listed below; the run's own checks held ({} cases, {} groups){}",
            r.summary.cases,
            r.summary.groups,
            match r.summary.differs_from_expect.len() {
                0 => String::new(),
                n => format!("; {n} case(s) differ from their expect"),
            }
        );
    } else if r.summary.ok && !r.summary.differs_from_expect.is_empty() {
        out!(
            "checks ok: {} cases, {} groups, every check of the run passed; {} case(s) differ from their expect",
            r.summary.cases,
            r.summary.groups,
            r.summary.differs_from_expect.len()
        );
    } else if r.summary.ok {
        out!(
            "ok: {} cases, {} groups, every check passed",
            r.summary.cases,
            r.summary.groups
        );
    } else {
        outln!("FAILED: {} problem(s)", r.summary.failures.len());
        for f in &r.summary.failures {
            outln!("  - {f}");
        }
    }
    if r.summary.ok {
        outln!();
    }
    if let Some(o) = out {
        outln!("report: {}", o.display());
    }
    if let Some(d) = dump {
        outln!(
            "dumps: {} (check with `cd {} && sha256sum -c SHA256SUMS`)",
            d.display(),
            d.display()
        );
    }
}

fn truncate(s: &str, n: usize) -> String {
    if s.chars().count() <= n {
        s.to_string()
    } else {
        let mut t: String = s.chars().take(n - 1).collect();
        t.push('…');
        t
    }
}

pub fn print_comparison(reports: &[(String, Source)], cmp: &Comparison) {
    for (name, r) in reports {
        match r {
            Source::Report(r) => outln!(
                "  {name}: {} cases, backend {}, foldprint {}",
                r.cases.len(),
                r.backend,
                r.foldprint.version
            ),
            Source::Golden(g) => outln!(
                "  {name}: golden of `{}`, {} cases, {}",
                g.experiment,
                g.cases.len(),
                g.produced_by
            ),
        }
    }
    if cmp.ok() {
        outln!(
            "ok: {} cases agree across {} reports",
            cmp.compared,
            reports.len()
        );
    } else {
        outln!(
            "MISMATCH: {} difference(s); first: {}",
            cmp.mismatches.len(),
            cmp.mismatches[0]
        );
        for m in cmp.mismatches.iter().take(20) {
            outln!("  - {m}");
        }
        if cmp.mismatches.len() > 20 {
            outln!("  … and {} more", cmp.mismatches.len() - 20);
        }
    }
}

pub fn print_verify(goldens: &[PathBuf], r: &Report, problems: &[String]) {
    outln!();
    if problems.is_empty() {
        outln!(
            "verify ok: {} cases match {} golden file(s){}",
            r.cases.len(),
            goldens.len(),
            if r.skipped.is_empty() {
                String::new()
            } else {
                format!(
                    " ({} skipped by this backend, not verified)",
                    r.skipped.len()
                )
            }
        );
    } else {
        outln!("verify FAILED: {} problem(s)", problems.len());
        for p in problems {
            outln!("  - {p}");
        }
    }
}

pub fn print_dump_comparison(
    a: &Path,
    b: &Path,
    cmp: &foldprint::report::localize::DumpComparison,
) {
    outln!(
        "{} vs {}: {} identical file(s)",
        a.display(),
        b.display(),
        cmp.identical
    );
    for u in &cmp.unmatched {
        outln!("  only one side: {u}");
    }
    use foldprint::report::localize::hex_bits;
    for d in &cmp.differing {
        if let Some((l, r)) = d.dtypes {
            outln!(
                "  DIFFER {}: {l} on the left, {r} on the right ({} / {} elements): not compared element by element",
                d.name,
                d.lens.0,
                d.lens.1
            );
            continue;
        }
        let ulp = d
            .max_ulp
            .map_or("NaN involved".to_string(), |u| u.to_string());
        // A 16-bit dtype says so; its ULPs are its own steps.
        let of = if d.dtype.is_f32() {
            String::new()
        } else {
            format!(" ({})", d.dtype)
        };
        outln!(
            "  DIFFER {}{of}: {} of {} elements differ (lengths {} / {}), max ULP distance {ulp}",
            d.name,
            d.differing,
            d.lens.0.max(d.lens.1),
            d.lens.0,
            d.lens.1
        );
        outln!(
            "    {:>12}  {:>10} {:>16}  {:>10} {:>16}  {:>8}",
            "INDEX",
            "LEFT",
            "",
            "RIGHT",
            "",
            "ULP"
        );
        for e in &d.first {
            outln!(
                "    {:>12}  {:>10} {:>16e}  {:>10} {:>16e}  {:>8}",
                e.index,
                hex_bits(d.dtype, e.left),
                d.dtype.widen(e.left),
                hex_bits(d.dtype, e.right),
                d.dtype.widen(e.right),
                e.ulp.map_or("-".into(), |u| u.to_string())
            );
        }
    }
    if cmp.identical == 0 && cmp.differing.is_empty() {
        outln!(
            "{}: neither SHA256SUMS lists a file both sides hold",
            foldprint::report::NOTHING_CHECKED
        );
    } else if cmp.differing.is_empty() && cmp.unmatched.is_empty() {
        outln!("ok: dumps are identical");
    }
}
