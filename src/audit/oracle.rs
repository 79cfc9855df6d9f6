//! The CPU oracle and the contract's own negative controls, run as one more
//! child: `foldprint run --backend cpu` over experiment files the audit
//! writes. Per case they hold the case itself and its two controls (the
//! fold order reversed under `arrival-order`, and `pairwise-tree`), one
//! round each, every distinct set of parameters once. The digests come back
//! in the child's report like any configuration's.

use super::child::{self, Ending, Launch};
use super::read::first_difference;
use super::result::ControlCell;
use super::workdir::WorkArea;
use super::{AuditError, Options};
use crate::digest::NanPolicy;
use crate::experiment::{self, Case, DeliveryOrder, MAX_CASES};
use crate::fold::Contract;
use crate::input::MAX_EXPERIMENT_BYTES;
use crate::report::Report;
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The oracle's directory in the work area: configuration names cannot
/// start with '.', so it cannot collide with one.
pub(super) const DIR: &str = ".oracle";

/// The CPU oracle's results for one case.
pub(super) struct OracleCase {
    pub digests: Option<Vec<crate::digest::Sha256>>,
    /// Why the oracle did not run it.
    pub skip: Option<String>,
    pub arrival_reversed: ControlCell,
    pub pairwise_tree: ControlCell,
}

/// One control of a case: a run, or why it does not apply.
enum Control {
    Run(usize),
    NotApplicable(String),
}

/// What the oracle's child runs, and which of its runs each case reads.
struct Plan {
    /// Distinct runs, each once (keyed by their numeric parameters).
    runs: Vec<Case>,
    /// Per case: its own run and its two controls; `None` when the oracle
    /// does not run its contract.
    cases: Vec<Option<(usize, Control, Control)>>,
}

fn plan(cases: &[&Case]) -> Plan {
    let mut runs: Vec<Case> = Vec::new();
    let mut by_key: HashMap<String, usize> = HashMap::new();
    let mut add = |v: Case| -> usize {
        // Rounds repeat bit for bit (every child checks that); one is enough.
        let v = v.single_round();
        *by_key.entry(v.key()).or_insert_with(|| {
            runs.push(v);
            runs.len() - 1
        })
    };
    let mut planned = Vec::with_capacity(cases.len());
    for case in cases {
        // NCCL's own sum exists only on the NCCL backend: no oracle for it.
        if case.contract().needs_nccl() {
            planned.push(None);
            continue;
        }
        let own = add((*case).clone());
        let arrival_reversed = if case.world() <= 2 {
            Control::NotApplicable("W <= 2: two addends sum the same in either order".into())
        } else {
            // Reverse the order the case itself folds in: its delivery
            // order under arrival-order, ascending source rank otherwise.
            let mut seq = if case.contract() == Contract::ArrivalOrder {
                case.order().sequence(case.world())
            } else {
                (0..case.world()).collect()
            };
            seq.reverse();
            match (*case)
                .clone()
                .with_contract(Contract::ArrivalOrder)
                .with_order(DeliveryOrder::Explicit(seq))
            {
                Ok(v) => Control::Run(add(v)),
                Err(e) => Control::NotApplicable(format!("the reversed order: {e}")),
            }
        };
        let pairwise_tree = if case.contract() == Contract::PairwiseTree {
            Control::NotApplicable("the case is the pairwise tree".into())
        } else if case.world() <= 3 {
            Control::NotApplicable("W <= 3: the pairwise tree is the fixed order".into())
        } else {
            Control::Run(add((*case).clone().with_contract(Contract::PairwiseTree)))
        };
        planned.push(Some((own, arrival_reversed, pairwise_tree)));
    }
    Plan {
        runs,
        cases: planned,
    }
}

/// Id of run `i` in the written experiments.
fn run_id(i: usize) -> String {
    format!("r{i}")
}

/// The experiment files holding `runs`: as few as the per-file caps on
/// cases and bytes allow, each file the longest run of cases that fits.
/// Each is `(name, text)`.
fn experiment_files(runs: &[Case]) -> Result<Vec<(String, String)>, AuditError> {
    let budget = (MAX_EXPERIMENT_BYTES / 4 * 3) as usize;
    let cases: Vec<(String, &Case)> = runs
        .iter()
        .enumerate()
        .map(|(i, c)| (run_id(i), c))
        .collect();
    let text = |name: &str, cases: &[(String, &Case)]| {
        experiment::to_toml(name, cases)
            .map(|t| format!("# Written by `foldprint audit`: the CPU oracle's runs and the contract's controls, one round each.\n{t}"))
            .map_err(|e| AuditError::Oracle(format!("cannot write its experiments: {e}")))
    };
    let mut files = Vec::new();
    let mut rest = &cases[..];
    while !rest.is_empty() {
        let name = format!("oracle-{}", files.len() + 1);
        // The most cases that fit (a file grows with each case): one at
        // least, however long.
        let (mut fits, mut over) = (1, rest.len().min(MAX_CASES) + 1);
        let mut best = text(&name, &rest[..1])?;
        while over - fits > 1 {
            let mid = (fits + over) / 2;
            let t = text(&name, &rest[..mid])?;
            if t.len() <= budget {
                (fits, best) = (mid, t);
            } else {
                over = mid;
            }
        }
        files.push((name, best));
        rest = &rest[fits..];
    }
    Ok(files)
}

