//! Helpers every command-line test file shares. Each test crate uses only
//! some of them, hence the `dead_code` allowances.

use assert_cmd::Command;
use std::path::{Path, PathBuf};

/// The foldprint binary under test.
#[allow(dead_code)]
pub fn fp() -> Command {
    Command::cargo_bin("foldprint").unwrap()
}

/// Write `text` to `dir/name` and return the path.
#[allow(dead_code)]
pub fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    p
}

/// W = 3, two small arenas, three delivery orders for a fixed-order group
/// and its arrival-order control.
#[allow(dead_code)]
pub const TINY: &str = r#"
name = "tiny"
[defaults]
world = 3
arenas = [257, 5]
seed = 7
[[sweep]]
id = "o"
order = ["ascending", "descending", [1, 2, 0]]
contract = ["fixed-order", "arrival-order"]
"#;
