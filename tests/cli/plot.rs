//! `foldprint plot`: the ULP distances of a report's expect differences and
//! of two dump directories, drawn from real runs whose differences are
//! made by hand (so every bucket's count is known), and read back from the
//! SVG: panel titles, one bar per non-empty bucket, bar heights in the
//! counts' order, the axis labels. Equal runs give a "no differences"
//! picture; unusable paths exit 2.

use crate::common::rank_files::{self, narrow16, rank_order_sum16, Dt, T};
use crate::common::{fp, run_cpu, run_outputs, write};
use serde_json::Value;
use std::path::{Path, PathBuf};

const BAR_FILL: &str = "#3B6EA5";
const REST_FILL: &str = "#B54A4A";

/// The value of attribute `name` in an element's attribute text.
fn attr<'a>(el: &'a str, name: &str) -> Option<&'a str> {
    let at = el.find(&format!(" {name}=\""))? + name.len() + 3;
    el[at..].split('"').next()
}

/// The SVG's bars of `fill`, as (x, height), left to right.
fn bars(svg: &str, fill: &str) -> Vec<(f64, f64)> {
    let mut out: Vec<(f64, f64)> = svg
        .split("<rect")
        .skip(1)
        .map(|r| &r[..r.find("/>").unwrap()])
        .filter(|r| attr(r, "fill") == Some(fill))
        .map(|r| {
            let num = |n| attr(r, n).unwrap().parse::<f64>().unwrap();
            (num("x"), num("height"))
        })
        .collect();
    out.sort_by(|a, b| a.0.total_cmp(&b.0));
    out
}

/// Every `<text>` element's text.
fn texts(svg: &str) -> Vec<String> {
    svg.split("<text")
        .skip(1)
        .map(|t| {
            let body = &t[t.find('>').unwrap() + 1..t.find("</text>").unwrap()];
            body.trim().replace("&lt;", "<").replace("&amp;", "&")
        })
        .collect()
}

fn plot(inputs: &[&Path], out: &Path) -> (Option<i32>, String) {
    let o = fp()
        .arg("plot")
        .args(inputs)
        .arg("-o")
        .arg(out)
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    (o.status.code(), text)
}

/// Each float32 of `bits` moved `steps` units in the last place away from
/// zero (the values are finite and far from infinity).
fn away(bits: &mut [u32], steps: u32) {
    for b in bits {
        *b += steps;
    }
}

/// Bars' heights must rank as the counts do: equal where equal, taller
/// where more.
fn assert_heights_follow(heights: &[f64], counts: &[u64]) {
    assert_eq!(heights.len(), counts.len(), "{heights:?} for {counts:?}");
    for i in 0..counts.len() {
        for j in 0..counts.len() {
            let (h, c) = ((heights[i] - heights[j]), counts[i].cmp(&counts[j]));
            let ok = match c {
                std::cmp::Ordering::Greater => h > 0.5,
                std::cmp::Ordering::Less => h < -0.5,
                std::cmp::Ordering::Equal => h.abs() <= 1.0,
            };
            assert!(ok, "heights {heights:?} do not follow counts {counts:?}");
        }
    }
}

/// W = 3 float32 rank files (`b` [7], arena 0; `w` [3, 100], arena 1) and their rank-order
/// sum as the expect file, which the fixed-order contract meets.
fn grads_case(dir: &Path) -> (PathBuf, Vec<Vec<Vec<f32>>>) {
    let addends = rank_files::grads(dir, 3, 100);
    let exp = write(
        dir,
        "g.toml",
        "name = \"g\"\n[[case]]\nid = \"t\"\nworld = 3\naddends = \"rank{rank}.safetensors\"\n\
         expect = \"expected.safetensors\"\n",
    );
    (exp, addends)
}

