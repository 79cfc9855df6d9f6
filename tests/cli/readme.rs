//! The README as a newcomer reads it: its sample output is what the code
//! prints, its examples make the files they use, and what they write into
//! the checkout is git-ignored.

use std::path::Path;

fn readme() -> String {
    std::fs::read_to_string("README.md").unwrap()
}

/// The first fenced block after `heading`.
fn block_after(text: &str, heading: &str) -> Vec<String> {
    let section = text
        .split(heading)
        .nth(1)
        .unwrap_or_else(|| panic!("README has no `{heading}`"));
    section
        .lines()
        .skip_while(|l| !l.starts_with("```"))
        .skip(1)
        .take_while(|l| !l.starts_with("```"))
        .map(str::to_string)
        .collect()
}

/// A table line without its TIME column (the one that varies by machine).
fn without_time(line: &str) -> String {
    let t = line.trim_end();
    for unit in [" ms", " s"] {
        if let Some(rest) = t.strip_suffix(unit) {
            if let Some((head, num)) = rest.rsplit_once(' ') {
                if num.parse::<f64>().is_ok() {
                    return head.trim_end().to_string();
                }
            }
        }
    }
    t.to_string()
}

#[test]
fn the_sample_output_is_what_the_code_prints() {
    let sample = block_after(&readme(), "## Reading the output");
    assert!(sample.len() > 10, "{sample:?}");
    let out = std::process::Command::new(crate::common::bin_path())
        .args(["run", "experiments/smoke.toml", "--backend", "cpu"])
        .output()
        .unwrap();
    assert!(out.status.success());
    let real: Vec<String> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(without_time)
        .collect();
    // Every sample line, in order, is a line of the real output; `...`
    // stands for lines left out.
    let mut at = 0;
    for line in sample.iter().filter(|l| l.trim() != "...") {
        let want = without_time(line);
        match real[at..].iter().position(|r| *r == want) {
            Some(k) => at += k + 1,
            None => panic!(
                "README sample line not in the output (after line {at}):\n{want}\n\nreal output:\n{}",
                real.join("\n")
            ),
        }
    }
}

#[test]
fn examples_make_their_inputs_and_their_outputs_are_ignored() {
    let block = block_after(&readme(), "## More commands");
    let mut made: Vec<String> = Vec::new();
    for line in block.iter().filter(|l| l.starts_with("foldprint ")) {
        let words: Vec<&str> = line.split('#').next().unwrap().split_whitespace().collect();
        let uses: Vec<&str> = match words[1] {
            "compare" => words[2..].to_vec(),
            "plot" => words[2..]
                .iter()
                .take_while(|w| !w.starts_with("--"))
                .copied()
                .collect(),
            "attest" => {
                let mut u = vec![words[2]];
                if let Some(i) = words.iter().position(|w| *w == "--dump") {
                    u.push(words[i + 1]);
                }
                u
            }
            _ => Vec::new(),
        };
        for u in uses.iter().filter(|u| !u.starts_with("--")) {
            assert!(
                Path::new(u).starts_with("experiments") || made.iter().any(|m| m == u),
                "`{line}` uses {u}, which no example before it makes"
            );
        }
        for flag in ["--out", "--dump", "--junit"] {
            if let Some(i) = words.iter().position(|w| *w == flag) {
                made.push(words[i + 1].to_string());
            }
        }
    }
    assert!(made.len() >= 4, "{made:?}");
    for path in &made {
        let ignored = std::process::Command::new("git")
            .args(["check-ignore", "-q", "--no-index"])
            .arg(path)
            .status()
            .expect("git");
        assert!(
            ignored.success(),
            "{path}, written by a README example, is not git-ignored"
        );
    }
}

#[test]
fn the_readme_says_how_to_get_foldprint_on_path_and_warns_about_golden() {
    let text = readme();
    assert!(text.contains("cargo install --locked --path ."));
    let golden = text
        .lines()
        .position(|l| l.starts_with("foldprint golden"))
        .expect("golden example");
    let before: String = text.lines().take(golden).collect::<Vec<_>>().join("\n");
    assert!(
        before.contains("rewrites the committed goldens"),
        "golden needs its warning"
    );
    assert!(text.contains("foldprint audit"), "audit is in the README");
    assert!(text.contains("**TIME**"), "the TIME column is explained");
}
