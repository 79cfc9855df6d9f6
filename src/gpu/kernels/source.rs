//! What NVRTC compiles: the two CUDA sources (`generate.cu`, `fold.cu`),
//! preceded by `#define`s generated from the Rust constants they share, and
//! the kernels' entry points.
//!
//! Every number the host and the device must agree on is written once, in
//! Rust ([`crate::data`], [`super::tree`], [`crate::data::Distribution::code`]);
//! [`defines`] turns them into the preprocessor lines both programs start
//! with, and the `.cu` files only name them.

use super::tree::{TREE_ADD, TREE_STACK};
use crate::data::{self, Distribution};
use crate::dtype::Dtype;
use serde::Serialize;
use std::fmt;
use std::sync::LazyLock;

/// The generator's CUDA C, as written (without the generated `#define`s).
pub const GENERATOR_CU: &str = include_str!("generate.cu");
/// The dtype conversions (integer code mirroring `crate::dtype`, and the
/// hardware's f16 ones for the folds' fast path), placed before
/// `generate.cu` and `fold.cu`.
pub const DTYPE_CUH: &str = include_str!("dtype.cuh");
/// The fold's CUDA C, as written (without the generated `#define`s).
pub const FOLD_CU: &str = include_str!("fold.cu");

/// The generator program as NVRTC compiles it: [`prelude`] + `generate.cu`.
pub static GENERATOR_SRC: LazyLock<String> =
    LazyLock::new(|| program_with_dtypes("generate.cu", GENERATOR_CU));
/// The rank-copy check's CUDA C (integer code; it uses no shared constant).
pub const RANK_CHECK_CU: &str = include_str!("rank_check.cu");
/// The rank-copy check as NVRTC compiles it: [`prelude`] + `rank_check.cu`.
pub static RANK_CHECK_SRC: LazyLock<String> =
    LazyLock::new(|| program_text("rank_check.cu", RANK_CHECK_CU));
/// NVRTC's name of the rank-copy check program.
pub const RANK_CHECK_PROGRAM: &str = "foldprint_rank_check";
/// The rank-copy check's kernel.
pub const RANK_DIFF_ENTRY: &str = "fp_rank_diff";
/// The rank-copy check of a 16-bit arena.
pub const RANK_DIFF16_ENTRY: &str = "fp_rank_diff16";
/// Per-chunk SHA-256 of an arena, in the rank-check program.
pub const CHUNK_SHA_ENTRY: &str = "fp_chunk_sha256";
/// Which chunks of an arena hold a NaN (`rank_check.cu`).
pub const NAN_CHUNKS_ENTRY: &str = "fp_nan_chunks";
/// The fold program as NVRTC compiles it: [`prelude`] + `fold.cu`.
pub static FOLD_SRC: LazyLock<String> = LazyLock::new(|| program_with_dtypes("fold.cu", FOLD_CU));
/// Other shapes of the 16-bit fixed-order `fast` fold, for measuring them
/// beside each other (`fold16_trials.cu`, built on `fold.cu`'s templates).
pub const FOLD16_TRIALS_CU: &str = include_str!("fold16_trials.cu");
/// The trials as NVRTC compiles them: [`FOLD_SRC`] + `fold16_trials.cu`.
/// Only the benchmark's sweep builds it.
pub static FOLD16_TRIALS_SRC: LazyLock<String> = LazyLock::new(|| {
    format!(
        "{}#line 1 \"fold16_trials.cu\"\n{FOLD16_TRIALS_CU}",
        *FOLD_SRC
    )
});
/// NVRTC's name of the trials program.
pub const FOLD16_TRIALS_PROGRAM: &str = "foldprint_fold16_trials";

/// One shape of [`FOLD16_TRIALS_CU`]: its kernel (the signature of
/// `FP_FOLD16_ENTRY`, fixed order) and the elements each thread folds per
/// step (for the grid size).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Fold16Trial {
    pub entry: &'static str,
    pub elems_per_thread: u32,
}

