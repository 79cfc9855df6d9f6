//! The comparison: each case's digests under every configuration against
//! the baseline's (a control is expected to change them), the CPU oracle's
//! against the baseline's, and the problems and weak controls worth naming.

use super::matrix::Matrix;
use super::oracle::OracleCase;
use super::read::{first_difference, CaseId, Digests};
use super::result::{CaseRow, Cell, ConfigOutcome, ControlCell, NamedCell, OracleRow, Status};
use crate::experiment::Case;

pub(super) fn collect_config_problems(
    o: &ConfigOutcome,
    failures: &mut Vec<String>,
    warnings: &mut Vec<String>,
) {
    let who = if o.control {
        "control"
    } else {
        "configuration"
    };
    if let Some(e) = &o.error {
        if o.status != Status::NotRun {
            let tail = if o.stderr_tail.is_empty() {
                " (its stderr was empty)".to_string()
            } else {
                format!("; its stderr ends:\n{}", indent(&o.stderr_tail))
            };
            failures.push(format!("{who} `{}` could not run: {e}{tail}", o.name));
        }
    }
    for check in &o.requested {
        if let Some(msg) = &check.message {
            failures.push(format!("{who} `{}`: {msg}", o.name));
        }
    }
    for f in &o.run_failures {
        let line = format!("{who} `{}`: the run's own check failed: {f}", o.name);
        if o.control {
            warnings.push(line);
        } else {
            failures.push(line);
        }
    }
    for n in &o.notes {
        warnings.push(format!("{who} `{}`: {n}", o.name));
    }
    if o.skipped > 0 {
        warnings.push(format!(
            "{who} `{}`: its backend skipped {} case(s) (not compared; see the report)",
            o.name, o.skipped
        ));
    }
}

fn indent(s: &str) -> String {
    s.lines()
        .map(|l| format!("    | {l}"))
        .collect::<Vec<_>>()
        .join("\n")
}

fn digest_at(d: &[crate::digest::Sha256], i: usize) -> String {
    d.get(i).map_or("(no arena)".into(), ToString::to_string)
}

pub(super) fn compare(
    m: &Matrix,
    cases: &[&Case],
    results: &[Digests],
    oracle: Option<&[OracleCase]>,
    failures: &mut Vec<String>,
) -> Vec<CaseRow> {
    let base = m.baseline();
    let base_name = &m.configs[base].name;
    let mut rows = Vec::with_capacity(cases.len());
    for (ci, case) in cases.iter().enumerate() {
        let id: CaseId = (case.experiment().to_string(), case.id().to_string());
        let label = format!("{}/{}", case.experiment(), case.id());
        let base_digests = results[base].cases.get(&id).cloned();
        let mut cells = Vec::with_capacity(m.configs.len());
        for (i, c) in m.configs.iter().enumerate() {
            let r = &results[i];
            let who = if c.control {
                "control"
            } else {
                "configuration"
            };
            let cell = if !r.ran {
                Cell::NotRun
            } else if let Some(d) = r.cases.get(&id) {
                if i == base {
                    Cell::Baseline { digests: d.clone() }
                } else if let Some(b) = &base_digests {
                    match (first_difference(b, d), c.control) {
                        (None, false) => Cell::Equal,
                        (None, true) => Cell::Unchanged,
                        (Some(a), true) => Cell::Changed {
                            digests: d.clone(),
                            arena: a,
                        },
                        (Some(a), false) => {
                            failures.push(format!(
                                "configuration `{}`: case `{label}` arena {a}: digest {} but the baseline `{base_name}` has {}",
                                c.name,
                                digest_at(d, a),
                                digest_at(b, a)
                            ));
                            Cell::Differs {
                                digests: d.clone(),
                                arena: a,
                            }
                        }
                    }
                } else {
                    Cell::Uncompared { digests: d.clone() }
                }
            } else if let Some(reason) = r.skipped.get(&id) {
                Cell::Skipped {
                    reason: reason.clone(),
                }
            } else {
                failures.push(format!(
                    "{who} `{}`: its report has no case `{label}`",
                    c.name
                ));
                Cell::Missing
            };
            cells.push(NamedCell {
                config: c.name.clone(),
                cell,
            });
        }
        let oracle_row = oracle.map(|o| {
            let oc = &o[ci];
            let vs_baseline = match (&oc.digests, &base_digests) {
                (None, _) => Cell::Skipped {
                    reason: oc.skip.clone().unwrap_or_default(),
                },
                (Some(d), None) => Cell::Uncompared { digests: d.clone() },
                (Some(d), Some(b)) => match first_difference(b, d) {
                    None => Cell::Equal,
                    Some(a) => {
                        failures.push(format!(
                            "CPU oracle: case `{label}` arena {a}: digest {} but the baseline `{base_name}` has {}",
                            digest_at(d, a),
                            digest_at(b, a)
                        ));
                        Cell::Differs {
                            digests: d.clone(),
                            arena: a,
                        }
                    }
                },
            };
            OracleRow {
                digests: oc.digests.clone(),
                vs_baseline,
                arrival_reversed: oc.arrival_reversed.clone(),
                pairwise_tree: oc.pairwise_tree.clone(),
            }
        });
        let sensitivity = results[base]
            .sensitivity
            .get(&id)
            .or_else(|| results.iter().find_map(|r| r.sensitivity.get(&id)))
            .cloned();
        rows.push(CaseRow {
            experiment: case.experiment().to_string(),
            id: case.id().to_string(),
            key: case.key(),
            world: case.world(),
            contract: case.contract().name().to_string(),
            sensitivity,
            baseline: base_digests,
            cells,
            oracle: oracle_row,
        });
    }
    rows
}

