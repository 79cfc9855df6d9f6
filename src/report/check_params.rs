//! A case's parameters and its order sensitivity, as a report states them,
//! checked against what a run can have made: the limits an experiment is
//! held to, the delivery sequence its order names, and the sensitivity
//! docs/SPEC.md §7 defines from the generator alone.

use super::CaseReport;
use crate::experiment::{Case, DeliveryOrder, MAX_CASE_BYTES};
use crate::fold::OrderRole;
use crate::sensitivity::{self, Verdict, SAMPLE_CAP};
use crate::world_size::{WorldSize, MAX_WORLD};

/// The delivery order `text` names, as a report writes it: a named order
/// or an explicit `[a,b,...]`, valid at `world` and spelled canonically.
fn order_of(text: &str, world: usize) -> Result<DeliveryOrder, String> {
    let order = match text.strip_prefix('[').and_then(|t| t.strip_suffix(']')) {
        Some(items) => DeliveryOrder::Explicit(
            items
                .split(',')
                .map(|r| r.trim().parse::<usize>())
                .collect::<Result<_, _>>()
                .map_err(|_| format!("`{text}` is not a list of ranks"))?,
        ),
        None => DeliveryOrder::parse(text)?,
    };
    order.validate(world)?;
    if order.canonical() != text {
        return Err(format!(
            "`{text}` is not how a run writes it (`{}`)",
            order.canonical()
        ));
    }
    Ok(order)
}

/// Problems with `c.params`; the case they describe when there are none
/// (for rank files, a generated case of the same shape: what the limits
/// and the sample size depend on).
pub(super) fn params(c: &CaseReport, bad: &mut dyn FnMut(String)) -> Option<Case> {
    let p = &c.params;
    // Where the addends came from: the generator's or the files' fields,
    // never both (`CaseParams::builder` reads every parameter back).
    let addends = &p.addends;
    match (addends, p.seed, p.distribution) {
        (None, Some(_), Some(_)) | (Some(_), None, None) => {}
        (None, _, _) => {
            bad("params: neither `seed` and `distribution` nor `addends` says where the addends came from".into());
            return None;
        }
        (Some(_), _, _) => {
            bad(
                "params: `addends` (files) and `seed`/`distribution` (the generator) both given"
                    .into(),
            );
            return None;
        }
    }
    // f32 is written by leaving `dtype` out (every f32 report reads as
    // before the dtypes); a 16-bit case reduces rank files of its dtype
    // only (a file is never rounded to it).
    if p.dtype.is_some_and(|d| d.is_f32()) {
        bad("params.dtype is \"f32\", which a run writes by leaving `dtype` out".into());
        return None;
    }
    if let (Some(d), Some(f)) = (p.dtype, addends) {
        if let Some(a) = f.arenas.iter().find(|a| a.dtype != d) {
            bad(format!(
                "params.dtype is {d}, but params.addends.arenas names `{}` of {}: a run never rounds an addend",
                super::printable(&a.name),
                a.dtype
            ));
            return None;
        }
    }
    if let Some(f) = addends {
        let lens: Vec<usize> = f.arenas.iter().map(|a| a.len).collect();
        if f.files.len() != p.world {
            bad(format!(
                "params.addends lists {} rank files for W = {}",
                f.files.len(),
                p.world
            ));
            return None;
        }
        if lens != p.arenas {
            bad(format!(
                "params.addends.arenas have {lens:?} elements, params.arenas says {:?}",
                p.arenas
            ));
            return None;
        }
        if !f.identity_holds() {
            bad("params.addends.identity is not the identity of its files and arenas".into());
            return None;
        }
    }
    if WorldSize::new(p.world).is_err() {
        bad(format!(
            "params.world {} is not in 1..={MAX_WORLD}",
            p.world
        ));
        return None;
    }
    let total = p
        .arenas
        .iter()
        .fold(0u64, |s, &n| s.saturating_add(n as u64));
    if p.arenas.is_empty() {
        bad("params.arenas lists no arena".into());
        return None;
    }
    if total.saturating_mul(p.world as u64).saturating_mul(4) > MAX_CASE_BYTES {
        bad(format!(
            "params: W = {} x {total} elements x 4 bytes of addends is over the 1 TiB cap \
             ({MAX_CASE_BYTES} bytes): no run makes such a case",
            p.world
        ));
        return None;
    }
    let order = match order_of(&p.order, p.world) {
        Ok(o) => o,
        Err(m) => {
            bad(format!("params.order: {m}"));
            return None;
        }
    };
    let seq = &p.order_sequence;
    if let Err(m) = DeliveryOrder::Explicit(seq.clone()).validate(p.world) {
        bad(format!(
            "params.order_sequence {seq:?} is not a delivery sequence: {m}"
        ));
        return None;
    }
    let want = order.sequence(p.world);
    if *seq != want {
        bad(format!(
            "params.order_sequence {seq:?} is not what order `{}` delivers at W={}, {want:?}",
            p.order, p.world
        ));
        return None;
    }
    match p
        .builder(order)
        .experiment(c.experiment.clone())
        .id(c.id.clone())
        .build()
    {
        Ok(case) => Some(case),
        Err(e) => {
            bad(format!("params: {e}"));
            None
        }
    }
}

