//! Standard output that never panics: a closed pipe (`| head -1`) silences
//! the rest, any other write error is reported when the command ends.

/// `println!` for stdout that never panics: a closed pipe (`| head -1`)
/// silences the rest of the output, any other write error (a full disk)
/// is reported once the command ends (see [`finish_stdout`]).
macro_rules! outln {
    () => { $crate::cli::output::stdout_write(format_args!("\n")) };
    ($($arg:tt)*) => { $crate::cli::output::stdout_write(format_args!("{}\n", format_args!($($arg)*))) };
}

/// `print!` counterpart of [`outln!`].
macro_rules! out {
    ($($arg:tt)*) => { $crate::cli::output::stdout_write(format_args!($($arg)*)) };
}

/// What went wrong writing stdout, if anything (a closed pipe is not an error).
static STDOUT_STATE: std::sync::Mutex<(bool, Option<std::io::Error>)> =
    std::sync::Mutex::new((false, None));

pub(crate) fn stdout_write(args: std::fmt::Arguments<'_>) {
    use std::io::Write;
    let mut state = STDOUT_STATE.lock().unwrap_or_else(|p| p.into_inner());
    if state.0 || state.1.is_some() {
        return;
    }
    let text = args.to_string();
    let text = foldprint::report::printable(&text);
    if let Err(e) = std::io::stdout().lock().write_all(text.as_bytes()) {
        if e.kind() == std::io::ErrorKind::BrokenPipe {
            state.0 = true;
        } else {
            state.1 = Some(e);
        }
    }
}

/// Flush stdout; a write error turns a success into an error exit.
pub(super) fn finish_stdout(code: i32) -> i32 {
    use std::io::Write;
    let mut state = STDOUT_STATE.lock().unwrap_or_else(|p| p.into_inner());
    if !state.0 && state.1.is_none() {
        if let Err(e) = std::io::stdout().lock().flush() {
            if e.kind() != std::io::ErrorKind::BrokenPipe {
                state.1 = Some(e);
            }
        }
    }
    match state.1.take() {
        Some(e) => {
            eprintln!("error: cannot write to standard output: {e}");
            if code == 0 {
                foldprint::exit::io_exit_code(&e).code()
            } else {
                code
            }
        }
        None => code,
    }
}

/// Print rows of cells under headers, each column as wide as its widest
/// entry (the first at most `first_width`, cut with `~`), every line
/// after `indent`.
pub(super) fn print_grid(
    indent: &str,
    headers: &[String],
    rows: &[Vec<String>],
    first_width: usize,
) {
    let mut widths: Vec<usize> = headers.iter().map(|h| h.chars().count()).collect();
    for r in rows {
        for (w, c) in widths.iter_mut().zip(r) {
            *w = (*w).max(c.chars().count());
        }
    }
    if let Some(w) = widths.first_mut() {
        *w = (*w).min(first_width);
    }
    let line = |cells: &[String]| {
        let parts: Vec<String> = cells
            .iter()
            .zip(&widths)
            .map(|(c, &w)| {
                // Padded by hand: a width from the data may pass the
                // 65535 that `{:<w$}` takes (case ids have no length cap).
                let t = truncate(c, w);
                let pad = w.saturating_sub(t.chars().count());
                t + &" ".repeat(pad)
            })
            .collect();
        outln!("{indent}{}", parts.join("  ").trim_end());
    };
    line(headers);
    for r in rows {
        line(r);
    }
}

fn truncate(s: &str, n: usize) -> String {
    if s.chars().count() <= n {
        s.to_string()
    } else {
        let mut t: String = s.chars().take(n.saturating_sub(1)).collect();
        t.push('~');
        t
    }
}