/// Blind (or of unknown sensitivity): agreement proves nothing there.
fn is_blind(r: &CaseRow) -> bool {
    r.sensitivity.as_ref().is_none_or(|s| s.verdict == "blind")
}

/// Name up to five cases, then how many more.
fn some_cases(labels: &[String]) -> String {
    let mut s = labels
        .iter()
        .take(5)
        .map(|l| format!("`{l}`"))
        .collect::<Vec<_>>()
        .join(", ");
    if labels.len() > 5 {
        s.push_str(&format!(" and {} more", labels.len() - 5));
    }
    s
}

pub(super) fn collect_control_warnings(
    m: &Matrix,
    outcomes: &[ConfigOutcome],
    rows: &[CaseRow],
    failures: &mut Vec<String>,
    warnings: &mut Vec<String>,
) {
    let base = m.baseline();
    for (i, c) in m.configs.iter().enumerate() {
        if !outcomes[i].status.has_report() || i == base {
            continue;
        }
        let compared = rows
            .iter()
            .filter(|r| {
                matches!(
                    r.cells[i].cell,
                    Cell::Equal | Cell::Differs { .. } | Cell::Changed { .. } | Cell::Unchanged
                )
            })
            .count();
        if compared == 0 && outcomes[base].status.has_report() {
            let line = format!(
                "{} `{}` compared no case with the baseline (all skipped or uncompared)",
                if c.control {
                    "control"
                } else {
                    "configuration"
                },
                c.name
            );
            if c.control {
                warnings.push(line);
            } else {
                failures.push(line);
            }
        }
        if !c.control {
            continue;
        }
        let changed = rows
            .iter()
            .filter(|r| matches!(r.cells[i].cell, Cell::Changed { .. }))
            .count();
        let still: Vec<String> = rows
            .iter()
            .filter(|r| r.cells[i].cell == Cell::Unchanged && !is_blind(r))
            .map(|r| format!("{}/{}", r.experiment, r.id))
            .collect();
        if compared > 0 && changed == 0 {
            warnings.push(format!(
                "control `{}` changed no case's digests: it does not show that this audit can see a difference",
                c.name
            ));
        } else if !still.is_empty() {
            warnings.push(format!(
                "control `{}` changed {changed} of {compared} case(s) and left {} order-sensitive case(s) unchanged: {}",
                c.name,
                still.len(),
                some_cases(&still)
            ));
        }
    }
    for (what, pick) in [
        ("arrival-order (reversed)", 0usize),
        ("pairwise-tree", 1usize),
    ] {
        let still: Vec<String> = rows
            .iter()
            .filter(|r| !is_blind(r))
            .filter(|r| {
                r.oracle.as_ref().is_some_and(|o| {
                    let cell = if pick == 0 {
                        &o.arrival_reversed
                    } else {
                        &o.pairwise_tree
                    };
                    *cell == ControlCell::Unchanged
                })
            })
            .map(|r| format!("{}/{}", r.experiment, r.id))
            .collect();
        if !still.is_empty() {
            warnings.push(format!(
                "contract control {what} left {} order-sensitive case(s) unchanged: {}",
                still.len(),
                some_cases(&still)
            ));
        }
    }
}