/// Every trial kernel, in the order the sweep prints them.
pub const FOLD16_TRIALS: [Fold16Trial; 11] = [
    Fold16Trial {
        entry: "fp_fold16_before",
        elems_per_thread: 8,
    },
    Fold16Trial {
        entry: "fp_fold16_int_n8_b8",
        elems_per_thread: 8,
    },
    Fold16Trial {
        entry: "fp_fold16_hw_n8_b8",
        elems_per_thread: 8,
    },
    Fold16Trial {
        entry: "fp_fold16_hw_n8_b4",
        elems_per_thread: 8,
    },
    Fold16Trial {
        entry: "fp_fold16_hw_n4_b8",
        elems_per_thread: 4,
    },
    Fold16Trial {
        entry: "fp_fold16_hw_n4_b16",
        elems_per_thread: 4,
    },
    Fold16Trial {
        entry: "fp_fold16_hw_n16_b4",
        elems_per_thread: 16,
    },
    Fold16Trial {
        entry: "fp_fold16_hw_n4_b8_ahead",
        elems_per_thread: 4,
    },
    Fold16Trial {
        entry: "fp_fold16_hw_n8_b4_ahead",
        elems_per_thread: 8,
    },
    Fold16Trial {
        entry: "fp_fold16_hw_n4_b4_occ2",
        elems_per_thread: 4,
    },
    Fold16Trial {
        entry: "fp_fold16_hw_n8_b2_occ2",
        elems_per_thread: 8,
    },
];

/// The kernels of the trials program.
pub fn fold16_trial_entries() -> Vec<&'static str> {
    FOLD16_TRIALS.iter().map(|t| t.entry).collect()
}

/// [`prelude`], then `file`'s text under a `#line` directive, so NVRTC's
/// messages name the `.cu` file and its own line numbers. (The directive
/// changes no code: the images are byte-identical without it.)
fn program_text(file: &str, text: &str) -> String {
    format!("{}#line 1 \"{file}\"\n{text}", prelude())
}

/// [`prelude`], `dtype.cuh`, then `file`, each under its own `#line`.
fn program_with_dtypes(file: &str, text: &str) -> String {
    format!(
        "{}#line 1 \"dtype.cuh\"\n{DTYPE_CUH}#line 1 \"{file}\"\n{text}",
        prelude()
    )
}

/// NVRTC's name of the fold program.
pub const FOLD_PROGRAM: &str = "foldprint_fold";
/// NVRTC's name of the generator program.
pub const GENERATOR_PROGRAM: &str = "foldprint_generate";
/// The generator's kernel.
pub const GENERATE_ENTRY: &str = "fp_generate";
/// The generator in a 16-bit dtype.
pub const GENERATE16_ENTRY: &str = "fp_generate16";
/// Every float32 pattern of a range narrowed to a 16-bit dtype.
pub const NARROW_BITS_ENTRY: &str = "fp_narrow_bits";
/// 16-bit patterns widened to float32.
pub const WIDEN_BITS_ENTRY: &str = "fp_widen_bits";

/// Every kernel of the generator program.
pub const GENERATOR_ENTRIES: [&str; 4] = [
    GENERATE_ENTRY,
    GENERATE16_ENTRY,
    NARROW_BITS_ENTRY,
    WIDEN_BITS_ENTRY,
];
/// Every kernel of the rank-check program.
pub const RANK_CHECK_ENTRIES: [&str; 4] = [
    RANK_DIFF_ENTRY,
    CHUNK_SHA_ENTRY,
    NAN_CHUNKS_ENTRY,
    RANK_DIFF16_ENTRY,
];

/// How a kernel names a 16-bit dtype (`FP_DTYPE_*`); f32 kernels take none.
pub const fn dtype_code(d: Dtype) -> u32 {
    match d {
        Dtype::F32 => 0,
        Dtype::Bf16 => 1,
        Dtype::F16 => 2,
    }
}

/// The macro naming a distribution's device code. An exhaustive match: a
/// new distribution does not compile until it has a name here, and the
/// test `every_distribution_has_a_device_case` then asks for its `case` in
/// `generate.cu` (whose `default:` traps).
pub const fn distribution_macro(d: Distribution) -> &'static str {
    match d {
        Distribution::MixedMagnitude => "FP_DIST_MIXED_MAGNITUDE",
        Distribution::Uniform => "FP_DIST_UNIFORM",
        Distribution::Cancellation => "FP_DIST_CANCELLATION",
        Distribution::SubnormalHeavy => "FP_DIST_SUBNORMAL_HEAVY",
        Distribution::Specials => "FP_DIST_SPECIALS",
        Distribution::ExactIntegers => "FP_DIST_EXACT_INTEGERS",
    }
}

