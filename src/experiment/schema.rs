//! The raw TOML shapes, exactly as written; `deny_unknown_fields` so a typo
//! is an error rather than a silently ignored key.
//!
//! The case parameters are listed once, in [`params!`]'s table below. Serde
//! needs one struct per shape (`[defaults]`, `[[case]]`, `[[sweep]]`), and
//! cannot combine `flatten` with `deny_unknown_fields`, so the table makes
//! them, and the loops over every parameter (overlay, spans, the sweep's
//! lists and its product), from the one list.

use serde::{Deserialize, Serialize};
use std::ops::Range;
use toml::Spanned;

#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RawExperiment {
    pub name: Spanned<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub defaults: Option<RawParams>,
    #[serde(default, rename = "case", skip_serializing_if = "Vec::is_empty")]
    pub cases: Vec<RawCase>,
    #[serde(default, rename = "sweep", skip_serializing_if = "Vec::is_empty")]
    pub sweeps: Vec<RawSweep>,
}

/// A `[[sweep]]` field: a list of values when the parameter is swept, one
/// value for every case of the sweep when it is fixed.
macro_rules! sweep_field {
    (swept, $t:ty) => { Option<Spanned<Vec<$t>>> };
    (fixed, $t:ty) => { Option<Spanned<$t>> };
}

/// A sweep field's values, each with its label for the case id (`None`
/// where there is one value: only a swept list of several is named).
macro_rules! sweep_axis {
    (swept, $list:expr, $label:literal) => {
        axis($list, $label)
    };
    (fixed, $value:expr) => {
        vec![(None, $value.clone())]
    };
}

/// A swept field's key and, when given, its list's length and span.
macro_rules! sweep_list {
    (swept, $key:ident, $list:expr) => {
        Some((
            stringify!($key),
            $list.as_ref().map(|l| (l.get_ref().len(), l.span())),
        ))
    };
    (fixed, $key:ident, $list:expr) => {
        None
    };
}

