//! How the configuration file's values are read: each scalar as whatever the file holds, then
//! checked in the file's terms (`must be an integer, not "many"`), lists and mappings through
//! the file's own sequence or map so that an error inside keeps its path (`clusterDNS[1]`),
//! and Go's duration notation (`"1m30s"`). The field checks that follow reading are in the
//! parent module.

use std::collections::BTreeMap;
use std::fmt;
use std::marker::PhantomData;
use std::net::IpAddr;
use std::time::Duration;

use serde::Deserialize;
use serde::de::value::{MapAccessDeserializer, SeqAccessDeserializer};
use serde::de::{self, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::Value;

use super::Error;
use super::testing::RawTesting;

/// A scalar field's value: read as whatever the file holds, then checked, so a value of the
/// wrong type is refused in the file's terms (`must be an integer, not "many"`) rather than
/// serde's; [`super::parse`] puts the field's path in front.
pub(super) struct Typed<T>(pub(super) T);

/// How a scalar is read from the file's value.
trait FromValue: Sized {
    fn from_value(v: Value) -> Result<Self, Error>;
}

/// A value that is not `want` (`"an integer"`), refused as `must be {want}, not {got}`.
pub(super) fn wrong_type(want: &'static str, got: impl fmt::Display) -> Error {
    Error::WrongType {
        want,
        got: got.to_string(),
    }
}

impl<'de, T: FromValue> Deserialize<'de> for Typed<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        T::from_value(Value::deserialize(d)?)
            .map(Typed)
            .map_err(de::Error::custom)
    }
}

impl FromValue for String {
    fn from_value(v: Value) -> Result<Self, Error> {
        match v {
            Value::String(s) => Ok(s),
            // A list item or mapping value written as `null` (a field is then unset).
            Value::Null => Ok(String::new()),
            other => Err(wrong_type("a string", other)),
        }
    }
}

/// A list of non-empty strings.
impl FromValue for Vec<String> {
    fn from_value(v: Value) -> Result<Self, Error> {
        match v {
            Value::Null => Ok(Vec::new()),
            Value::Array(items) => items
                .into_iter()
                .map(|i| match i {
                    Value::String(s) if !s.is_empty() => Ok(s),
                    other => Err(wrong_type("a list of non-empty strings", other)),
                })
                .collect(),
            other => Err(wrong_type("a list of strings", other)),
        }
    }
}

impl FromValue for bool {
    fn from_value(v: Value) -> Result<Self, Error> {
        v.as_bool().ok_or_else(|| wrong_type("true or false", &v))
    }
}

impl FromValue for i64 {
    fn from_value(v: Value) -> Result<Self, Error> {
        v.as_i64().ok_or_else(|| wrong_type("an integer", &v))
    }
}

/// A Go duration string (`"1m30s"`).
impl FromValue for Duration {
    fn from_value(v: Value) -> Result<Self, Error> {
        match v {
            Value::String(s) => parse_duration(&s),
            other => Err(wrong_type("a duration string like \"10s\"", other)),
        }
    }
}

impl FromValue for IpAddr {
    fn from_value(v: Value) -> Result<Self, Error> {
        let s = String::from_value(v)?;
        s.parse().map_err(|_| Error::IpAddress(s))
    }
}

/// `clusterDNS`.
pub(super) struct IpList(pub(super) Vec<IpAddr>);

impl<'de> Deserialize<'de> for IpList {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let ips: Vec<Typed<IpAddr>> = d.deserialize_any(Shaped::list("a list of IP addresses"))?;
        Ok(IpList(ips.into_iter().map(|Typed(ip)| ip).collect()))
    }
}

/// `evictionHard`: signal → threshold, checked by the parent module.
pub(super) struct Thresholds(pub(super) BTreeMap<String, String>);

impl<'de> Deserialize<'de> for Thresholds {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        string_map(d, "a mapping of signal to threshold").map(Thresholds)
    }
}

/// `kubeReserved`, `systemReserved`: resource → quantity, as written.
pub(super) struct Quantities(pub(super) BTreeMap<String, String>);

impl<'de> Deserialize<'de> for Quantities {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        string_map(d, "a mapping of resource to quantity").map(Quantities)
    }
}

/// A mapping of names to strings; anything else is refused as not `what`.
fn string_map<'de, D: Deserializer<'de>>(
    d: D,
    what: &'static str,
) -> Result<BTreeMap<String, String>, D::Error> {
    let map: BTreeMap<String, Typed<String>> = d.deserialize_any(Shaped::mapping(what))?;
    Ok(map.into_iter().map(|(k, Typed(v))| (k, v)).collect())
}

/// `nodeletNetwork`.
pub(super) struct NetworkField(pub(super) super::network::RawNetwork);

