//! Regenerates tests/data/generator-vectors.tsv (the committed test vectors
//! of docs/SPEC.md): `cargo run --example test_vectors > tests/data/generator-vectors.tsv`.

use foldprint::data::{value, ALL_DISTRIBUTIONS};

fn main() {
    println!("# distribution\tseed\trank\tarena\tindex\tbits");
    let seeds = [0u64, 1, 0xDEAD_BEEF, u64::MAX >> 1];
    let coords = [
        (0u32, 0u32, 0u64),
        (1, 0, 1),
        (2, 1, 7),
        (3, 0, 4098),
        (7, 2, 1 << 31),
        (63, 0, (1 << 40) + 3),
    ];
    for d in ALL_DISTRIBUTIONS {
        for &seed in &seeds {
            for &(rank, arena, index) in &coords {
                let bits = value(d, seed, rank, arena, index).to_bits();
                println!("{d}\t{seed}\t{rank}\t{arena}\t{index}\t{bits:08x}");
            }
        }
    }
}