/// The parameter table: each parameter's key, its type in TOML, and
/// whether a `[[sweep]]` lists it (`swept`, with the label its values get
/// in case ids) or takes one value for all its cases (`fixed`).
macro_rules! params {
    ($( $(#[$doc:meta])* $key:ident : $ty:ty = $kind:ident $($label:literal)? ),* $(,)?) => {
        /// Parameters as they may appear in `[defaults]`.
        #[derive(Debug, Clone, Default, Deserialize, Serialize)]
        #[serde(deny_unknown_fields)]
        pub struct RawParams {
            $(
                #[serde(skip_serializing_if = "Option::is_none")]
                pub $key: Option<Spanned<$ty>>,
            )*
        }

        /// `[[case]]`: an id plus any parameter (serde cannot combine
        /// `flatten` with `deny_unknown_fields`, hence [`RawCase`]).
        #[derive(Debug, Deserialize, Serialize)]
        #[serde(deny_unknown_fields)]
        pub struct RawCaseFields {
            pub id: Spanned<String>,
            $(
                #[serde(skip_serializing_if = "Option::is_none")]
                pub $key: Option<Spanned<$ty>>,
            )*
        }

        impl From<RawCaseFields> for RawCase {
            fn from(f: RawCaseFields) -> Self {
                RawCase {
                    id: f.id,
                    params: RawParams { $($key: f.$key,)* },
                }
            }
        }

        impl From<RawCase> for RawCaseFields {
            fn from(c: RawCase) -> Self {
                RawCaseFields {
                    id: c.id,
                    $($key: c.params.$key,)*
                }
            }
        }

        /// `[[sweep]]`: every swept parameter is a list; the cases are
        /// their product.
        #[derive(Debug, Deserialize, Serialize)]
        #[serde(deny_unknown_fields)]
        pub struct RawSweep {
            pub id: Spanned<String>,
            $(
                $(#[$doc])*
                #[serde(skip_serializing_if = "Option::is_none")]
                pub $key: sweep_field!($kind, $ty),
            )*
        }

        impl RawParams {
            /// `over`'s values where set, else ours.
            pub fn overlay(&self, over: &RawParams) -> RawParams {
                RawParams {
                    $($key: over.$key.clone().or_else(|| self.$key.clone()),)*
                }
            }

            /// Where parameter `key`'s value was written, if it was.
            pub fn span(&self, key: &str) -> Option<Range<usize>> {
                match key {
                    $(stringify!($key) => self.$key.as_ref().map(|v| v.span()),)*
                    _ => None,
                }
            }
        }

        impl RawSweep {
            /// Each swept parameter's key and, when given, its list's
            /// length and span, in the table's order.
            pub fn lists(&self) -> Vec<(&'static str, Option<(usize, Range<usize>)>)> {
                [$(sweep_list!($kind, $key, &self.$key),)*]
                    .into_iter()
                    .flatten()
                    .collect()
            }

            /// The product of the swept lists, in the table's order (the
            /// last parameter varies fastest): each case's parameters as
            /// an overlay, and the labels of the values it was swept to.
            pub fn product(&self) -> Vec<(Vec<String>, RawParams)> {
                let mut out = vec![(Vec::new(), RawParams::default())];
                $(
                    let values = sweep_axis!($kind, &self.$key $(, $label)?);
                    let mut next = Vec::with_capacity(out.len() * values.len());
                    for (labels, params) in &out {
                        for (label, value) in &values {
                            let mut labels: Vec<String> = labels.clone();
                            labels.extend(label.clone());
                            let mut params: RawParams = params.clone();
                            params.$key = value.clone();
                            next.push((labels, params));
                        }
                    }
                    out = next;
                )*
                out
            }
        }
    };
}

params! {
    world: i64 = swept "W",
    arenas: Vec<i64> = swept "n",
    order: RawOrder = swept "",
    seed: i64 = swept "seed",
    distribution: String = swept "",
    contract: String = swept "",
    mean: bool = swept "mean",
    dtype: String = swept "",
    collective: String = swept "",
    /// Not swept: one value for every case of the sweep.
    rounds: i64 = fixed,
    /// Not swept: the same rank files for every case of the sweep.
    addends: String = fixed,
    tensors: Vec<String> = fixed,
    expect: String = fixed,
}

/// A value's label in a swept case's id.
trait Label {
    fn label(&self) -> String;
}
impl Label for i64 {
    fn label(&self) -> String {
        self.to_string()
    }
}
impl Label for bool {
    fn label(&self) -> String {
        self.to_string()
    }
}
impl Label for String {
    fn label(&self) -> String {
        self.clone()
    }
}
impl Label for Vec<i64> {
    fn label(&self) -> String {
        let items: Vec<String> = self.iter().map(i64::to_string).collect();
        items.join("+")
    }
}
impl Label for RawOrder {
    fn label(&self) -> String {
        self.show()
    }
}

/// One swept list's values, each as it will be set, with its label when
/// the list has several (`name=value`, or the value alone for an empty
/// name). An absent or empty list is one unset value.
fn axis<T: Clone + Label>(
    list: &Option<Spanned<Vec<T>>>,
    name: &str,
) -> Vec<(Option<String>, Option<Spanned<T>>)> {
    let Some(l) = list.as_ref().filter(|l| !l.get_ref().is_empty()) else {
        return vec![(None, None)];
    };
    let many = l.get_ref().len() > 1;
    l.get_ref()
        .iter()
        .map(|v| {
            let label = many.then(|| match name {
                "" => v.label(),
                name => format!("{name}={}", v.label()),
            });
            (label, Some(Spanned::new(l.span(), v.clone())))
        })
        .collect()
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(from = "RawCaseFields", into = "RawCaseFields")]
pub struct RawCase {
    pub id: Spanned<String>,
    pub params: RawParams,
}

/// `"descending"`, `"rotate:3"` ... or an explicit permutation `[2, 0, 1]`.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(
    untagged,
    expecting = "expected a delivery order: a string such as \"descending\", \"rotate:3\", \"shuffle:7\", or an array of ranks"
)]
pub enum RawOrder {
    Named(String),
    Permutation(Vec<i64>),
}

impl RawOrder {
    pub fn to_order(&self) -> Result<super::DeliveryOrder, String> {
        match self {
            RawOrder::Named(s) => super::DeliveryOrder::parse(s),
            RawOrder::Permutation(p) => {
                let mut ranks = Vec::with_capacity(p.len());
                for &r in p {
                    if r < 0 {
                        return Err(format!("permutation {p:?} has a negative rank {r}"));
                    }
                    ranks.push(r as usize);
                }
                Ok(super::DeliveryOrder::Explicit(ranks))
            }
        }
    }

    pub fn show(&self) -> String {
        match self {
            RawOrder::Named(s) => s.clone(),
            RawOrder::Permutation(p) => {
                let items: Vec<String> = p.iter().map(|r| r.to_string()).collect();
                format!("[{}]", items.join(" "))
            }
        }
    }
}
