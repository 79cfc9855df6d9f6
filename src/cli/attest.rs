//! `foldprint attest`: an in-toto statement about a report and its dumps.

use super::args::AttestArgs;
use super::checks::{check_output, inside, refuse_same};
use foldprint::exit::{Context, ExitCode, Failure};
use foldprint::report::Report;
type Result<T, E = Failure> = std::result::Result<T, E>;

pub(super) fn run(a: AttestArgs) -> Result<i32> {
    use foldprint::report::attest;
    check_output("--out", &a.out)?;
    refuse_same("--out", &a.out, "the report", &a.report)?;
    if let Some(d) = &a.dump {
        if inside(&a.out, d) {
            return Err(Failure::Refused(format!(
                "--out {} is inside the dump directory {}; refusing to write there",
                a.out.display(),
                d.display()
            )));
        }
    }
    let report = Report::read(&a.report)?;
    // The statement records the verdict; a failed run is said loudly and
    // exits 1 so that no pipeline publishes it as a pass.
    let failed = (!report.summary.ok).then(|| {
        format!(
            "{}: its own run FAILED its checks (summary.ok = false: {}); the statement records verdict ok = false",
            a.report.display(),
            report.summary.failures.join("; ")
        )
    });
    let bytes = foldprint::input::read_capped(&a.report, foldprint::input::MAX_REPORT_BYTES)
        .with_context(|| format!("{}: cannot read", a.report.display()))?;
    let name = a
        .report
        .file_name()
        .map_or("report.json".into(), |n| n.to_string_lossy().into_owned());
    let mut subjects = vec![attest::Subject {
        name,
        sha256: foldprint::digest::Sha256::of(&bytes),
    }];
    if let Some(dir) = &a.dump {
        subjects.extend(attest::dump_subjects(&report, dir)?);
    }
    let text = attest::canonical(&attest::statement(&report, &subjects));
    foldprint::atomic_write(&a.out, text.as_bytes())
        .with_context(|| format!("{}: cannot write", a.out.display()))?;
    outln!(
        "wrote {} ({} subjects, predicate {})",
        a.out.display(),
        subjects.len(),
        attest::PREDICATE_TYPE
    );
    let differs = report.summary.differs_from_expect.len();
    if differs > 0 {
        outln!(
            "note: {differs} case(s) differ from their expect file; the statement records it (verdict.differs_from_expect)"
        );
    }
    if let Some(f) = failed {
        eprintln!("FAILED RUN: {f}");
        return Ok(ExitCode::CheckFailed.code());
    }
    Ok(0)
}
