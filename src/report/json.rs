//! JSON as the reports and goldens are read: a key that appears twice in
//! one object is an error. serde_json keeps the last value silently, so a
//! file could show one value to a reader and another to foldprint.

use serde::de::{self, DeserializeSeed, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Value};
use std::fmt;

/// Where a value sits, built only when an error names it.
#[derive(Clone, Copy)]
enum At<'a> {
    Top,
    Key(&'a At<'a>, &'a str),
    Index(&'a At<'a>, usize),
}

impl fmt::Display for At<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            At::Top => Ok(()),
            At::Key(At::Top, k) => write!(f, "{k}"),
            At::Key(up, k) => write!(f, "{up}.{k}"),
            At::Index(up, i) => write!(f, "{up}[{i}]"),
        }
    }
}

/// Parse `text`, refusing an object that holds a key twice. The error
/// names the key, the object and (from serde_json) the line and column;
/// [`is_duplicate_key`] tells it from a syntax error.
pub fn parse_strict(text: &str) -> Result<Value, serde_json::Error> {
    let mut de = serde_json::Deserializer::from_str(text);
    let v = Strict(At::Top).deserialize(&mut de)?;
    de.end()?;
    Ok(v)
}

/// Whether an error of [`parse_strict`] is a repeated key (the JSON itself
/// is well formed).
pub fn is_duplicate_key(e: &serde_json::Error) -> bool {
    e.classify() == serde_json::error::Category::Data
}

struct Strict<'a>(At<'a>);

impl<'de> DeserializeSeed<'de> for Strict<'_> {
    type Value = Value;
    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Strict<'_> {
    type Value = Value;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }
    fn visit_bool<E>(self, b: bool) -> Result<Value, E> {
        Ok(Value::Bool(b))
    }
    fn visit_i64<E>(self, n: i64) -> Result<Value, E> {
        Ok(n.into())
    }
    fn visit_u64<E>(self, n: u64) -> Result<Value, E> {
        Ok(n.into())
    }
    fn visit_f64<E>(self, n: f64) -> Result<Value, E> {
        Ok(n.into())
    }
    fn visit_str<E>(self, s: &str) -> Result<Value, E> {
        Ok(Value::String(s.to_string()))
    }
    fn visit_string<E>(self, s: String) -> Result<Value, E> {
        Ok(Value::String(s))
    }
    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut out = Vec::new();
        while let Some(v) = seq.next_element_seed(Strict(At::Index(&self.0, out.len())))? {
            out.push(v);
        }
        Ok(Value::Array(out))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let mut out = Map::new();
        while let Some(k) = map.next_key::<String>()? {
            if out.contains_key(&k) {
                let object = match self.0 {
                    At::Top => "the top-level object".to_string(),
                    at => at.to_string(),
                };
                return Err(de::Error::custom(format!(
                    "key `{}` appears twice in {object}",
                    super::printable(&k)
                )));
            }
            let v = map.next_value_seed(Strict(At::Key(&self.0, &k)))?;
            out.insert(k, v);
        }
        Ok(Value::Object(out))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn repeated_keys_are_named_with_their_object() {
        let e = parse_strict(r#"{"a": 1, "a": 2}"#).unwrap_err();
        assert!(is_duplicate_key(&e));
        assert!(
            e.to_string()
                .starts_with("key `a` appears twice in the top-level object at line 1"),
            "{e}"
        );
        let e = parse_strict(r#"{"c": [{"p": {"x": 1}}, {"p": {"x": 1, "y": 2, "x": 3}}]}"#)
            .unwrap_err();
        assert!(
            e.to_string().contains("key `x` appears twice in c[1].p"),
            "{e}"
        );
        let e = parse_strict(r#"{"a": 1,}"#).unwrap_err();
        assert!(!is_duplicate_key(&e), "{e}");
    }

    #[test]
    fn values_read_as_serde_json_reads_them() {
        let text = r#"{"a": [1, -2, 3.5, "s", null, true, {"b": {}}], "c": 18446744073709551615}"#;
        assert_eq!(
            parse_strict(text).unwrap(),
            serde_json::from_str::<Value>(text).unwrap()
        );
        assert!(parse_strict(r#"{"a": 1} x"#).is_err());
    }
}