fn control_cell(
    own: &[crate::digest::Sha256],
    run: &Control,
    digests: &[Vec<crate::digest::Sha256>],
) -> ControlCell {
    match run {
        Control::NotApplicable(reason) => ControlCell::NotApplicable {
            reason: reason.clone(),
        },
        Control::Run(i) => {
            let d = &digests[*i];
            if first_difference(own, d).is_some() {
                ControlCell::Changed { digests: d.clone() }
            } else {
                ControlCell::Unchanged
            }
        }
    }
}

/// Run the oracle's child in `work` and read its report, one entry per case.
pub(super) fn run(
    cases: &[&Case],
    nan_policy: NanPolicy,
    timeout: Duration,
    work: &WorkArea,
    opts: &Options,
) -> Result<Vec<OracleCase>, AuditError> {
    let plan = plan(cases);
    let dir = work.root.join(DIR);
    let digests = if plan.runs.is_empty() {
        Vec::new()
    } else {
        run_child(&plan.runs, nan_policy, timeout, &dir, &opts.exe)?
    };
    Ok(plan
        .cases
        .iter()
        .zip(cases)
        .map(|(p, case)| match p {
            None => {
                let reason = format!("the CPU oracle does not run `{}`", case.contract());
                OracleCase {
                    digests: None,
                    skip: Some(reason.clone()),
                    arrival_reversed: ControlCell::NotApplicable {
                        reason: reason.clone(),
                    },
                    pairwise_tree: ControlCell::NotApplicable { reason },
                }
            }
            Some((own, arrival, tree)) => {
                let own = &digests[*own];
                OracleCase {
                    digests: Some(own.clone()),
                    skip: None,
                    arrival_reversed: control_cell(own, arrival, &digests),
                    pairwise_tree: control_cell(own, tree, &digests),
                }
            }
        })
        .collect())
}

