//! Image garbage collection's settings, upstream's fields: `imageGCHighThresholdPercent` (at or
//! above this disk usage of the image filesystem, images are removed), `imageGCLowThresholdPercent`
//! (until usage is below this), `imageMinimumGCAge` (an image seen more recently is never
//! removed) and `imageMaximumGCAge` (an image unused for longer is removed whatever the usage;
//! 0: never). Checked as upstream's validation does. `crate::kubelet::image_gc` applies them.

use std::time::Duration;

use super::{Error, Typed, get, invalid};

/// The image garbage collector's policy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImageGcConfig {
    /// 0-100; 100 turns collection by usage off.
    pub high_threshold_percent: u8,
    /// 0-100, below the high threshold.
    pub low_threshold_percent: u8,
    pub minimum_age: Duration,
    /// `None`: images are never removed for their age alone.
    pub maximum_age: Option<Duration>,
}

impl Default for ImageGcConfig {
    fn default() -> Self {
        ImageGcConfig {
            high_threshold_percent: 85,
            low_threshold_percent: 80,
            minimum_age: Duration::from_secs(120),
            maximum_age: None,
        }
    }
}

/// The fields as written.
pub(super) struct RawImageGc {
    pub high: Option<Typed<i64>>,
    pub low: Option<Typed<i64>>,
    pub minimum_age: Option<Typed<Duration>>,
    pub maximum_age: Option<Typed<Duration>>,
}

impl RawImageGc {
    pub fn into_config(self) -> Result<ImageGcConfig, Error> {
        let d = ImageGcConfig::default();
        let percent = |field: &str, v: Option<Typed<i64>>, default: u8| match get(v) {
            None => Ok(default),
            Some(p) => u8::try_from(p)
                .ok()
                .filter(|p| *p <= 100)
                .ok_or_else(|| invalid(field, format!("{p} must be between 0 and 100"))),
        };
        let high = percent(
            "imageGCHighThresholdPercent",
            self.high,
            d.high_threshold_percent,
        )?;
        let low = percent(
            "imageGCLowThresholdPercent",
            self.low,
            d.low_threshold_percent,
        )?;
        if low >= high {
            return Err(invalid(
                "imageGCLowThresholdPercent",
                format!("{low} must be less than imageGCHighThresholdPercent ({high})"),
            ));
        }
        let minimum_age = get(self.minimum_age).unwrap_or(d.minimum_age);
        let maximum_age = get(self.maximum_age).filter(|a| !a.is_zero());
        if let Some(max) = maximum_age.filter(|m| *m < minimum_age) {
            return Err(invalid(
                "imageMaximumGCAge",
                format!(
                    "{} must not be less than imageMinimumGCAge ({})",
                    crate::util::go_duration(max),
                    crate::util::go_duration(minimum_age)
                ),
            ));
        }
        Ok(ImageGcConfig {
            high_threshold_percent: high,
            low_threshold_percent: low,
            minimum_age,
            maximum_age,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raw(high: Option<i64>, low: Option<i64>, min: u64, max: Option<u64>) -> RawImageGc {
        RawImageGc {
            high: high.map(Typed),
            low: low.map(Typed),
            minimum_age: Some(Typed(Duration::from_secs(min))),
            maximum_age: max.map(|m| Typed(Duration::from_secs(m))),
        }
    }

    #[test]
    fn thresholds_and_ages_as_upstream_checks_them() {
        let c = raw(None, None, 120, Some(0)).into_config().unwrap();
        assert_eq!(c, ImageGcConfig::default());
        let c = raw(Some(100), Some(5), 0, Some(3600))
            .into_config()
            .unwrap();
        assert_eq!(
            (c.high_threshold_percent, c.low_threshold_percent),
            (100, 5)
        );
        assert_eq!(c.maximum_age, Some(Duration::from_secs(3600)));
        let err = |r: RawImageGc| r.into_config().unwrap_err().to_string();
        assert_eq!(
            err(raw(Some(101), None, 0, None)),
            "imageGCHighThresholdPercent: 101 must be between 0 and 100"
        );
        assert!(err(raw(None, Some(-1), 0, None)).starts_with("imageGCLowThresholdPercent: -1"));
        assert_eq!(
            err(raw(Some(50), Some(50), 0, None)),
            "imageGCLowThresholdPercent: 50 must be less than imageGCHighThresholdPercent (50)"
        );
        assert_eq!(
            err(raw(None, None, 120, Some(60))),
            "imageMaximumGCAge: 1m0s must not be less than imageMinimumGCAge (2m0s)"
        );
    }
}
