//! Durations as Go's `time.Duration.String` prints them, for messages spelled as upstream's.

use std::time::Duration;

/// A duration as Go's `time.Duration.String` prints it: `3m5s`, `1h0m0s`, `1.5s`, `250ms`.
pub fn go_duration(d: Duration) -> String {
    let nanos = d.as_nanos();
    if nanos == 0 {
        return "0s".to_string();
    }
    if nanos < 1_000 {
        return format!("{nanos}ns");
    }
    if nanos < 1_000_000 {
        return format!("{}µs", decimal(nanos, 1_000));
    }
    if nanos < 1_000_000_000 {
        return format!("{}ms", decimal(nanos, 1_000_000));
    }
    let secs = d.as_secs();
    let (h, m) = (secs / 3600, (secs / 60) % 60);
    let s = decimal(
        u128::from(secs % 60) * 1_000_000_000 + u128::from(d.subsec_nanos()),
        1_000_000_000,
    );
    if h > 0 {
        format!("{h}h{m}m{s}s")
    } else if m > 0 {
        format!("{m}m{s}s")
    } else {
        format!("{s}s")
    }
}

/// `n / unit` with the fraction's trailing zeros dropped.
fn decimal(n: u128, unit: u128) -> String {
    let (int, frac) = (n / unit, n % unit);
    if frac == 0 {
        return int.to_string();
    }
    let width = unit.ilog10() as usize;
    let digits = format!("{frac:0width$}");
    format!("{int}.{}", digits.trim_end_matches('0'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn go_durations() {
        let cases = [
            (Duration::ZERO, "0s"),
            (Duration::from_nanos(5), "5ns"),
            (Duration::from_micros(1500), "1.5ms"),
            (Duration::from_nanos(2500), "2.5µs"),
            (Duration::from_millis(250), "250ms"),
            (Duration::from_secs(1), "1s"),
            (Duration::from_millis(1500), "1.5s"),
            (Duration::from_secs(180), "3m0s"),
            (Duration::from_secs(185), "3m5s"),
            (Duration::from_secs(3600), "1h0m0s"),
            (Duration::from_secs(3725), "1h2m5s"),
            (Duration::new(185, 123_456_789), "3m5.123456789s"),
        ];
        for (d, want) in cases {
            assert_eq!(go_duration(d), want, "{d:?}");
        }
    }
}