/// Write the experiments, run them on the CPU backend, and return each
/// run's arena digests.
fn run_child(
    runs: &[Case],
    nan_policy: NanPolicy,
    timeout: Duration,
    dir: &Path,
    exe: &Path,
) -> Result<Vec<Vec<crate::digest::Sha256>>, AuditError> {
    let io = |source: std::io::Error| AuditError::WorkDir {
        path: dir.to_path_buf(),
        source,
    };
    let exp_dir = dir.join("experiments");
    std::fs::create_dir_all(&exp_dir).map_err(io)?;
    let mut paths: Vec<PathBuf> = Vec::new();
    for (name, text) in experiment_files(runs)? {
        let path = exp_dir.join(format!("{name}.toml"));
        std::fs::write(&path, text).map_err(io)?;
        paths.push(path);
    }
    let args = ["run", "--json", "--backend", "cpu", "--nan-policy"]
        .iter()
        .map(|s| s.to_string())
        .chain([nan_policy.name().to_string()])
        .collect();
    let done = Launch {
        dir,
        exe,
        args,
        experiments: &paths,
        env: &BTreeMap::new(),
        remove: &[],
        timeout,
    }
    .run()
    .map_err(io)?;
    let out = &done.output;
    if let Ending::Interrupted(signal) = out.ending {
        return Err(AuditError::Interrupted { signal });
    }
    let stderr = || {
        let t = child::tail(&out.stderr, 20);
        if t.is_empty() {
            " (its stderr was empty)".to_string()
        } else {
            format!("; its stderr ends:\n{t}")
        }
    };
    // Exit 1 still brings a report: an arrival-order group whose data
    // cannot show the difference fails the run's own checks, not ours.
    let report = match out.ending {
        Ending::Exited(code @ (0 | 1)) => Report::read(&done.report).map_err(|e| {
            AuditError::Oracle(format!("exit {code} without a usable report ({e})"))
        })?,
        ref e @ Ending::TimedOut => {
            return Err(AuditError::Oracle(format!(
                "{e} after {} s (matrix `timeout_s`){}",
                timeout.as_secs(),
                stderr()
            )))
        }
        ref e => return Err(AuditError::Oracle(format!("{e}{}", stderr()))),
    };
    let mut by_id: HashMap<&str, Vec<crate::digest::Sha256>> = report
        .cases
        .iter()
        .map(|c| (c.id.as_str(), c.digests()))
        .collect();
    (0..runs.len())
        .map(|i| {
            let id = run_id(i);
            by_id.remove(id.as_str()).ok_or_else(|| {
                let why = report
                    .skipped
                    .iter()
                    .find(|s| s.id == id)
                    .map_or("it is missing".to_string(), |s| {
                        format!("it was skipped: {}", s.reason)
                    });
                AuditError::Oracle(format!(
                    "its report has no digests for case `{}` ({why})",
                    runs[i].key()
                ))
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::Distribution;

    fn case(world: usize, contract: Contract, order: DeliveryOrder) -> Case {
        Case::builder(world, [5, 0, 70])
            .experiment("e")
            .id(format!("{contract}-{world}-{order}"))
            .order(order)
            .seed(9)
            .distribution(Distribution::MixedMagnitude)
            .contract(contract)
            .mean(true)
            .rounds(3)
            .build()
            .unwrap()
    }

    #[test]
    fn written_runs_read_back_as_the_same_cases() {
        let cases = [
            case(5, Contract::FixedOrder, DeliveryOrder::Shuffle(4)),
            case(5, Contract::FixedOrder, DeliveryOrder::Descending),
            case(6, Contract::ArrivalOrder, DeliveryOrder::Rotate(2)),
            case(2, Contract::PairwiseTree, DeliveryOrder::Ascending),
            case(4, Contract::NcclAllreduce, DeliveryOrder::Ascending),
        ];
        let refs: Vec<&Case> = cases.iter().collect();
        let p = plan(&refs);
        // The two fixed-order cases differ only in delivery order: both
        // reverse ascending rank, one run. The tree keeps each case's
        // delivery order, so it is two.
        let (own0, Control::Run(a0), Control::Run(t0)) = p.cases[0].as_ref().unwrap() else {
            panic!("controls of a W=5 fixed-order case must run")
        };
        let (own1, Control::Run(a1), Control::Run(t1)) = p.cases[1].as_ref().unwrap() else {
            panic!()
        };
        assert_ne!(own0, own1);
        assert_eq!(a0, a1);
        assert_ne!(t0, t1);
        assert_eq!(
            p.runs[*a0].order(),
            &DeliveryOrder::Explicit(vec![4, 3, 2, 1, 0])
        );
        // arrival-order reverses its own sequence.
        let (_, Control::Run(a2), _) = p.cases[2].as_ref().unwrap() else {
            panic!()
        };
        assert_eq!(
            p.runs[*a2].order(),
            &DeliveryOrder::Explicit(vec![1, 0, 5, 4, 3, 2])
        );
        assert!(matches!(
            p.cases[3],
            Some((_, Control::NotApplicable(_), Control::NotApplicable(_)))
        ));
        assert!(p.cases[4].is_none());

        let files = experiment_files(&p.runs).unwrap();
        assert_eq!(files.len(), 1);
        let e = crate::experiment::parse(Path::new("o.toml"), &files[0].1).unwrap();
        assert_eq!(e.name, "oracle-1");
        assert_eq!(e.cases.len(), p.runs.len());
        for (i, (got, want)) in e.cases.iter().zip(&p.runs).enumerate() {
            assert_eq!(got.id(), run_id(i));
            assert_eq!(got.key(), want.key());
            assert_eq!(got.params(), want.params());
            assert_eq!(got.rounds(), 1);
        }
    }

    #[test]
    fn many_runs_are_split_under_the_per_file_cap() {
        let runs: Vec<Case> = (0..MAX_CASES + 3)
            .map(|s| {
                let c = case(3, Contract::FixedOrder, DeliveryOrder::Ascending);
                c.with_data(s as u64, crate::data::Distribution::default())
            })
            .collect();
        let files = experiment_files(&runs).unwrap();
        assert_eq!(files.len(), 2);
        let a = crate::experiment::parse(Path::new("a.toml"), &files[0].1).unwrap();
        let b = crate::experiment::parse(Path::new("b.toml"), &files[1].1).unwrap();
        assert_eq!((a.cases.len(), b.cases.len()), (MAX_CASES, 3));
        assert_eq!(b.name, "oracle-2");
        assert_eq!(b.cases[2].id(), run_id(MAX_CASES + 2));
    }
}
