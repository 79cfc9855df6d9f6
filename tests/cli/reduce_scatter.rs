//! `collective = "reduce-scatter"` on the CPU oracle: rank r keeps shard r
//! of the shard plan; the report's arena digest is over the shards in rank
//! order, which for fixed-order is the all-reduce's digest (the built-in
//! cross-check); `expect` may be one file per rank, each holding its shard.

use crate::common::rank_files::{self, T};
use crate::common::{fp, run_cpu, run_outputs, write, RunOutputs};
use serde_json::Value;
use sha2::Digest;
use std::collections::HashMap;
use std::path::Path;

fn report(path: &Path) -> Value {
    serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap()
}

fn sha(bytes: &[u8]) -> String {
    hex(&sha2::Sha256::digest(bytes))
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// Shard r of `n` elements over `world` ranks (docs/SPEC.md §2), written
/// out here from the rule: the remainder goes to the lowest ranks.
fn shard(n: usize, world: usize, r: usize) -> std::ops::Range<usize> {
    let (base, extra) = (n / world, n % world);
    let start = r * base + r.min(extra);
    start..start + base + usize::from(r < extra)
}

/// Every case of the report by key.
fn by_key(r: &Value) -> HashMap<String, Value> {
    r["cases"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| (c["key"].as_str().unwrap().to_string(), c.clone()))
        .collect()
}

const BOTH: &str = r#"
name = "rs"
[[sweep]]
id = "x"
world = [3, 7]
arenas = [[1001, 7, 0, 64]]
seed = [5]
mean = [false, true]
collective = ["all-reduce", "reduce-scatter"]
contract = ["fixed-order", "arrival-order", "pairwise-tree"]
order = ["ascending", "descending"]
"#;

#[test]
fn a_fixed_order_reduce_scatter_is_the_all_reduce_cut_into_shards() {
    let dir = tempfile::tempdir().unwrap();
    let exp = write(dir.path(), "rs.toml", BOTH);
    let RunOutputs { report: out, dump } = run_outputs(dir.path(), &exp, "r");
    let r = report(&out);
    let cases = by_key(&r);
    let all = r["cases"].as_array().unwrap();
    assert_eq!(all.len(), 2 * 2 * 2 * 3 * 2);
    let mut checked = 0;
    for c in all.iter().filter(|c| c["params"]["collective"].is_null()) {
        let key = c["key"].as_str().unwrap();
        let (contract, rest) = key.split_once('/').unwrap();
        let scatter_key = format!("{contract}/reduce-scatter/{rest}");
        let s = &cases[&scatter_key];
        assert_eq!(s["params"]["collective"], "reduce-scatter");
        let world = c["params"]["world"].as_u64().unwrap() as usize;
        for (a, (ca, sa)) in c["arenas"]
            .as_array()
            .unwrap()
            .iter()
            .zip(s["arenas"].as_array().unwrap())
            .enumerate()
        {
            // No rank holds the whole arena; every rank holds a shard.
            assert_eq!(sa["rank_sha256"].as_array().unwrap().len(), 0);
            assert_eq!(sa["ranks_identical"], true);
            assert!(ca.get("shard_sha256").is_none(), "{ca}");
            let shards = sa["shard_sha256"].as_array().unwrap();
            assert_eq!(shards.len(), world);
            // The cross-check: the gathered digest is the all-reduce's.
            // Fixed-order and the tree fold every shard in the same order
            // as the all-reduce does; arrival-order too, in the same
            // delivery order.
            assert_eq!(sa["sha256"], ca["sha256"], "{scatter_key} arena {a}");
            assert_eq!(sa["chunk_sha256"], ca["chunk_sha256"]);
            // Rank r's shard digest is the all-reduce's values of shard r.
            let id = c["id"].as_str().unwrap().replace([',', '[', ']'], "_");
            let bytes = std::fs::read(dump.join(format!("rs.{id}.a{a}.bin"))).unwrap();
            let n = bytes.len() / 4;
            let whole: Vec<String> = (0..world)
                .map(|r| {
                    let s = shard(n, world, r);
                    sha(&bytes[s.start * 4..s.end * 4])
                })
                .collect();
            let got: Vec<&str> = shards.iter().map(|d| d.as_str().unwrap()).collect();
            assert_eq!(got, whole, "{scatter_key} arena {a}");
            // Negative control: the shards in reverse rank order make
            // another arena (where shards differ), which the digest sees.
            if n >= world && world > 1 {
                let mut reversed = Vec::new();
                for r in (0..world).rev() {
                    let s = shard(n, world, r);
                    reversed.extend_from_slice(&bytes[s.start * 4..s.end * 4]);
                }
                assert_ne!(sha(&reversed), sa["sha256"].as_str().unwrap());
            }
            checked += 1;
        }
    }
    assert_eq!(checked, 24 * 4);
    // Negative control of the comparison: arrival-order in descending
    // order folds in another order than fixed-order, so its reduce-scatter
    // digest is not the fixed-order all-reduce's.
    for w in [3, 7] {
        for mean in ["sum", "mean"] {
            let fixed = &cases
                [&format!("fixed-order/{mean}/W{w}/n1001+7+0+64/mixed-magnitude/s5/ascending")];
            let arrival = &cases[&format!(
                "arrival-order/reduce-scatter/{mean}/W{w}/n1001+7+0+64/mixed-magnitude/s5/descending"
            )];
            assert_ne!(
                fixed["arenas"][0]["sha256"], arrival["arenas"][0]["sha256"],
                "W{w} {mean}"
            );
        }
    }
    // Reduce-scatter cases form their own invariance groups.
    let groups: Vec<&str> = r["groups"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| g["key"].as_str().unwrap())
        .collect();
    assert!(groups.contains(&"fixed-order/reduce-scatter/sum/W7/n1001+7+0+64/mixed-magnitude/s5"));
    assert!(groups.contains(&"fixed-order/sum/W7/n1001+7+0+64/mixed-magnitude/s5"));
}

#[test]
fn a_report_with_a_forged_shard_digest_or_rank_copy_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let exp = write(
        dir.path(),
        "rs.toml",
        "name = \"rs\"\n[[case]]\nid = \"c\"\nworld = 5\narenas = [3, 10]\ncollective = \"reduce-scatter\"\n",
    );
    let good = dir.path().join("good.json");
    let o = run_cpu(&exp, &good);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    fp().arg("compare").arg(&good).arg(&good).assert().success();
    let v = report(&good);
    let empty = sha(b"");
    // Ranks 3 and 4 hold empty shards of the 3-element arena.
    assert_eq!(v["cases"][0]["arenas"][0]["shard_sha256"][3], empty);
    assert_ne!(v["cases"][0]["arenas"][0]["shard_sha256"][2], empty);
    type Forge = fn(&mut Value);
    let forged: [(Forge, &str); 4] = [
        (
            |v| v["cases"][0]["arenas"][0]["shard_sha256"][4] = "ab".repeat(32).into(),
            "rank 4's shard is empty, but its digest is not SHA-256 of no bytes",
        ),
        (
            |v| {
                v["cases"][0]["arenas"][1]["shard_sha256"]
                    .as_array_mut()
                    .unwrap()
                    .pop();
            },
            "arena 1: 4 shard digests for W=5",
        ),
        (
            |v| {
                let d = v["cases"][0]["arenas"][1]["sha256"].clone();
                v["cases"][0]["arenas"][1]["rank_sha256"] = Value::Array(vec![d; 5]);
            },
            "5 rank digests, but no rank of a reduce-scatter holds the whole arena",
        ),
        (
            |v| v["cases"][0]["arenas"][1]["ranks_identical"] = false.into(),
            "ranks_identical is false but the rank digests say true",
        ),
    ];
    for (forge, want) in forged {
        let mut bad = v.clone();
        forge(&mut bad);
        let p = dir.path().join("bad.json");
        std::fs::write(&p, serde_json::to_vec(&bad).unwrap()).unwrap();
        let o = fp().arg("compare").arg(&good).arg(&p).output().unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{err}");
        assert!(err.contains(want), "{want}: {err}");
    }
}

