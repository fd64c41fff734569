//! `nodeletTesting`: knobs for the end-to-end tests only, so that they need not wait minutes
//! for a back-off, an image collection or an eviction cycle.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::Deserialize;
use serde_json::Value;

use super::values::Testing;
use super::{Error, Typed, invalid, positive, unknown};

/// Test-only knobs (`nodeletTesting`), so end-to-end tests need not wait minutes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TestingConfig {
    /// First back-off after a container crash (`crashLoopBackOffInitial`, default 10s).
    pub crash_loop_back_off_initial: Duration,
    /// Back-off ceiling (`crashLoopBackOffMax`, default 5m).
    pub crash_loop_back_off_max: Duration,
    /// How often images are garbage collected (`imageGCPeriod`, default upstream's 5m).
    pub image_gc_period: Duration,
    /// How often the eviction manager observes its signals (`evictionMonitoringPeriod`,
    /// default upstream's 10s).
    pub eviction_monitoring_period: Duration,
}

impl Default for TestingConfig {
    fn default() -> Self {
        TestingConfig {
            crash_loop_back_off_initial: Duration::from_secs(10),
            crash_loop_back_off_max: Duration::from_secs(300),
            image_gc_period: Duration::from_secs(300),
            eviction_monitoring_period: Duration::from_secs(10),
        }
    }
}

/// `nodeletTesting` as written.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct RawTesting {
    crash_loop_back_off_initial: Option<Typed<Duration>>,
    crash_loop_back_off_max: Option<Typed<Duration>>,
    #[serde(rename = "imageGCPeriod")]
    image_gc_period: Option<Typed<Duration>>,
    eviction_monitoring_period: Option<Typed<Duration>>,
    #[serde(flatten)]
    other: BTreeMap<String, Value>,
}

/// `nodeletTesting`, its unknown fields added to `warnings`.
pub(super) fn testing(
    field: Option<Testing>,
    default: TestingConfig,
    warnings: &mut Vec<String>,
) -> Result<TestingConfig, Error> {
    let Some(Testing(t)) = field else {
        return Ok(default);
    };
    warnings.extend(
        t.other
            .keys()
            .map(|k| unknown(&format!("nodeletTesting.{k}"))),
    );
    t.into_config()
}

impl RawTesting {
    fn into_config(self) -> Result<TestingConfig, Error> {
        let d = TestingConfig::default();
        let t = TestingConfig {
            crash_loop_back_off_initial: positive(
                "nodeletTesting.crashLoopBackOffInitial",
                self.crash_loop_back_off_initial,
                d.crash_loop_back_off_initial,
            )?,
            crash_loop_back_off_max: positive(
                "nodeletTesting.crashLoopBackOffMax",
                self.crash_loop_back_off_max,
                d.crash_loop_back_off_max,
            )?,
            image_gc_period: positive(
                "nodeletTesting.imageGCPeriod",
                self.image_gc_period,
                d.image_gc_period,
            )?,
            eviction_monitoring_period: positive(
                "nodeletTesting.evictionMonitoringPeriod",
                self.eviction_monitoring_period,
                d.eviction_monitoring_period,
            )?,
        };
        if t.crash_loop_back_off_max < t.crash_loop_back_off_initial {
            return Err(invalid(
                "nodeletTesting.crashLoopBackOffMax",
                "must be >= crashLoopBackOffInitial",
            ));
        }
        Ok(t)
    }
}
