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
