//! Output paths checked before any work, so that a bad one costs no run.

use super::args::Common;
use foldprint::exit::Failure;
use foldprint::experiment::Experiment;
use std::path::PathBuf;
type Result<T, E = Failure> = std::result::Result<T, E>;

/// Check an output path before any work (exit 2 when it cannot be used).
pub(super) fn check_output(flag: &str, path: &std::path::Path) -> Result<()> {
    foldprint::check_writable(path).map_err(|e| {
        Failure::Refused(format!(
            "{flag} {}: cannot write there: {e}",
            path.display()
        ))
    })
}

/// Refuse an output that is one of the inputs, or another output.
pub(super) fn refuse_same(
    flag: &str,
    out: &std::path::Path,
    other: &str,
    path: &std::path::Path,
) -> Result<()> {
    if foldprint::same_file(out, path) {
        return Err(Failure::Refused(format!(
            "{flag} {} is {other} {}; refusing to overwrite it",
            out.display(),
            path.display()
        )));
    }
    Ok(())
}

/// Whether `path` lies inside directory `dir` (once both are resolved).
pub(super) fn inside(path: &std::path::Path, dir: &std::path::Path) -> bool {
    let (p, d) = (
        foldprint::atomic::resolved(path),
        foldprint::atomic::resolved(dir),
    );
    p != d && p.starts_with(&d)
}

/// Every output of a run, checked before the backend starts: writable,
/// not an input, not another output, not inside the dump directory.
pub(super) fn check_outputs(
    common: &Common,
    experiments: &[Experiment],
    dump: Option<&std::path::Path>,
    also_inputs: &[PathBuf],
) -> Result<()> {
    let outs: Vec<(&str, &PathBuf)> = [("--out", &common.out), ("--junit", &common.junit)]
        .into_iter()
        .filter_map(|(f, p)| p.as_ref().map(|p| (f, p)))
        .collect();
    for (flag, path) in &outs {
        check_output(flag, path)?;
        for e in experiments {
            refuse_same(flag, path, "the experiment", &e.path)?;
        }
        for i in also_inputs {
            refuse_same(flag, path, "the input", i)?;
        }
        if let Some(d) = dump {
            if inside(path, d) || foldprint::same_file(path, d) {
                return Err(Failure::Refused(format!(
                    "{flag} {} is inside the --dump directory {}, which a run replaces whole",
                    path.display(),
                    d.display()
                )));
            }
        }
    }
    if let (Some(o), Some(j)) = (&common.out, &common.junit) {
        refuse_same("--junit", j, "also the report (--out)", o)?;
    }
    if let Some(d) = dump {
        // Every case's dump file name must fit, before any case runs.
        let cases: Vec<(&str, &str, usize)> = experiments
            .iter()
            .flat_map(|e| &e.cases)
            .map(|c| (c.experiment(), c.id(), c.arenas().len()))
            .collect();
        let bad = |e: String| -> Failure {
            Failure::Refused(format!("--dump {}: cannot use it: {e}", d.display()))
        };
        let names = foldprint::dumpdir::dump_names(&cases).map_err(bad)?;
        foldprint::dumpdir::preflight(d, names.values().map(|n| n.as_str()))
            .map_err(|e| bad(e.to_string()))?;
        for e in experiments {
            if inside(&e.path, d) {
                return Err(Failure::Refused(format!(
                    "--dump {}: the experiment {} is inside it",
                    d.display(),
                    e.path.display()
                )));
            }
        }
    }
    Ok(())
}