/// Problems with `c.sensitivity`, whose case `case` is. The counts must be
/// those of the sample its length implies and the fraction and verdict
/// must follow from them; an arrival-order case's counts decide its
/// group's verdict, so they are recomputed from the generator (no more
/// work than the run spent on them).
pub(super) fn sensitivity(c: &CaseReport, case: &Case, bad: &mut dyn FnMut(String)) {
    let s = &c.sensitivity;
    let total = case.total_len();
    let stride = total.div_ceil(SAMPLE_CAP).max(1);
    let sample = if stride == 1 {
        "every element".to_string()
    } else {
        format!("stride {stride}")
    };
    let checked: u64 = case
        .arenas()
        .iter()
        .map(|&n| (n as u64).div_ceil(stride))
        .sum();
    let before = std::cell::Cell::new(false);
    let mut bad = |m: String| {
        before.set(true);
        bad(m)
    };
    if s.sample != sample {
        bad(format!(
            "sensitivity.sample is `{}`; {total} elements are sampled as `{sample}`",
            s.sample
        ));
    }
    if s.checked != checked {
        bad(format!(
            "sensitivity.checked is {}; the sample `{sample}` of {total} elements checks {checked}",
            s.checked
        ));
    }
    if s.changed > s.checked {
        bad(format!(
            "sensitivity.changed {} is more than the {} checked",
            s.changed, s.checked
        ));
    }
    if case.world() <= 2 && s.changed != 0 {
        bad(format!(
            "sensitivity.changed is {}, but at W={} reversing the order cannot change a sum (a + b = b + a)",
            s.changed, case.world()
        ));
    }
    let fraction = if s.checked == 0 {
        0.0
    } else {
        s.changed as f64 / s.checked as f64
    };
    // serde_json may read a float 1 ULP off what was written.
    if (s.fraction - fraction).abs() > 1e-12 {
        bad(format!(
            "sensitivity.fraction is {}, but {} of {} is {fraction}",
            s.fraction, s.changed, s.checked
        ));
    }
    let verdict = Verdict::of(s.changed, fraction);
    if s.verdict != verdict {
        bad(format!(
            "sensitivity.verdict is `{}`, but its counts make it `{verdict}`",
            s.verdict
        ));
    }
    let decides_a_verdict = match case.contract().order_role() {
        OrderRole::Changes => true,
        OrderRole::Invariant | OrderRole::Ignored => false,
    };
    // Rank files are not at hand where a report is read: only the
    // generator's sensitivity can be recomputed.
    let generated = c.params.addends.is_none();
    if decides_a_verdict && generated && !before.get() {
        let Ok(m) = sensitivity::measure(case) else {
            return;
        };
        if (m.changed, m.checked) != (s.changed, s.checked) {
            bad(format!(
                "sensitivity says {} of {} elements change with the order; the generator gives {} of {}",
                s.changed, s.checked, m.changed, m.checked
            ));
        }
    }
}
