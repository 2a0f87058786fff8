//! Tolerant reading of E2B's JSON answers into typed structs.
//!
//! E2B-compatible platforms differ in what they send, so a reply is read field by field: a field
//! that is missing, `null` or of another type than expected counts as absent, unknown fields are
//! ignored, and an answer that is not a JSON object reads as "every field absent". Reply structs
//! derive `Deserialize` with `#[serde(default)]` and name one of the functions here in
//! `deserialize_with` for each field.
//!
//! JSON is UTF-8: an answer that is not (also where the bad bytes sit in a field no struct reads)
//! is not JSON and reads as absent, as through `serde_json::Value`. Two differences from reading
//! through `Value` remain: a JSON object that repeats a field of a reply struct is refused
//! (serde's derived structs refuse duplicates) and reads as absent, and a number too large for
//! `f64` in a field no struct reads is skipped rather than refusing the whole answer.

use serde::de::value::MapAccessDeserializer;
use serde::de::{DeserializeOwned, DeserializeSeed, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde::{Deserialize, Deserializer};
use std::fmt;
use std::marker::PhantomData;

/// Reads a whole answer: its fields when it is a JSON object, else every field absent.
pub(super) fn parse<T: DeserializeOwned + Default>(body: &[u8]) -> T {
    parse_object(body).unwrap_or_default()
}

/// Reads a whole answer that must be a JSON object: `None` for invalid JSON or any other value.
pub(super) fn parse_object<T: DeserializeOwned>(body: &[u8]) -> Option<T> {
    // serde_json checks UTF-8 only in the strings it reads, not in those it skips.
    let text = std::str::from_utf8(body).ok()?;
    serde_json::from_str::<Object<T>>(text).ok()?.0
}

/// A string field; absent unless it is a JSON string.
pub(super) fn string<'de, D: Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
    Ok(match Scalar::deserialize(d)? {
        Scalar::Text(s) => Some(s),
        _ => None,
    })
}

/// A non-negative integer field; absent unless it is a JSON integer that fits a `u64`.
pub(super) fn unsigned<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
    Ok(match Scalar::deserialize(d)? {
        Scalar::Unsigned(n) => Some(n),
        Scalar::Signed(n) => u64::try_from(n).ok(),
        _ => None,
    })
}

/// An integer field; absent unless it is a JSON integer that fits an `i64`.
pub(super) fn signed<'de, D: Deserializer<'de>>(d: D) -> Result<Option<i64>, D::Error> {
    Ok(match Scalar::deserialize(d)? {
        Scalar::Unsigned(n) => i64::try_from(n).ok(),
        Scalar::Signed(n) => Some(n),
        _ => None,
    })
}

/// A field that is either a string holding a number or a non-negative integer (protobuf JSON
/// writes 64-bit integers as strings); absent for anything else, including unparsable text.
pub(super) fn number_or_text<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
    Ok(match Scalar::deserialize(d)? {
        Scalar::Text(s) => s.parse().ok(),
        Scalar::Unsigned(n) => Some(n),
        Scalar::Signed(n) => u64::try_from(n).ok(),
        Scalar::Other => None,
    })
}

/// A nested object field; every one of its fields absent when it is not a JSON object.
pub(super) fn object<'de, D: Deserializer<'de>, T: Deserialize<'de> + Default>(d: D) -> Result<T, D::Error> {
    Ok(Object::<T>::deserialize(d)?.0.unwrap_or_default())
}

/// A field whose presence matters whatever its value: `Some` as soon as the key is there (an
/// empty `T` when the value is not an object), `None` only when the key is missing. Use with
/// `#[serde(default)]`, which gives `None` for a missing key.
pub(super) fn present<'de, D: Deserializer<'de>, T: Deserialize<'de> + Default>(d: D) -> Result<Option<T>, D::Error> {
    object(d).map(Some)
}

