//! The `foldprint` command line; all work happens in the library.

mod cli;

fn main() {
    std::process::exit(cli::main());
}