/// One generated `#define`: the macro and its value as a Rust integer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Define {
    pub name: &'static str,
    pub value: u64,
    /// The C type the literal must have.
    pub ty: CType,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CType {
    /// `int` (a small non-negative count).
    Int,
    /// `unsigned int`: suffix `u`.
    U32,
    /// `unsigned long long`: suffix `ULL`.
    U64,
}

impl Define {
    /// The C literal: decimal for `int`, hex with its suffix otherwise.
    pub fn literal(&self) -> String {
        match self.ty {
            CType::Int => format!("{}", self.value),
            CType::U32 => format!("{:#X}u", self.value),
            CType::U64 => format!("{:#X}ULL", self.value),
        }
    }
}

/// Every constant the device programs share with Rust.
pub fn defines() -> Vec<Define> {
    let mut out = vec![
        Define {
            name: "FP_STACK",
            value: TREE_STACK as u64,
            ty: CType::Int,
        },
        Define {
            name: "FP_ADD_OP",
            value: TREE_ADD as u64,
            ty: CType::U32,
        },
        Define {
            name: "FP_GAMMA",
            value: data::GAMMA,
            ty: CType::U64,
        },
        Define {
            name: "FP_MIX64_M1",
            value: data::MIX64_M1,
            ty: CType::U64,
        },
        Define {
            name: "FP_MIX64_M2",
            value: data::MIX64_M2,
            ty: CType::U64,
        },
        Define {
            name: "FP_CANONICAL_NAN",
            value: data::CANONICAL_NAN_BITS as u64,
            ty: CType::U32,
        },
    ];
    out.extend(data::ALL_DISTRIBUTIONS.iter().map(|&d| Define {
        name: distribution_macro(d),
        value: d.code() as u64,
        ty: CType::U32,
    }));
    out.extend([
        Define {
            name: "FP_DTYPE_BF16",
            value: dtype_code(Dtype::Bf16) as u64,
            ty: CType::U32,
        },
        Define {
            name: "FP_DTYPE_F16",
            value: dtype_code(Dtype::F16) as u64,
            ty: CType::U32,
        },
    ]);
    out
}

/// The lines prepended to every device program.
pub fn prelude() -> String {
    let mut s = String::from("// Generated by foldprint from its Rust constants.\n");
    for d in defines() {
        s.push_str(&format!("#define {} {}\n", d.name, d.literal()));
    }
    s.push('\n');
    s
}

/// Which fold kernel implementation runs. Both give identical bits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Default, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum KernelVariant {
    /// One thread per element, scalar loads, 64-bit indices: the shape of the
    /// upstream seed reducer (named `seed` on the command line and in reports).
    #[value(name = "seed")]
    PerElement,
    /// Grid-stride, float4 loads/stores on the aligned body, scalar edges.
    #[default]
    Fast,
}

impl KernelVariant {
    pub const ALL: [KernelVariant; 2] = [KernelVariant::PerElement, KernelVariant::Fast];
    pub const fn name(self) -> &'static str {
        match self {
            KernelVariant::PerElement => "seed",
            KernelVariant::Fast => "fast",
        }
    }
}

impl fmt::Display for KernelVariant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The per-element combination a fold kernel applies.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FoldMode {
    Fixed,
    Order,
    Tree,
}

impl FoldMode {
    pub const ALL: [FoldMode; 3] = [FoldMode::Fixed, FoldMode::Order, FoldMode::Tree];
}

/// The `extern "C"` kernel of `fold.cu` for a mode and variant.
pub const fn fold_entry(mode: FoldMode, variant: KernelVariant) -> &'static str {
    match (mode, variant) {
        (FoldMode::Fixed, KernelVariant::PerElement) => "fp_fold_fixed_seed",
        (FoldMode::Order, KernelVariant::PerElement) => "fp_fold_order_seed",
        (FoldMode::Tree, KernelVariant::PerElement) => "fp_fold_tree_seed",
        (FoldMode::Fixed, KernelVariant::Fast) => "fp_fold_fixed_fast",
        (FoldMode::Order, KernelVariant::Fast) => "fp_fold_order_fast",
        (FoldMode::Tree, KernelVariant::Fast) => "fp_fold_tree_fast",
    }
}