/// W = 4 rank files (`b` of 7 elements, `w` of 3 x 5), and each rank's
/// shard of their rank-order sums in `out/rank{r}.safetensors`; returns
/// the sums.
fn per_rank_files(dir: &Path) -> Vec<Vec<f32>> {
    let addends = rank_files::grads(dir, 4, 5);
    let sums: Vec<Vec<f32>> = addends
        .iter()
        .map(|t| rank_files::rank_order_sum(t))
        .collect();
    std::fs::create_dir_all(dir.join("out")).unwrap();
    for r in 0..4 {
        write_shard(dir, r, &sums, |_, _| {});
    }
    sums
}

/// Rank r's expect file, its shards of `sums` passed through `edit`
/// (tensor index, shard) first.
fn write_shard(dir: &Path, r: usize, sums: &[Vec<f32>], edit: impl Fn(usize, &mut Vec<f32>)) {
    write_shard_as(dir, r, sums, T::f32, edit);
}

/// [`write_shard`] for elements `tensor` stores (f32 values, bf16 bits).
fn write_shard_as<E: Clone>(
    dir: &Path,
    r: usize,
    sums: &[Vec<E>],
    tensor: fn(&str, &[usize], &[E]) -> T,
    edit: impl Fn(usize, &mut Vec<E>),
) {
    let tensors: Vec<T> = ["b", "w"]
        .iter()
        .enumerate()
        .map(|(t, name)| {
            let mut s = sums[t][shard(sums[t].len(), 4, r)].to_vec();
            edit(t, &mut s);
            tensor(name, &[s.len()], &s)
        })
        .collect();
    rank_files::write_safetensors(&dir.join(format!("out/rank{r}.safetensors")), &tensors);
}

