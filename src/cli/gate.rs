//! `run --expect-gate`: which differences from an `expect` file make the
//! exit code 1. "Which contract is the framework's result?" is a finding,
//! read from the report; a launcher that sees exit 1 calls the job crashed,
//! so a job asking that question runs with `none`, and CI keeps a gate on
//! the contract it cares about (`fixed-order`).

use foldprint::fold::Contract;
use foldprint::report::Report;

#[derive(Debug, Clone, PartialEq)]
pub(super) enum ExpectGate {
    /// Any case that differs from its `expect` exits 1 (the default).
    All,
    /// Differences are findings only: exit 0 when the run's checks held.
    None,
    /// Exit 1 only when a case of one of these contracts differs.
    Contracts(Vec<Contract>),
}

impl ExpectGate {
    /// The cases (ids) whose difference from `expect` fails the run.
    pub(super) fn failing<'r>(&self, report: &'r Report) -> Vec<&'r str> {
        let gated = |c: Contract| match self {
            ExpectGate::All => true,
            ExpectGate::None => false,
            ExpectGate::Contracts(list) => list.contains(&c),
        };
        report
            .cases
            .iter()
            .filter(|c| gated(c.params.contract) && c.expect_outcomes().any(|e| !e.equal))
            .map(|c| c.id.as_str())
            .collect()
    }

    pub(super) fn is_default(&self) -> bool {
        *self == ExpectGate::All
    }
}

impl std::fmt::Display for ExpectGate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ExpectGate::All => f.write_str("all"),
            ExpectGate::None => f.write_str("none"),
            ExpectGate::Contracts(list) => {
                let names: Vec<&str> = list.iter().map(|c| c.name()).collect();
                f.write_str(&names.join(","))
            }
        }
    }
}

pub(super) fn parse(s: &str) -> Result<ExpectGate, String> {
    match s {
        "all" => Ok(ExpectGate::All),
        "none" => Ok(ExpectGate::None),
        "" => Err("an empty gate (expected all, none or contract names)".into()),
        list => list
            .split(',')
            .map(|name| name.trim().parse::<Contract>())
            .collect::<Result<Vec<_>, _>>()
            .map(ExpectGate::Contracts),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_parse_and_print_back() {
        assert_eq!(parse("all").unwrap(), ExpectGate::All);
        assert_eq!(parse("none").unwrap(), ExpectGate::None);
        let g = parse("fixed-order,nccl-allreduce").unwrap();
        assert_eq!(g.to_string(), "fixed-order,nccl-allreduce");
        assert!(parse("fixed-ordre").unwrap_err().contains("fixed-ordre"));
        assert!(parse("").is_err());
    }
}
