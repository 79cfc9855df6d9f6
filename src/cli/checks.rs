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

/// An output path as inputs are compared with it: the file it names now
/// (device and inode, so a symlink, a hard link or `./x` is seen through)
/// and where it would be written when it does not exist yet.
struct Target {
    id: Option<(u64, u64)>,
    resolved: PathBuf,
}

impl Target {
    fn of(path: &std::path::Path) -> Target {
        use std::os::unix::fs::MetadataExt;
        Target {
            id: std::fs::metadata(path).ok().map(|m| (m.dev(), m.ino())),
            resolved: foldprint::atomic::resolved(path),
        }
    }
    /// Whether writing the target would replace `input`.
    fn is(&self, input: &std::path::Path) -> bool {
        use std::os::unix::fs::MetadataExt;
        match (self.id, std::fs::metadata(input)) {
            (Some(id), Ok(m)) => id == (m.dev(), m.ino()),
            _ => self.resolved == foldprint::atomic::resolved(input),
        }
    }
}

/// Refuse an output that is one of `inputs` (what each is, and its path).
pub(super) fn refuse_inputs(
    flag: &str,
    out: &std::path::Path,
    inputs: &[(String, PathBuf)],
) -> Result<()> {
    let target = Target::of(out);
    match inputs.iter().find(|(_, p)| target.is(p)) {
        Some((what, p)) => Err(Failure::Refused(format!(
            "{flag} {} is {what} {}; refusing to overwrite it: an input is never an output",
            out.display(),
            p.display()
        ))),
        None => Ok(()),
    }
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
/// not an input (an experiment, a rank or expect file, or one of
/// `also_inputs`, such as the goldens), not another output, and no input
/// inside the dump directory.
pub(super) fn check_outputs(
    common: &Common,
    experiments: &[Experiment],
    dump: Option<&std::path::Path>,
    also_inputs: &[(String, PathBuf)],
) -> Result<()> {
    let mut inputs = foldprint::experiment::input_files(experiments);
    inputs.extend(also_inputs.iter().cloned());
    let outs: Vec<(&str, &PathBuf)> = [("--out", &common.out), ("--junit", &common.junit)]
        .into_iter()
        .filter_map(|(f, p)| p.as_ref().map(|p| (f, p)))
        .collect();
    for (flag, path) in &outs {
        refuse_inputs(flag, path, &inputs)?;
        check_output(flag, path)?;
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
        // No input inside the directory the run replaces whole.
        let dir = foldprint::atomic::resolved(d);
        for (what, p) in &inputs {
            let p = foldprint::atomic::resolved(p);
            if p.starts_with(&dir) {
                return Err(Failure::Refused(format!(
                    "--dump {}: {what} {} is inside it, and a run replaces the directory whole",
                    d.display(),
                    p.display()
                )));
            }
        }
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
    }
    Ok(())
}

/// What an audit reads: the matrix, and the experiments it names with their
/// rank and expect files (those of an experiment that does not load are left
/// to the child that runs it to refuse; its own file is still listed).
pub(super) fn audit_inputs(matrix: &foldprint::audit::Matrix) -> Vec<(String, PathBuf)> {
    let mut inputs = vec![("the audit matrix".to_string(), matrix.path.clone())];
    let scope = foldprint::addends::Scope::AllRanks;
    match foldprint::experiment::load_all_in(&matrix.experiments, scope) {
        Ok(exps) => inputs.extend(foldprint::experiment::input_files(&exps)),
        Err(_) => {
            for p in &matrix.experiments {
                let tomls = std::fs::read_dir(p).into_iter().flatten().flatten();
                inputs.extend(
                    tomls
                        .map(|e| e.path())
                        .filter(|f| f.extension().is_some_and(|x| x == "toml"))
                        .chain(std::iter::once(p.clone()))
                        .map(|f| ("the experiment".to_string(), f)),
                );
            }
        }
    }
    inputs
}
