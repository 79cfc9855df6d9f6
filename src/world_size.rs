//! W, the number of ranks a case reduces over, as one type: a
//! [`WorldSize`] is 1 ..= [`MAX_WORLD`], checked once, by its constructor.
//! What reads a world from outside (an experiment's `world`, a report's
//! `params.world`, a builder's argument) makes one here, so the limit is
//! written in one place.

use std::fmt;
use std::num::NonZeroUsize;

/// Largest W accepted.
pub const MAX_WORLD: usize = 65_536;

/// A number of ranks in 1 ..= [`MAX_WORLD`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct WorldSize(NonZeroUsize);

/// A world size out of range, in the words experiment files get.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("must be 1 ..= {MAX_WORLD}, got {got}")]
pub struct WorldSizeError {
    /// As given (an experiment's TOML integer may be negative).
    pub got: i128,
}

impl WorldSize {
    /// One rank.
    pub const ONE: WorldSize = WorldSize(NonZeroUsize::MIN);

    pub fn new(ranks: usize) -> Result<WorldSize, WorldSizeError> {
        match NonZeroUsize::new(ranks) {
            Some(w) if ranks <= MAX_WORLD => Ok(WorldSize(w)),
            _ => Err(WorldSizeError { got: ranks as i128 }),
        }
    }

    pub fn get(self) -> usize {
        self.0.get()
    }
}

impl TryFrom<i64> for WorldSize {
    type Error = WorldSizeError;
    fn try_from(ranks: i64) -> Result<WorldSize, WorldSizeError> {
        usize::try_from(ranks)
            .ok()
            .and_then(|w| WorldSize::new(w).ok())
            .ok_or(WorldSizeError { got: ranks.into() })
    }
}

impl fmt::Display for WorldSize {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_world_size_is_one_to_max_world() {
        assert_eq!(WorldSize::new(1).unwrap(), WorldSize::ONE);
        assert_eq!(WorldSize::new(MAX_WORLD).unwrap().get(), MAX_WORLD);
        assert_eq!(
            WorldSize::new(0).unwrap_err().to_string(),
            format!("must be 1 ..= {MAX_WORLD}, got 0")
        );
        assert!(WorldSize::new(MAX_WORLD + 1).is_err());
        assert_eq!(WorldSize::try_from(3i64).unwrap().get(), 3);
        assert_eq!(
            WorldSize::try_from(-2i64).unwrap_err().to_string(),
            format!("must be 1 ..= {MAX_WORLD}, got -2")
        );
        assert!(WorldSize::try_from(i64::MAX).is_err());
    }
}
