//! CLI edge: argument parsing, exit codes, and human or JSON output.
//!
//! Exit codes: [`foldprint::exit::ExitCode`] (0 all checks passed; 1 a
//! check failed; 2 bad input; 3 a resource is missing; 4 the
//! infrastructure failed mid-run; 128+N stopped by signal N).

// First, so that `out!`/`outln!` are in scope in every module below.
#[macro_use]
mod output;

mod args;
mod attest;
mod audit;
mod bench;
mod checks;
mod compare;
mod doctor;
mod gate;
mod golden;
mod launch;
mod plot;
mod progress;
mod run;
mod run_common;
mod table;
mod verify;
mod world;

use args::{Cli, Command};
use clap::Parser;
use foldprint::exit::HasExitCode;
// Reached as `super::...` by audit and bench.
use checks::check_output;
use run_common::start_threads;

pub fn main() -> i32 {
    let cli = match Cli::try_parse() {
        Ok(c) => c,
        Err(e) => {
            let printed = e.print();
            if e.use_stderr() {
                return 2;
            }
            // --help and --version: a failed write (a full disk) is an
            // error, as for any other output; a closed pipe is not.
            use std::io::Write;
            return match printed.and_then(|()| std::io::stdout().flush()) {
                Err(err) if err.kind() != std::io::ErrorKind::BrokenPipe => {
                    eprintln!("error: cannot write to standard output: {err}");
                    foldprint::exit::io_exit_code(&err).code()
                }
                _ => 0,
            };
        }
    };
    let result = match cli.command {
        Command::Run(a) => run::run(a),
        Command::Compare(a) => compare::run(a),
        Command::Verify(a) => verify::run(a),
        Command::Golden(a) => golden::run(a),
        Command::Doctor(a) => doctor::run(a.json),
        Command::Bench(a) => bench::run(a),
        Command::Launch(a) => launch::run(a),
        Command::Attest(a) => attest::run(a),
        Command::Audit(a) => audit::run(a),
        Command::World(a) => world::run(a),
        Command::Plot(a) => plot::run(a),
    };
    let code = match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {}", foldprint::report::printable(&e.message()));
            e.exit_code().code()
        }
    };
    output::finish_stdout(code)
}