#[test]
fn a_report_s_expect_differences_are_drawn_per_arena() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let (exp, addends) = grads_case(d);
    // Negative control: the expect file met, nothing to draw but that.
    let report = d.join("equal.json");
    let o = run_cpu(&exp, &report);
    assert_eq!(o.status.code(), Some(0), "{o:?}");
    let text = std::fs::read_to_string(&report).unwrap();
    assert!(!text.contains("ulp_histogram"), "an equal arena keeps none");
    let svg_path = d.join("equal.svg");
    let (code, said) = plot(&[&report], &svg_path);
    assert_eq!(code, Some(0), "{said}");
    let svg = std::fs::read_to_string(&svg_path).unwrap();
    assert!(texts(&svg).iter().any(|t| t.starts_with("no differences")));
    assert!(bars(&svg, BAR_FILL).is_empty() && bars(&svg, REST_FILL).is_empty());

    // `w`'s sum with 5 elements 1 ULP off, 3 by 3, 2 by 6, 1 by 700 and
    // one NaN: buckets 1, 2-3, 4-7, 512-1023, and the NaN bar.
    let mut w: Vec<u32> = rank_files::rank_order_sum(&addends[1])
        .iter()
        .map(|x| x.to_bits())
        .collect();
    let b = rank_files::rank_order_sum(&addends[0]);
    away(&mut w[0..5], 1);
    away(&mut w[10..13], 3);
    away(&mut w[20..22], 6);
    away(&mut w[40..41], 700);
    w[50] = 0x7FC0_0000;
    let w: Vec<f32> = w.into_iter().map(f32::from_bits).collect();
    rank_files::write_safetensors(
        &d.join("expected.safetensors"),
        &[T::f32("b", &[7], &b), T::f32("w", &[3, 100], &w)],
    );
    let report = d.join("drift.json");
    let o = run_cpu(&exp, &report);
    assert_eq!(o.status.code(), Some(1), "differs from expect: {o:?}");
    let v: Value = serde_json::from_slice(&std::fs::read(&report).unwrap()).unwrap();
    let arenas = &v["cases"][0]["expect"]["arenas"];
    assert_eq!(
        arenas[1]["ulp_histogram"],
        serde_json::json!([0, 5, 3, 2, 0, 0, 0, 0, 0, 0, 1]),
        "{arenas}"
    );
    assert_eq!(arenas[1]["differing"], 12);
    assert!(arenas[0].get("ulp_histogram").is_none(), "{arenas}");

    let svg_path = d.join("drift.svg");
    let (code, said) = plot(&[&report], &svg_path);
    assert_eq!(
        (code, said.contains("1 panel(s)")),
        (Some(0), true),
        "{said}"
    );
    let svg = std::fs::read_to_string(&svg_path).unwrap();
    let t = texts(&svg);
    assert!(
        t.contains(&"case `t` arena 1 `w`: 12 of 300 elements differ (4.000%)".to_string()),
        "{t:?}"
    );
    assert!(
        !t.iter().any(|x| x.contains("arena 0")),
        "b is equal: {t:?}"
    );
    for label in [
        "0",
        "1",
        "2-3",
        "4-7",
        "8-15",
        "512-1023",
        "NaN",
        "ULP distance, in f32 steps",
        "elements (log scale)",
        "10",
    ] {
        assert!(t.iter().any(|x| x == label), "no label `{label}` in {t:?}");
    }
    assert_eq!(t.iter().filter(|x| *x == "NaN").count(), 1, "{t:?}");
    let heights: Vec<f64> = bars(&svg, BAR_FILL).iter().map(|b| b.1).collect();
    assert_heights_follow(&heights, &[5, 3, 2, 1]);
    let nan = bars(&svg, REST_FILL);
    assert_eq!(nan.len(), 1, "{nan:?}");
    // The NaN bar (one element) as tall as the 512-1023 bar (one).
    assert!((nan[0].1 - heights[3]).abs() <= 1.0, "{nan:?} {heights:?}");
    // Each bar carries its count.
    for c in ["5", "3", "2"] {
        assert!(t.iter().any(|x| x == c), "{t:?}");
    }
}

#[test]
fn a_bf16_drift_is_counted_in_bf16_steps() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let n = 64;
    let ranks: Vec<Vec<u16>> = (0..3)
        .map(|r| rank_files::mixed16(Dt::Bf16, 5, r, 0, n))
        .collect();
    for (r, bits) in ranks.iter().enumerate() {
        rank_files::write_safetensors(
            &d.join(format!("bf{r}.safetensors")),
            &[T::bf16("g", &[n], bits)],
        );
    }
    let mut want = rank_order_sum16(Dt::Bf16, &ranks);
    // 4 elements 3 bf16 steps off (196,608 float32 steps each), 2 one step.
    for h in &mut want[..4] {
        *h = narrow16(Dt::Bf16, f32::from_bits(u32::from(*h + 3) << 16));
    }
    for h in &mut want[8..10] {
        *h += 1;
    }
    rank_files::write_safetensors(&d.join("want.safetensors"), &[T::bf16("g", &[n], &want)]);
    let exp = write(
        d,
        "h.toml",
        "name = \"h\"\n[[case]]\nid = \"c\"\nworld = 3\naddends = \"bf{rank}.safetensors\"\n\
         expect = \"want.safetensors\"\n",
    );
    let report = d.join("h.json");
    let o = run_cpu(&exp, &report);
    assert_eq!(o.status.code(), Some(1), "{o:?}");
    let svg_path = d.join("h.svg");
    let (code, said) = plot(&[&report], &svg_path);
    assert_eq!(code, Some(0), "{said}");
    let svg = std::fs::read_to_string(&svg_path).unwrap();
    let t = texts(&svg);
    assert!(
        t.contains(&"case `c` arena 0 `g`: 6 of 64 elements differ (9.375%)".to_string()),
        "{t:?}"
    );
    assert!(
        t.iter().any(|x| x == "ULP distance, in bf16 steps"),
        "{t:?}"
    );
    assert!(t.iter().any(|x| x == "2-3"), "{t:?}");
    // Control: counted in float32 steps, 3 bf16 steps would sit at 2^17.
    assert!(!t.iter().any(|x| x.starts_with("2^")), "{t:?}");
    let heights: Vec<f64> = bars(&svg, BAR_FILL).iter().map(|b| b.1).collect();
    assert_heights_follow(&heights, &[2, 4]);
    assert!(bars(&svg, REST_FILL).is_empty());
}