/// Reads a whole answer that must be a JSON object, handing each object of its array field
/// `field` to `each` as it is read; elements that are not objects are skipped, and a `null` field
/// or none reads as an empty array. An answer of any length costs only what `each` keeps. `None`
/// for invalid JSON, an answer that is not an object, or a field that is neither an array nor
/// `null`.
pub(super) fn each_object<T: DeserializeOwned>(body: &[u8], field: &str, each: &mut dyn FnMut(T)) -> Option<()> {
    let text = std::str::from_utf8(body).ok()?;
    let mut reader = serde_json::Deserializer::from_str(text);
    AnswerSeed { field, each }.deserialize(&mut reader).ok()?;
    reader.end().ok()
}

/// The answer object of [`each_object`].
struct AnswerSeed<'a, T> {
    field: &'a str,
    each: &'a mut dyn FnMut(T),
}

impl<'de, T: DeserializeOwned> DeserializeSeed<'de> for AnswerSeed<'_, T> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de, T: DeserializeOwned> Visitor<'de> for AnswerSeed<'_, T> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        let mut read = false;
        while let Some(key) = map.next_key::<std::borrow::Cow<'de, str>>()? {
            if key == self.field && !read {
                read = true;
                map.next_value_seed(EachSeed { each: &mut *self.each })?;
            } else {
                map.next_value::<IgnoredAny>()?;
            }
        }
        Ok(())
    }
}

/// The array field of [`each_object`].
struct EachSeed<'a, T> {
    each: &'a mut dyn FnMut(T),
}

impl<'de, T: DeserializeOwned> DeserializeSeed<'de> for EachSeed<'_, T> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de, T: DeserializeOwned> Visitor<'de> for EachSeed<'_, T> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("an array or null")
    }

    fn visit_unit<E>(self) -> Result<(), E> {
        Ok(())
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        while let Some(item) = seq.next_element::<Object<T>>()? {
            if let Some(t) = item.0 {
                (self.each)(t);
            }
        }
        Ok(())
    }
}

/// A JSON value reduced to what the reply structs use.
enum Scalar {
    Text(String),
    Unsigned(u64),
    Signed(i64),
    /// `null`, a boolean, a float, an array or an object.
    Other,
}

impl<'de> Deserialize<'de> for Scalar {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(ScalarVisitor)
    }
}

struct ScalarVisitor;

impl<'de> Visitor<'de> for ScalarVisitor {
    type Value = Scalar;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_bool<E>(self, _: bool) -> Result<Scalar, E> {
        Ok(Scalar::Other)
    }

    fn visit_i64<E>(self, n: i64) -> Result<Scalar, E> {
        Ok(Scalar::Signed(n))
    }

    fn visit_u64<E>(self, n: u64) -> Result<Scalar, E> {
        Ok(Scalar::Unsigned(n))
    }

    fn visit_f64<E>(self, _: f64) -> Result<Scalar, E> {
        Ok(Scalar::Other)
    }

    fn visit_str<E>(self, s: &str) -> Result<Scalar, E> {
        Ok(Scalar::Text(s.to_string()))
    }

    fn visit_string<E>(self, s: String) -> Result<Scalar, E> {
        Ok(Scalar::Text(s))
    }

    fn visit_unit<E>(self) -> Result<Scalar, E> {
        Ok(Scalar::Other)
    }

    fn visit_none<E>(self) -> Result<Scalar, E> {
        Ok(Scalar::Other)
    }

    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Scalar, D::Error> {
        Scalar::deserialize(d)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Scalar, A::Error> {
        drain_seq(seq)?;
        Ok(Scalar::Other)
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Scalar, A::Error> {
        drain_map(map)?;
        Ok(Scalar::Other)
    }
}

/// A value read as `T` when it is a JSON object, else `None`.
struct Object<T>(Option<T>);

impl<'de, T: Deserialize<'de>> Deserialize<'de> for Object<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(ObjectVisitor(PhantomData))
    }
}

struct ObjectVisitor<T>(PhantomData<T>);

