//! The progress of a run on stderr, and its table rows as cases finish.

use super::table;
use foldprint::{experiment, run, runner};
use std::io::IsTerminal;

/// What a run shows as it goes: its notes and warnings on stderr, the
/// banner, the progress bar and, when streaming, each case's row as soon
/// as the case finishes (only the process that reports prints the table).
pub(super) struct Live<'a> {
    stream: bool,
    nan_policy: &'static str,
    /// What a finished case contradicts beyond its own checks (`verify`:
    /// its golden), said on its row.
    judge: &'a dyn Fn(&foldprint::report::CaseReport) -> Vec<String>,
    bar: Option<Bar<'a>>,
}

impl<'a> Live<'a> {
    pub(super) fn new(
        stream: bool,
        nan_policy: foldprint::digest::NanPolicy,
        judge: &'a dyn Fn(&foldprint::report::CaseReport) -> Vec<String>,
    ) -> Live<'a> {
        Live {
            stream,
            nan_policy: nan_policy.name(),
            judge,
            bar: None,
        }
    }
}

impl run::Observer for Live<'_> {
    fn started(&mut self, run: &run::Started<'_>) {
        if let Some(n) = run.note {
            eprintln!("note: {n}");
        }
        if let Some(w) = run.not_gpu {
            eprintln!("warning: {w}");
        }
        let stream = self.stream && run.reporting;
        if stream {
            table::banner(
                env!("CARGO_PKG_VERSION"),
                run.backend(),
                &run.environment(),
                self.nan_policy,
            );
            if let Some(w) = run.not_gpu {
                outln!("NOT A GPU RESULT: {w}");
            }
        }
        let rows = stream.then(|| {
            run.experiments
                .iter()
                .map(|e| {
                    let info = foldprint::report::ExperimentInfo::from(e);
                    let arenas = e.cases.iter().map(|c| c.arenas().len()).max().unwrap_or(0);
                    (
                        info.name,
                        info.path,
                        info.cases,
                        table::digest_width(arenas),
                    )
                })
                .collect()
        });
        let total = run.experiments.iter().map(|e| e.cases.len()).sum();
        self.bar = Some(Bar::new(total, rows, self.judge));
    }

    fn waiting(&mut self, output: &std::path::Path) {
        eprintln!(
            "note: waiting for another foldprint run writing {}",
            output.display()
        );
    }

    fn finished(&mut self) {
        self.bar = None;
    }
}

impl runner::Progress for Live<'_> {
    fn start(&mut self, case: &experiment::Case, i: usize, n: usize) {
        if let Some(bar) = &mut self.bar {
            bar.start(case, i, n);
        }
    }
    fn done(&mut self, case: &experiment::Case, result: Option<&foldprint::report::CaseReport>) {
        if let Some(bar) = &mut self.bar {
            bar.done(case, result);
        }
    }
}

/// Progress of a run: a bar on a terminal (stderr), ticking even while one
/// long case runs, and, when asked, each case's table row printed as soon
/// as the case finishes (so a piped run streams its rows).
struct Bar<'a> {
    pb: Option<indicatif::ProgressBar>,
    /// (name, path, cases, SHA-256 column width) of each experiment, when
    /// rows are streamed.
    rows: Option<Vec<(String, String, usize, usize)>>,
    current: Option<String>,
    /// What a finished case contradicts beyond its own checks (`verify`:
    /// its golden), said on its row.
    judge: &'a dyn Fn(&foldprint::report::CaseReport) -> Vec<String>,
}

impl<'a> Bar<'a> {
    fn new(
        total: usize,
        rows: Option<Vec<(String, String, usize, usize)>>,
        judge: &'a dyn Fn(&foldprint::report::CaseReport) -> Vec<String>,
    ) -> Bar<'a> {
        let pb = (std::io::stderr().is_terminal() && total >= 1).then(|| {
            let pb = indicatif::ProgressBar::new(total as u64);
            pb.set_style(
                indicatif::ProgressStyle::with_template(
                    "{spinner} [{pos}/{len}] {wide_msg} {elapsed}",
                )
                .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
            );
            pb.enable_steady_tick(std::time::Duration::from_millis(200));
            pb
        });
        Bar {
            pb,
            rows,
            current: None,
            judge,
        }
    }

    /// Print without tearing the bar.
    fn print(&self, f: impl FnOnce()) {
        match &self.pb {
            Some(pb) => pb.suspend(f),
            None => f(),
        }
    }
}

impl runner::Progress for Bar<'_> {
    fn start(&mut self, case: &experiment::Case, _i: usize, _n: usize) {
        if let Some(pb) = &self.pb {
            pb.set_message(format!(
                "{}/{}",
                case.experiment(),
                foldprint::report::printable(case.id())
            ));
        }
        if let Some(rows) = &self.rows {
            if self.current.as_deref() != Some(case.experiment()) {
                if let Some((name, path, n, w)) = rows.iter().find(|r| r.0 == case.experiment()) {
                    self.print(|| table::experiment_header(name, path, *n, *w));
                }
                self.current = Some(case.experiment().to_string());
            }
        }
    }
    fn done(&mut self, _case: &experiment::Case, result: Option<&foldprint::report::CaseReport>) {
        if let (Some(rows), Some(c)) = (&self.rows, result) {
            let w = rows.iter().find(|r| r.0 == c.experiment).map_or(0, |r| r.3);
            let problems = (self.judge)(c);
            self.print(|| table::case_row_judged(c, w, &problems));
        }
        if let Some(pb) = &self.pb {
            pb.inc(1);
        }
    }
}

impl Drop for Bar<'_> {
    fn drop(&mut self) {
        if let Some(pb) = &self.pb {
            pb.finish_and_clear();
        }
    }
}
