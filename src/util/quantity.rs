//! Kubernetes resource quantities (`500m`, `1.5`, `128Mi`, `1G`, `1e3`) as integers.
//!
//! Only what the kubelet needs: CPU in millicores and memory (or any byte count) in bytes,
//! rounding up like `resource.Quantity.MilliValue()` / `Value()` do. Malformed input is a
//! [`QuantityError`] the caller turns into `InvalidArgument` naming the field.

/// Why a quantity could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QuantityError {
    /// Not a quantity: no number, a stray character, an unknown suffix, an exponent past ±30.
    #[error("invalid quantity {0:?}")]
    Invalid(String),
    /// A quantity whose value does not fit the integer asked for.
    #[error("quantity {0:?} out of range")]
    OutOfRange(String),
}

/// A parsed quantity as an exact decimal: `mantissa * 10^exp10 * 1024^exp1024`.
struct Parsed {
    negative: bool,
    digits: u128,
    scale: i32,
    exp10: i32,
    exp1024: u32,
}

fn parse(s: &str) -> Result<Parsed, QuantityError> {
    let bad = || QuantityError::Invalid(s.to_string());
    let t = s.trim();
    if t.is_empty() {
        return Err(bad());
    }
    let (negative, t) = match t.as_bytes()[0] {
        b'-' => (true, &t[1..]),
        b'+' => (false, &t[1..]),
        _ => (false, t),
    };
    let num_end = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, suffix) = t.split_at(num_end);
    if num.is_empty() || num == "." || num.matches('.').count() > 1 {
        return Err(bad());
    }
    let (int_part, frac_part) = num.split_once('.').unwrap_or((num, ""));
    let mut digits: u128 = 0;
    for c in int_part.chars().chain(frac_part.chars()) {
        let d = c.to_digit(10).ok_or_else(bad)?;
        digits = digits
            .checked_mul(10)
            .and_then(|v| v.checked_add(u128::from(d)))
            .ok_or_else(bad)?;
    }
    let scale = i32::try_from(frac_part.len()).map_err(|_| bad())?;
    let (exp10, exp1024) = match suffix {
        "" => (0, 0),
        "n" => (-9, 0),
        "u" => (-6, 0),
        "m" => (-3, 0),
        "k" => (3, 0),
        "M" => (6, 0),
        "G" => (9, 0),
        "T" => (12, 0),
        "P" => (15, 0),
        "E" => (18, 0),
        "Ki" => (0, 1),
        "Mi" => (0, 2),
        "Gi" => (0, 3),
        "Ti" => (0, 4),
        "Pi" => (0, 5),
        "Ei" => (0, 6),
        e if e.starts_with(['e', 'E']) => (e[1..].parse::<i32>().map_err(|_| bad())?, 0),
        _ => return Err(bad()),
    };
    if !(-30..=30).contains(&exp10) {
        return Err(bad());
    }
    Ok(Parsed {
        negative,
        digits,
        scale,
        exp10,
        exp1024,
    })
}

/// `value * 10^shift`, rounded up (away from zero for the magnitude), as an `i64`.
fn scaled(p: &Parsed, shift: i32, input: &str) -> Result<i64, QuantityError> {
    let too_big = || QuantityError::OutOfRange(input.to_string());
    let mut n = p.digits;
    for _ in 0..p.exp1024 {
        n = n.checked_mul(1024).ok_or_else(too_big)?;
    }
    let e = p.exp10 + shift - p.scale;
    if e >= 0 {
        for _ in 0..e {
            n = n.checked_mul(10).ok_or_else(too_big)?;
        }
    } else {
        let div = 10u128.checked_pow(e.unsigned_abs()).ok_or_else(too_big)?;
        n = n.div_ceil(div);
    }
    let v = i64::try_from(n).map_err(|_| too_big())?;
    Ok(if p.negative { -v } else { v })
}

/// CPU in millicores: `"500m"` → 500, `"1.5"` → 1500, `"2"` → 2000.
pub fn parse_cpu_millis(s: &str) -> Result<i64, QuantityError> {
    scaled(&parse(s)?, 3, s)
}

/// A byte count (memory, storage): `"128Mi"` → 134217728, `"1G"` → 10^9, `"1e3"` → 1000.
pub fn parse_bytes(s: &str) -> Result<i64, QuantityError> {
    scaled(&parse(s)?, 0, s)
}

/// Bytes as upstream's `resource.Quantity` prints a binary quantity: the largest exact binary
/// suffix (`100Mi`, `16318428Ki`), else the plain number.
pub fn format_bytes(bytes: i64) -> String {
    const SUFFIXES: [&str; 6] = ["Ki", "Mi", "Gi", "Ti", "Pi", "Ei"];
    if bytes == 0 {
        return "0".to_string();
    }
    let mut n = bytes;
    let mut suffix = "";
    for s in SUFFIXES {
        if n % 1024 != 0 {
            break;
        }
        n /= 1024;
        suffix = s;
    }
    format!("{n}{suffix}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu() {
        let cases = [
            ("500m", 500),
            ("1.5", 1500),
            ("2", 2000),
            ("0.1", 100),
            ("100u", 1),
            ("1k", 1_000_000),
            ("0", 0),
            ("250m", 250),
        ];
        for (input, want) in cases {
            assert_eq!(parse_cpu_millis(input), Ok(want), "{input}");
        }
    }

    #[test]
    fn bytes() {
        let cases = [
            ("128Mi", 128 * 1024 * 1024),
            ("1G", 1_000_000_000),
            ("1e3", 1000),
            ("1E3", 1000),
            ("1Ki", 1024),
            ("1.5Gi", 3 * 512 * 1024 * 1024),
            ("100", 100),
            ("1500m", 2),
            ("64M", 64_000_000),
        ];
        for (input, want) in cases {
            assert_eq!(parse_bytes(input), Ok(want), "{input}");
        }
    }

    #[test]
    fn malformed() {
        for input in [
            "",
            "abc",
            "1.2.3",
            "10Xi",
            "m",
            ".",
            "1e",
            "1e99",
            "99999999999Ei",
        ] {
            assert!(parse_bytes(input).is_err(), "{input}");
        }
    }

    #[test]
    fn messages() {
        let text = |r: Result<i64, QuantityError>| r.map_err(|e| e.to_string());
        assert_eq!(text(parse_bytes("x")), Err("invalid quantity \"x\"".into()));
        assert_eq!(
            text(parse_bytes("99999999999Ei")),
            Err("quantity \"99999999999Ei\" out of range".into())
        );
    }
}