impl<'de, T: Deserialize<'de>> Visitor<'de> for ObjectVisitor<T> {
    type Value = Object<T>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_bool<E>(self, _: bool) -> Result<Object<T>, E> {
        Ok(Object(None))
    }

    fn visit_i64<E>(self, _: i64) -> Result<Object<T>, E> {
        Ok(Object(None))
    }

    fn visit_u64<E>(self, _: u64) -> Result<Object<T>, E> {
        Ok(Object(None))
    }

    fn visit_f64<E>(self, _: f64) -> Result<Object<T>, E> {
        Ok(Object(None))
    }

    fn visit_str<E>(self, _: &str) -> Result<Object<T>, E> {
        Ok(Object(None))
    }

    fn visit_unit<E>(self) -> Result<Object<T>, E> {
        Ok(Object(None))
    }

    fn visit_none<E>(self) -> Result<Object<T>, E> {
        Ok(Object(None))
    }

    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Object<T>, D::Error> {
        Object::deserialize(d)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Object<T>, A::Error> {
        drain_seq(seq)?;
        Ok(Object(None))
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Object<T>, A::Error> {
        T::deserialize(MapAccessDeserializer::new(map)).map(|t| Object(Some(t)))
    }
}

/// Consumes the rest of an array (the JSON reader needs it read to its end).
fn drain_seq<'de, A: SeqAccess<'de>>(mut seq: A) -> Result<(), A::Error> {
    while seq.next_element::<IgnoredAny>()?.is_some() {}
    Ok(())
}

/// Consumes the rest of an object.
fn drain_map<'de, A: MapAccess<'de>>(mut map: A) -> Result<(), A::Error> {
    while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, Default, PartialEq, Deserialize)]
    #[serde(default)]
    struct Sample {
        #[serde(deserialize_with = "string")]
        name: Option<String>,
        #[serde(deserialize_with = "unsigned")]
        count: Option<u64>,
        #[serde(deserialize_with = "signed")]
        code: Option<i64>,
        #[serde(deserialize_with = "number_or_text")]
        size: Option<u64>,
        #[serde(deserialize_with = "object")]
        inner: Inner,
        #[serde(deserialize_with = "present")]
        marker: Option<Inner>,
    }

    #[derive(Debug, Default, PartialEq, Deserialize)]
    #[serde(default)]
    struct Inner {
        #[serde(deserialize_with = "string")]
        name: Option<String>,
    }

    fn inner(name: &str) -> Inner {
        Inner { name: Some(name.into()) }
    }

    #[test]
    fn well_formed_fields_are_read() {
        let s: Sample = parse(
            br#"{"name":"a","count":3,"code":-2,"size":"7","inner":{"name":"b"},"marker":{},"items":[{"name":"c"}],"extra":[1,{"x":null}]}"#,
        );
        assert_eq!(
            s,
            Sample {
                name: Some("a".into()),
                count: Some(3),
                code: Some(-2),
                size: Some(7),
                inner: inner("b"),
                marker: Some(Inner::default()),
            }
        );
        let s: Sample = parse(br#"{"size":9}"#);
        assert_eq!(s.size, Some(9));
    }

    #[test]
    fn wrong_types_read_as_absent() {
        let s: Sample = parse(
            br#"{"name":1,"count":-1,"code":18446744073709551615,"size":"x","inner":[{"name":"b"}],"marker":null,"items":[5,{"name":"c"},null]}"#,
        );
        assert_eq!(s, Sample { name: None, count: None, code: None, size: None, inner: Inner::default(), marker: Some(Inner::default()) });
        let s: Sample = parse(br#"{"name":{"a":[1,2]},"count":1.5,"code":true,"size":2.0,"items":{"name":"c"}}"#);
        assert_eq!(s, Sample::default());
    }

    #[test]
    fn answers_that_are_not_objects_read_as_empty() {
        for body in [&b""[..], b"nope", b"null", b"5", b"\"s\"", br#"[{"name":"a"}]"#, br#"{"name":"a"} x"#] {
            assert_eq!(parse::<Sample>(body), Sample::default(), "{}", String::from_utf8_lossy(body));
            assert_eq!(parse_object::<Sample>(body), None, "{}", String::from_utf8_lossy(body));
        }
        assert_eq!(parse_object::<Sample>(b"{}"), Some(Sample::default()));
    }
}
