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

/// 30 cases of about 0.1-0.2 s each on a 2-core machine: long enough to
/// interrupt a run or watch its progress.
#[allow(dead_code)]
pub const SLOW: &str = r#"
name = "slow"
[defaults]
world = 8
arenas = [1048576]
[[sweep]]
id = "s"
seed = [1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20,21,22,23,24,25,26,27,28,29,30]
"#;
