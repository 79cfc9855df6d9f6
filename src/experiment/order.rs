//! Delivery orders: the sequence in which an owner receives its peers'
//! copies of its shard. Fixed-order bits must not depend on it.

use crate::data::mix64;
use std::fmt;

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum DeliveryOrder {
    Ascending,
    Descending,
    /// Position i receives from source (i + k) mod W.
    Rotate(u64),
    /// A Fisher-Yates shuffle driven by the generator's mixer.
    Shuffle(u64),
    /// Position i receives from source `p[i]`.
    Explicit(Vec<usize>),
}

impl DeliveryOrder {
    /// Parse the string forms: `ascending`, `descending`, `rotate:K`, `shuffle:SEED`.
    pub fn parse(s: &str) -> Result<Self, String> {
        let num = |rest: &str, what: &str| {
            rest.parse::<u64>().map_err(|_| {
                format!("`{s}`: {what} must be a non-negative integer, as in `{what}:3`")
            })
        };
        match s {
            "ascending" => Ok(Self::Ascending),
            "descending" => Ok(Self::Descending),
            _ => {
                if let Some(k) = s.strip_prefix("rotate:") {
                    Ok(Self::Rotate(num(k, "rotate")?))
                } else if let Some(seed) = s.strip_prefix("shuffle:") {
                    Ok(Self::Shuffle(num(seed, "shuffle")?))
                } else {
                    Err(format!(
                        "unknown delivery order `{s}` (expected ascending, descending, rotate:K, shuffle:SEED or an array of ranks)"
                    ))
                }
            }
        }
    }

    /// Check an explicit permutation against W.
    pub fn validate(&self, world: usize) -> Result<(), String> {
        if let Self::Explicit(p) = self {
            if p.len() != world {
                return Err(format!(
                    "permutation {p:?} has {} entries but world = {world}",
                    p.len()
                ));
            }
            let mut seen = vec![false; world];
            for &r in p {
                if r >= world {
                    return Err(format!(
                        "permutation {p:?} names rank {r}, but ranks are 0..{world}"
                    ));
                }
                if seen[r] {
                    return Err(format!("permutation {p:?} names rank {r} twice"));
                }
                seen[r] = true;
            }
        }
        Ok(())
    }

    /// The source ranks in delivery order. Call after `validate`.
    pub fn sequence(&self, world: usize) -> Vec<usize> {
        match self {
            Self::Ascending => (0..world).collect(),
            Self::Descending => (0..world).rev().collect(),
            Self::Rotate(k) => {
                let k = (*k % world.max(1) as u64) as usize;
                (0..world).map(|i| (i + k) % world).collect()
            }
            Self::Shuffle(seed) => {
                let mut p: Vec<usize> = (0..world).collect();
                let key = mix64(*seed ^ 0x5348_5546_464C_4521);
                for i in (1..world).rev() {
                    let h = mix64(key.wrapping_add(i as u64));
                    // Multiply-high: an index in 0..=i without division.
                    let j = ((h as u128 * (i as u128 + 1)) >> 64) as usize;
                    p.swap(i, j);
                }
                p
            }
            Self::Explicit(p) => p.clone(),
        }
    }

    /// Stable text used in case keys and reports.
    pub fn canonical(&self) -> String {
        match self {
            Self::Ascending => "ascending".into(),
            Self::Descending => "descending".into(),
            Self::Rotate(k) => format!("rotate:{k}"),
            Self::Shuffle(s) => format!("shuffle:{s}"),
            Self::Explicit(p) => {
                let items: Vec<String> = p.iter().map(|r| r.to_string()).collect();
                format!("[{}]", items.join(","))
            }
        }
    }
}

impl fmt::Display for DeliveryOrder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.canonical())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sequences_are_permutations() {
        for w in 1..70 {
            for o in [
                DeliveryOrder::Ascending,
                DeliveryOrder::Descending,
                DeliveryOrder::Rotate(3),
                DeliveryOrder::Shuffle(7),
            ] {
                let mut s = o.sequence(w);
                s.sort_unstable();
                assert_eq!(s, (0..w).collect::<Vec<_>>(), "{o} at W={w}");
            }
        }
    }

    #[test]
    fn shuffle_actually_moves_ranks() {
        let s = DeliveryOrder::Shuffle(1).sequence(8);
        assert_ne!(s, (0..8).collect::<Vec<_>>());
    }

    #[test]
    fn bad_permutations_are_named() {
        let e = DeliveryOrder::Explicit(vec![0, 0, 2])
            .validate(3)
            .unwrap_err();
        assert!(e.contains("twice"), "{e}");
        let e = DeliveryOrder::Explicit(vec![0, 1]).validate(3).unwrap_err();
        assert!(e.contains("2 entries"), "{e}");
        let e = DeliveryOrder::Explicit(vec![0, 1, 3])
            .validate(3)
            .unwrap_err();
        assert!(e.contains("rank 3"), "{e}");
        assert!(DeliveryOrder::parse("rotate:x").is_err());
        assert!(DeliveryOrder::parse("sideways").is_err());
    }
}