const PER_RANK: &str = r#"
name = "pr"
[[case]]
id = "c"
addends = "rank{rank}.safetensors"
collective = "reduce-scatter"
expect = "out/rank{rank}.safetensors"
"#;

#[test]
fn each_ranks_expect_file_is_compared_with_its_shard() {
    let dir = tempfile::tempdir().unwrap();
    let sums = per_rank_files(dir.path());
    let exp = write(dir.path(), "pr.toml", PER_RANK);
    let out = dir.path().join("r.json");
    let run = || {
        fp().args(["run", "--backend", "cpu", "--out"])
            .arg(&out)
            .arg(&exp)
            .output()
            .unwrap()
    };
    let o = run();
    let stdout = String::from_utf8_lossy(&o.stdout).into_owned();
    assert_eq!(o.status.code(), Some(0), "{stdout}");
    for r in 0..4 {
        assert!(
            stdout.contains(&format!(
                "expect: case `c` equals out/rank{r}.safetensors bit for bit (2 arenas)"
            )),
            "{stdout}"
        );
    }
    let v = report(&out);
    let ranks = v["cases"][0]["expect_ranks"].as_array().unwrap();
    assert_eq!(ranks.len(), 4);
    assert!(v["cases"][0].get("expect").is_none());
    // Shards of 7 and 15 over 4 ranks: 2,2,2,1 and 4,4,4,3.
    let lens: Vec<(u64, u64)> = ranks
        .iter()
        .map(|e| {
            (
                e["arenas"][0]["len"].as_u64().unwrap(),
                e["arenas"][1]["len"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(lens, [(2, 4), (2, 4), (2, 4), (1, 3)]);

    // Negative control: one element of rank 2's shard of `w`, one ULP off,
    // is found on rank 2's file, at its index in that file.
    write_shard(dir.path(), 2, &sums, |t, s| {
        if t == 1 {
            s[1] = f32::from_bits(s[1].to_bits() + 1);
        }
    });
    let o = run();
    let stdout = String::from_utf8_lossy(&o.stdout).into_owned();
    assert_eq!(o.status.code(), Some(1), "{stdout}");
    assert!(
        stdout.contains("differs from out/rank2.safetensors: 1 element(s), up to 1 ULP"),
        "{stdout}"
    );
    let v = report(&out);
    let ranks = v["cases"][0]["expect_ranks"].as_array().unwrap();
    let equal: Vec<bool> = ranks
        .iter()
        .map(|e| e["equal"].as_bool().unwrap())
        .collect();
    assert_eq!(equal, [true, true, false, true]);
    assert_eq!(ranks[2]["path"], "out/rank2.safetensors");
    assert_eq!(ranks[2]["arenas"][1]["differing"], 1);
    assert_eq!(ranks[2]["arenas"][1]["first"][0]["index"], 1);
    assert_eq!(
        v["summary"]["differs_from_expect"][0],
        "case `c`: differs from expect out/rank2.safetensors: arena 1: 1 of 4 elements, up to 1 ULP"
    );
    // The report reads back, and a forged per-rank verdict is refused.
    fp().arg("compare").arg(&out).arg(&out).assert().success();
    let mut forged = v.clone();
    forged["cases"][0]["expect_ranks"][2]["arenas"][1]["differing"] = 0.into();
    let p = dir.path().join("forged.json");
    std::fs::write(&p, serde_json::to_vec(&forged).unwrap()).unwrap();
    let o = fp().arg("compare").arg(&out).arg(&p).output().unwrap();
    assert_eq!(o.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("rank 2's expect.arenas[1]"),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );

    // A shard of the wrong length is refused before any work, naming the
    // rank and where the experiment says `expect`.
    write_shard(dir.path(), 1, &sums, |t, s| {
        if t == 0 {
            s.pop();
        }
    });
    let o = run();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(
        err.contains("pr.toml:7:10: case `c`: field `expect`: rank 1's shard: "),
        "{err}"
    );
    assert!(
        err.contains("tensor `b` has 1 elements, the arena 2"),
        "{err}"
    );
}

#[test]
fn per_rank_expect_files_on_an_all_reduce_and_an_unknown_collective_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    per_rank_files(dir.path());
    let exp = write(
        dir.path(),
        "pr.toml",
        &PER_RANK.replace("collective = \"reduce-scatter\"\n", ""),
    );
    let o = fp()
        .args(["run", "--backend", "cpu"])
        .arg(&exp)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(
        err.contains("pr.toml:6:10: case `c`: field `expect`: `{rank}` names one file per rank"),
        "{err}"
    );
    // Control: the same files under a reduce-scatter pass.
    let exp = write(dir.path(), "pr.toml", PER_RANK);
    fp().args(["run", "--backend", "cpu"])
        .arg(&exp)
        .assert()
        .success();

    let exp = write(
        dir.path(),
        "bad.toml",
        "name = \"b\"\n[[case]]\nid = \"c\"\nworld = 3\narenas = [4]\ncollective = \"reduce_scatter\"\n",
    );
    let o = fp()
        .args(["run", "--backend", "cpu"])
        .arg(&exp)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(
        err.contains(
            "bad.toml:6:14: case `c`: field `collective`: unknown collective `reduce_scatter` \
             (expected all-reduce or reduce-scatter)"
        ),
        "{err}"
    );
}

/// bf16 cases of both collectives, long enough (two chunks and a bit) for
/// some bf16 sums to move with the order after the one rounding; an f32
/// twin of each, and arrival-order in descending order as controls.
const BF16: &str = r#"
name = "rs16"
[defaults]
arenas = [131075, 7, 0]
seed = 1

[[sweep]]
id = "x"
world = [3, 7]
mean = [false, true]
dtype = ["bf16", "f32"]
collective = ["all-reduce", "reduce-scatter"]

[[sweep]]
id = "arrival"
world = [3, 7]
mean = [false, true]
dtype = ["bf16"]
contract = ["arrival-order"]
order = ["descending"]
collective = ["reduce-scatter"]
"#;

#[test]
fn a_bf16_reduce_scatter_gathers_the_bf16_all_reduce() {
    let dir = tempfile::tempdir().unwrap();
    let exp = write(dir.path(), "rs16.toml", BF16);
    let RunOutputs { report: out, dump } = run_outputs(dir.path(), &exp, "r");
    let r = report(&out);
    let cases = by_key(&r);
    assert_eq!(cases.len(), 2 * 2 * 2 * 2 + 4);
    let mut checked = 0;
    for w in [3usize, 7] {
        for mean in ["sum", "mean"] {
            let key = |collective: &str, dtype: &str| {
                format!("fixed-order{collective}/{mean}/W{w}/n131075+7+0{dtype}/mixed-magnitude/s1/ascending")
            };
            let all = &cases[&key("", "/bf16")];
            let scatter = &cases[&key("/reduce-scatter", "/bf16")];
            let f32_scatter = &cases[&key("/reduce-scatter", "")];
            assert_eq!(scatter["params"]["dtype"], "bf16");
            assert_eq!(scatter["params"]["collective"], "reduce-scatter");
            // The data sees the order in bf16 too, or the controls below
            // would say nothing.
            assert!(all["sensitivity"]["changed"].as_u64().unwrap() > 0, "{all}");
            let id = all["id"].as_str().unwrap().replace([',', '[', ']'], "_");
            for a in 0..3 {
                let (aa, sa) = (&all["arenas"][a], &scatter["arenas"][a]);
                // The cross-check: the gathered digest and its chunks are
                // the bf16 all-reduce's.
                assert_eq!(sa["sha256"], aa["sha256"], "W{w} {mean} arena {a}");
                assert_eq!(sa["chunk_sha256"], aa["chunk_sha256"]);
                assert_eq!(sa["chunk_root"], aa["chunk_root"]);
                assert_eq!(sa["chunk_elems"], 65536);
                // Each shard digest is over rank r's slice of the bf16
                // all-reduce's dump: 2 bytes an element.
                let bytes = std::fs::read(dump.join(format!("rs16.{id}.a{a}.bin"))).unwrap();
                let n = bytes.len() / 2;
                assert_eq!(n as u64, aa["len"].as_u64().unwrap());
                let want: Vec<String> = (0..w)
                    .map(|r| {
                        let s = shard(n, w, r);
                        sha(&bytes[s.start * 2..s.end * 2])
                    })
                    .collect();
                let got: Vec<&str> = sa["shard_sha256"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|d| d.as_str().unwrap())
                    .collect();
                assert_eq!(got, want, "W{w} {mean} arena {a}");
                if n > 0 {
                    // Negative controls: the f32 reduce-scatter of the same
                    // data is other bytes, and so are bf16 shards gathered
                    // in reverse rank order.
                    assert_ne!(f32_scatter["arenas"][a]["sha256"], sa["sha256"]);
                    let mut reversed = Vec::new();
                    for r in (0..w).rev() {
                        let s = shard(n, w, r);
                        reversed.extend_from_slice(&bytes[s.start * 2..s.end * 2]);
                    }
                    if n >= w {
                        assert_ne!(sha(&reversed), sa["sha256"].as_str().unwrap());
                    }
                }
                checked += 1;
            }
            // Negative control of the comparison: a bf16 reduce-scatter
            // folded in another order does not gather to the all-reduce.
            let arrival = &cases[&format!(
                "arrival-order/reduce-scatter/{mean}/W{w}/n131075+7+0/bf16/mixed-magnitude/s1/descending"
            )];
            assert_ne!(
                arrival["arenas"][0]["sha256"], all["arenas"][0]["sha256"],
                "W{w} {mean}"
            );
        }
    }
    assert_eq!(checked, 2 * 2 * 3);
}

/// W = 4 bf16 rank files of two tensors; returns each tensor's bf16
/// rank-order result (the float32 sum rounded once).
fn bf16_rank_files(dir: &Path) -> Vec<Vec<u16>> {
    let lens = [7usize, 15];
    let mut sums = Vec::new();
    let mut ranks: Vec<Vec<T>> = (0..4).map(|_| Vec::new()).collect();
    for (t, (&n, name)) in lens.iter().zip(["b", "w"]).enumerate() {
        let addends: Vec<Vec<u16>> = (0..4)
            .map(|r| rank_files::mixed16(rank_files::Dt::Bf16, 13, r, t as u32, n))
            .collect();
        sums.push(rank_files::rank_order_sum16(rank_files::Dt::Bf16, &addends));
        for (r, a) in addends.iter().enumerate() {
            ranks[r].push(T::bf16(name, &[n], a));
        }
    }
    for (r, tensors) in ranks.iter().enumerate() {
        rank_files::write_safetensors(&dir.join(format!("rank{r}.safetensors")), tensors);
    }
    std::fs::create_dir_all(dir.join("out")).unwrap();
    for r in 0..4 {
        write_bf16_shard(dir, r, &sums, |_, _| ());
    }
    sums
}

fn write_bf16_shard(dir: &Path, r: usize, sums: &[Vec<u16>], edit: impl Fn(usize, &mut Vec<u16>)) {
    write_shard_as(dir, r, sums, T::bf16, edit);
}

#[test]
fn bf16_per_rank_expect_files_are_compared_in_bf16() {
    let dir = tempfile::tempdir().unwrap();
    let sums = bf16_rank_files(dir.path());
    let exp = write(dir.path(), "pr.toml", PER_RANK);
    let out = dir.path().join("r.json");
    let run = || {
        fp().args(["run", "--backend", "cpu", "--out"])
            .arg(&out)
            .arg(&exp)
            .output()
            .unwrap()
    };
    let o = run();
    let stdout = String::from_utf8_lossy(&o.stdout).into_owned();
    assert_eq!(o.status.code(), Some(0), "{stdout}");
    let v = report(&out);
    assert_eq!(v["cases"][0]["params"]["dtype"], "bf16");
    assert!(v["cases"][0]["key"]
        .as_str()
        .unwrap()
        .starts_with("fixed-order/reduce-scatter/sum/W4/n7+15/bf16/files:"));
    let equal: Vec<bool> = v["cases"][0]["expect_ranks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["equal"].as_bool().unwrap())
        .collect();
    assert_eq!(equal, [true; 4]);

    // Negative control: one bf16 step off in rank 3's shard of `b` is one
    // ULP of bf16, found on rank 3's file.
    write_bf16_shard(dir.path(), 3, &sums, |t, s| {
        if t == 0 {
            s[0] += 1;
        }
    });
    let o = run();
    let stdout = String::from_utf8_lossy(&o.stdout).into_owned();
    assert_eq!(o.status.code(), Some(1), "{stdout}");
    let v = report(&out);
    assert_eq!(
        v["summary"]["differs_from_expect"][0],
        "case `c`: differs from expect out/rank3.safetensors: arena 0: 1 of 1 elements, up to 1 ULP of bf16"
    );

    // A shard written in float32 is refused: a bf16 result is compared in
    // bf16, never widened to be compared.
    let tensors: Vec<T> = ["b", "w"]
        .iter()
        .enumerate()
        .map(|(t, name)| {
            let s: Vec<f32> = sums[t][shard(sums[t].len(), 4, 1)]
                .iter()
                .map(|&h| rank_files::widen16(rank_files::Dt::Bf16, h))
                .collect();
            T::f32(name, &[s.len()], &s)
        })
        .collect();
    rank_files::write_safetensors(&dir.path().join("out/rank1.safetensors"), &tensors);
    let o = run();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(
        err.contains("case `c`: field `expect`: rank 1's shard: ")
            && err.contains("tensor `b` is f32, but the case reduces in bf16"),
        "{err}"
    );
}
