//! The progress of a run on stderr, and its table rows as cases finish.

use super::table;
use foldprint::{experiment, runner};
use std::io::IsTerminal;

/// Progress of a run: a bar on a terminal (stderr), ticking even while one
/// long case runs, and, when asked, each case's table row printed as soon
/// as the case finishes (so a piped run streams its rows).
pub(super) struct Bar<'a> {
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
    pub(super) fn new(
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