impl<'de> Deserialize<'de> for NetworkField {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(Shaped::mapping("a mapping"))
            .map(NetworkField)
    }
}

/// `nodeletTesting`.
pub(super) struct Testing(pub(super) RawTesting);

impl<'de> Deserialize<'de> for Testing {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(Shaped::mapping("a mapping")).map(Testing)
    }
}

/// Reads a `T` written as a list (or as a mapping), through the file's own sequence (or map)
/// so that errors inside keep their path (`clusterDNS[1]`, `nodeletTesting.crashLoopBackOffMax`);
/// refuses anything else as `must be {what}, not ...`.
pub(super) struct Shaped<T> {
    what: &'static str,
    list: bool,
    t: PhantomData<T>,
}

impl<T> Shaped<T> {
    pub(super) fn list(what: &'static str) -> Self {
        Shaped {
            what,
            list: true,
            t: PhantomData,
        }
    }

    pub(super) fn mapping(what: &'static str) -> Self {
        Shaped {
            what,
            list: false,
            t: PhantomData,
        }
    }

    fn refuse<E: de::Error>(&self, got: impl fmt::Display) -> E {
        E::custom(wrong_type(self.what, got))
    }
}

impl<'de, T: Deserialize<'de>> Visitor<'de> for Shaped<T> {
    type Value = T;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str(self.what)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<T, A::Error> {
        if self.list {
            T::deserialize(SeqAccessDeserializer::new(seq))
        } else {
            Err(self.refuse("a list"))
        }
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<T, A::Error> {
        if self.list {
            Err(self.refuse("a mapping"))
        } else {
            T::deserialize(MapAccessDeserializer::new(map))
        }
    }

    fn visit_unit<E: de::Error>(self) -> Result<T, E> {
        Err(self.refuse(Value::Null))
    }

    fn visit_bool<E: de::Error>(self, v: bool) -> Result<T, E> {
        Err(self.refuse(v))
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<T, E> {
        Err(self.refuse(v))
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<T, E> {
        Err(self.refuse(v))
    }

    fn visit_f64<E: de::Error>(self, v: f64) -> Result<T, E> {
        Err(self.refuse(Value::from(v)))
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<T, E> {
        Err(self.refuse(Value::from(v)))
    }
}

/// Parses a Go duration (`"1m30s"`, `"500ms"`, `"2h"`, `"1.5s"`, `"0"`). Units: ns, us, µs,
/// ms, s, m, h. Negative durations are rejected (nothing nodelet configures can be negative).
pub fn parse_duration(s: &str) -> Result<Duration, Error> {
    let err = || Error::Duration(s.to_string());
    if let Some(abs) = s.strip_prefix('-') {
        return match parse_duration(abs) {
            Ok(d) if d.is_zero() => Ok(d),
            Ok(_) => Err(Error::NegativeDuration(s.to_string())),
            Err(_) => Err(err()),
        };
    }
    let mut rest = s.strip_prefix('+').unwrap_or(s);
    if rest == "0" {
        return Ok(Duration::ZERO);
    }
    if rest.is_empty() {
        return Err(err());
    }
    let mut total: u128 = 0; // nanoseconds
    while !rest.is_empty() {
        let num_len = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .ok_or_else(err)?;
        let (num, after) = rest.split_at(num_len);
        if num.is_empty() || num == "." || num.matches('.').count() > 1 {
            return Err(err());
        }
        let unit_len = after
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(after.len());
        let (unit, after) = after.split_at(unit_len);
        let scale: u128 = match unit {
            "ns" => 1,
            "us" | "µs" | "μs" => 1_000,
            "ms" => 1_000_000,
            "s" => 1_000_000_000,
            "m" => 60_000_000_000,
            "h" => 3_600_000_000_000,
            _ => return Err(err()),
        };
        let (int, frac) = num.split_once('.').unwrap_or((num, ""));
        let int: u128 = if int.is_empty() {
            0
        } else {
            int.parse().map_err(|_| err())?
        };
        let mut nanos = int.checked_mul(scale).ok_or_else(err)?;
        // Fractional part: at most 9 + 13 digits matter; truncate like Go does.
        let mut place = scale;
        for c in frac.chars().take(24) {
            place /= 10;
            let digit = u128::from(c.to_digit(10).ok_or_else(err)?);
            nanos = nanos.checked_add(digit * place).ok_or_else(err)?;
        }
        total = total.checked_add(nanos).ok_or_else(err)?;
        rest = after;
    }
    let secs = u64::try_from(total / 1_000_000_000).map_err(|_| err())?;
    let nanos = u32::try_from(total % 1_000_000_000).map_err(|_| err())?;
    Ok(Duration::new(secs, nanos))
}