#[test]
fn two_dump_directories_are_drawn_from_their_files() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    rank_files::grads(d, 3, 100);
    let exp = write(
        d,
        "g.toml",
        "name = \"g\"\n[[case]]\nid = \"t\"\nworld = 3\naddends = \"rank{rank}.safetensors\"\n",
    );
    let (a, b) = (run_outputs(d, &exp, "a"), run_outputs(d, &exp, "b"));
    // Negative control: two equal runs.
    let svg_path = d.join("same.svg");
    let (code, said) = plot(&[&a.dump, &b.dump], &svg_path);
    assert_eq!(code, Some(0), "{said}");
    let svg = std::fs::read_to_string(&svg_path).unwrap();
    assert!(texts(&svg).iter().any(|t| t.starts_with("no differences")));
    assert!(bars(&svg, BAR_FILL).is_empty());

    // The largest dump file (`w`'s 300 elements): 6 elements 1 ULP off,
    // 2 by 9; its SHA256SUMS line made to match.
    let sums = std::fs::read_to_string(b.dump.join("SHA256SUMS")).unwrap();
    let name = sums
        .lines()
        .map(|l| l.split_once("  ").unwrap().1.to_string())
        .max_by_key(|n| std::fs::metadata(b.dump.join(n)).unwrap().len())
        .unwrap();
    let path = b.dump.join(&name);
    let mut bits: Vec<u32> = std::fs::read(&path)
        .unwrap()
        .chunks_exact(4)
        .map(|c| u32::from_le_bytes(c.try_into().unwrap()))
        .collect();
    assert_eq!(bits.len(), 300);
    away(&mut bits[0..6], 1);
    away(&mut bits[100..102], 9);
    let bytes: Vec<u8> = bits.iter().flat_map(|b| b.to_le_bytes()).collect();
    std::fs::write(&path, &bytes).unwrap();
    let hash = {
        use sha2::Digest;
        hex::encode(sha2::Sha256::digest(&bytes))
    };
    let sums: String = sums
        .lines()
        .map(|l| {
            if l.ends_with(&format!("  {name}")) {
                format!("{hash}  {name}\n")
            } else {
                format!("{l}\n")
            }
        })
        .collect();
    std::fs::write(b.dump.join("SHA256SUMS"), sums).unwrap();

    let svg_path = d.join("dumps.svg");
    let (code, said) = plot(&[&a.dump, &b.dump], &svg_path);
    assert_eq!(code, Some(0), "{said}");
    let svg = std::fs::read_to_string(&svg_path).unwrap();
    let t = texts(&svg);
    let title = format!("{name}: 8 of 300 elements differ (2.667%)");
    assert!(t.contains(&title), "{title} not in {t:?}");
    assert!(t.iter().any(|x| x == "8-15"), "{t:?}");
    let heights: Vec<f64> = bars(&svg, BAR_FILL).iter().map(|b| b.1).collect();
    assert_heights_follow(&heights, &[6, 2]);
    assert_eq!(
        t.iter().filter(|x| x.contains("elements differ")).count(),
        1
    );
}

#[test]
fn unusable_paths_and_inputs_exit_2_and_write_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    rank_files::grads(d, 3, 10);
    let exp = write(
        d,
        "g.toml",
        "name = \"g\"\n[[case]]\nid = \"t\"\nworld = 3\naddends = \"rank{rank}.safetensors\"\n",
    );
    let a = run_outputs(d, &exp, "a");
    let b = run_outputs(d, &exp, "b");
    let cases: [(Vec<&Path>, PathBuf, &str); 5] = [
        (
            vec![&a.report],
            d.join("no/such/dir/x.svg"),
            "cannot write there",
        ),
        (vec![&a.report], d.to_path_buf(), "cannot write there"),
        (
            vec![&a.dump, &b.dump],
            a.dump.join("x.svg"),
            "inside the dump directory",
        ),
        (
            vec![&a.report, &b.report],
            d.join("x.svg"),
            "two reports hold digests",
        ),
        (
            vec![&a.report],
            d.join("x.svg"),
            "no case names an `expect` file",
        ),
    ];
    for (inputs, out, wanted) in cases {
        let (code, said) = plot(&inputs, &out);
        assert_eq!(code, Some(2), "{out:?}: {said}");
        assert!(said.contains(wanted), "wanted `{wanted}` in {said}");
        assert!(!out.is_file(), "{out:?} written");
    }
}