/// The 16-bit kernel of `fold.cu` for a mode and variant (bf16 and f16;
/// the dtype is an argument).
pub const fn fold_entry16(mode: FoldMode, variant: KernelVariant) -> &'static str {
    match (mode, variant) {
        (FoldMode::Fixed, KernelVariant::PerElement) => "fp_fold_fixed_seed16",
        (FoldMode::Order, KernelVariant::PerElement) => "fp_fold_order_seed16",
        (FoldMode::Tree, KernelVariant::PerElement) => "fp_fold_tree_seed16",
        (FoldMode::Fixed, KernelVariant::Fast) => "fp_fold_fixed_fast16",
        (FoldMode::Order, KernelVariant::Fast) => "fp_fold_order_fast16",
        (FoldMode::Tree, KernelVariant::Fast) => "fp_fold_tree_fast16",
    }
}

/// Every kernel of `fold.cu` (modes x variants, float32 then 16-bit).
pub fn fold_entries() -> Vec<&'static str> {
    let pairs = || {
        FoldMode::ALL
            .iter()
            .flat_map(|&m| KernelVariant::ALL.iter().map(move |&v| (m, v)))
    };
    pairs()
        .map(|(m, v)| fold_entry(m, v))
        .chain(pairs().map(|(m, v)| fold_entry16(m, v)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Read a C integer literal back (decimal, or hex with a u/ULL suffix).
    fn parse_literal(text: &str) -> u64 {
        let t = text.trim_end_matches("ULL").trim_end_matches('u');
        match t.strip_prefix("0x") {
            Some(h) => u64::from_str_radix(h, 16).unwrap(),
            None => t.parse().unwrap(),
        }
    }

    /// The prelude's text, parsed as a C preprocessor would see it.
    fn parsed_prelude() -> Vec<(String, u64)> {
        prelude()
            .lines()
            .filter_map(|l| l.strip_prefix("#define "))
            .map(|l| {
                let (name, value) = l.split_once(' ').unwrap();
                (name.to_string(), parse_literal(value))
            })
            .collect()
    }

    #[test]
    fn emitted_defines_equal_the_rust_constants() {
        let got = parsed_prelude();
        let want: Vec<(String, u64)> = vec![
            ("FP_STACK".into(), TREE_STACK as u64),
            ("FP_ADD_OP".into(), u32::MAX as u64),
            ("FP_GAMMA".into(), data::GAMMA),
            ("FP_MIX64_M1".into(), data::MIX64_M1),
            ("FP_MIX64_M2".into(), data::MIX64_M2),
            ("FP_CANONICAL_NAN".into(), 0x7FC0_0000),
            ("FP_DIST_MIXED_MAGNITUDE".into(), 0),
            ("FP_DIST_UNIFORM".into(), 1),
            ("FP_DIST_CANCELLATION".into(), 2),
            ("FP_DIST_SUBNORMAL_HEAVY".into(), 3),
            ("FP_DIST_SPECIALS".into(), 4),
            ("FP_DIST_EXACT_INTEGERS".into(), 5),
            ("FP_DTYPE_BF16".into(), 1),
            ("FP_DTYPE_F16".into(), 2),
        ];
        assert_eq!(got, want);
        // The text is exactly what the kernels expect, suffixes included.
        assert!(prelude().contains("#define FP_ADD_OP 0xFFFFFFFFu\n"));
        assert!(prelude().contains("#define FP_STACK 40\n"));
        assert!(prelude().contains("#define FP_GAMMA 0x9E3779B97F4A7C15ULL\n"));
        // The mixer built from the emitted multipliers is the crate's.
        let m = |z: u64| {
            let v = |n: &str| got.iter().find(|(k, _)| k == n).unwrap().1;
            let z = (z ^ (z >> 30)).wrapping_mul(v("FP_MIX64_M1"));
            let z = (z ^ (z >> 27)).wrapping_mul(v("FP_MIX64_M2"));
            z ^ (z >> 31)
        };
        for z in [0u64, 1, 0x0123_4567_89AB_CDEF, u64::MAX] {
            assert_eq!(m(z), data::mix64(z));
        }
    }

    #[test]
    fn distribution_codes_are_distinct_and_dense() {
        let mut codes: Vec<u32> = data::ALL_DISTRIBUTIONS.iter().map(|d| d.code()).collect();
        codes.sort_unstable();
        let dense: Vec<u32> = (0..data::ALL_DISTRIBUTIONS.len() as u32).collect();
        assert_eq!(codes, dense);
    }

    #[test]
    fn every_distribution_has_a_device_case() {
        for d in data::ALL_DISTRIBUTIONS {
            let label = format!("case {}:", distribution_macro(d));
            assert_eq!(
                GENERATOR_CU.matches(&label).count(),
                1,
                "generate.cu needs exactly one `{label}`"
            );
        }
        // An unknown code traps rather than falling into a distribution.
        let default = GENERATOR_CU
            .rsplit_once("    default:")
            .expect("the distribution switch has a default")
            .1;
        assert!(default.trim_start().starts_with("// A code"), "{default}");
        assert!(default.contains("__trap();"));
    }

    /// The numbers live in Rust only: the `.cu` files name them, never
    /// spell them, and define none of the generated macros themselves.
    #[test]
    fn cuda_sources_spell_no_shared_number() {
        for (file, text) in [
            ("generate.cu", GENERATOR_CU),
            ("fold.cu", FOLD_CU),
            ("dtype.cuh", DTYPE_CUH),
            ("fold16_trials.cu", FOLD16_TRIALS_CU),
        ] {
            let upper = text.to_uppercase().replace('_', "");
            for d in defines() {
                assert!(
                    !text.contains(&format!("#define {}", d.name)),
                    "{file} defines {} itself",
                    d.name
                );
                if d.ty == CType::U64 {
                    let hex = format!("{:X}", d.value);
                    assert!(!upper.contains(&hex), "{file} spells {} ({hex})", d.name);
                }
            }
            assert!(!upper.contains("0XFFFFFFFFU"), "{file} spells FP_ADD_OP");
        }
        assert!(FOLD_CU.contains("V st[FP_STACK];"));
        assert!(FOLD_CU.contains("op == FP_ADD_OP"));
    }

    #[test]
    fn programs_are_prelude_plus_file() {
        let dtypes = format!("#line 1 \"dtype.cuh\"\n{DTYPE_CUH}");
        assert_eq!(
            *FOLD_SRC,
            prelude() + &dtypes + "#line 1 \"fold.cu\"\n" + FOLD_CU
        );
        assert_eq!(
            *GENERATOR_SRC,
            prelude() + &dtypes + "#line 1 \"generate.cu\"\n" + GENERATOR_CU
        );
        assert!(!FOLD_SRC.contains('\0') && !GENERATOR_SRC.contains('\0'));
    }

    #[test]
    fn fold_entries_are_the_kernels_of_fold_cu() {
        let entries = fold_entries();
        assert_eq!(entries.len(), 12);
        for e in &entries {
            assert_eq!(
                entries.iter().filter(|x| *x == e).count(),
                1,
                "{e} listed twice"
            );
            assert!(
                FOLD_CU.contains(&format!("FP_FOLD_ENTRY({e}, "))
                    || FOLD_CU.contains(&format!("FP_FOLD16_ENTRY({e}, ")),
                "{e}"
            );
        }
        // Every trial is a kernel of fold16_trials.cu, and every kernel there
        // a trial; each names its elements per thread (`_nN_`).
        let kernels = FOLD16_TRIALS_CU.matches("\nFP_FOLD16_TRIAL(").count()
            + FOLD16_TRIALS_CU.matches("\n    fp_fold16_before(").count();
        assert_eq!(kernels, FOLD16_TRIALS.len());
        for t in FOLD16_TRIALS {
            assert!(
                FOLD16_TRIALS_CU.contains(&format!("FP_FOLD16_TRIAL({}, ", t.entry))
                    || FOLD16_TRIALS_CU.contains(&format!("\n    {}(", t.entry)),
                "{}",
                t.entry
            );
            let n = t
                .entry
                .split("_n")
                .nth(1)
                .map(|r| r.split('_').next().unwrap());
            assert_eq!(
                n.unwrap_or("8"),
                t.elems_per_thread.to_string(),
                "{}",
                t.entry
            );
        }
        assert!(FOLD16_TRIALS_SRC.starts_with(FOLD_SRC.as_str()));
        assert_eq!(FOLD_CU.matches("\nFP_FOLD_ENTRY(").count(), 6);
        assert_eq!(FOLD_CU.matches("\nFP_FOLD16_ENTRY(").count(), 6);
        for e in GENERATOR_ENTRIES {
            assert!(GENERATOR_CU.contains(&format!("void {e}(")), "{e}");
        }
        for e in RANK_CHECK_ENTRIES {
            assert!(RANK_CHECK_CU.contains(&format!("void {e}(")), "{e}");
        }
    }
}
