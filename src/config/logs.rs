//! Container log rotation settings (`containerLogMaxSize`, `containerLogMaxFiles`,
//! `containerLogMaxWorkers`, `containerLogMonitorInterval`), with upstream's defaults and
//! checks. The rotation itself is `kubelet::logrotate`.

use std::time::Duration;

use serde::Deserialize;

use super::{Error, Typed, get, invalid};
use crate::util::quantity::parse_bytes;

/// How the kubelet rotates the containers' CRI log files.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContainerLogConfig {
    /// A log larger than this many bytes is rotated (`containerLogMaxSize`, default `10Mi`).
    pub max_size: u64,
    /// At most this many files per container, the current one included
    /// (`containerLogMaxFiles`, default 5, at least 2).
    pub max_files: usize,
    /// How many containers' logs are rotated at once (`containerLogMaxWorkers`, default 1).
    pub max_workers: usize,
    /// How often the logs' sizes are checked (`containerLogMonitorInterval`, default 10 s, at
    /// least 3 s).
    pub monitor_interval: Duration,
}

impl Default for ContainerLogConfig {
    fn default() -> Self {
        ContainerLogConfig {
            max_size: 10 * 1024 * 1024,
            max_files: 5,
            max_workers: 1,
            monitor_interval: Duration::from_secs(10),
        }
    }
}

/// The fields as written (see `RawConfig`).
#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
pub(super) struct RawContainerLogs {
    container_log_max_size: Option<Typed<String>>,
    container_log_max_files: Option<Typed<i64>>,
    container_log_max_workers: Option<Typed<i64>>,
    container_log_monitor_interval: Option<Typed<Duration>>,
}

impl RawContainerLogs {
    pub(super) fn into_config(self) -> Result<ContainerLogConfig, Error> {
        let d = ContainerLogConfig::default();
        let max_size = match get(self.container_log_max_size) {
            None => d.max_size,
            Some(s) => match parse_bytes(&s) {
                Ok(n) if n > 0 => n.unsigned_abs(),
                _ => {
                    return Err(invalid(
                        "containerLogMaxSize",
                        format!("{s:?} is not a positive quantity of bytes"),
                    ));
                }
            },
        };
        let max_files = match get(self.container_log_max_files) {
            None => d.max_files,
            Some(n) if n >= 2 => usize::try_from(n).unwrap_or(usize::MAX),
            Some(n) => {
                return Err(invalid(
                    "containerLogMaxFiles",
                    format!("{n}: must be greater than 1"),
                ));
            }
        };
        let max_workers = match get(self.container_log_max_workers) {
            None => d.max_workers,
            Some(n) if n >= 1 => usize::try_from(n).unwrap_or(usize::MAX),
            Some(n) => {
                return Err(invalid(
                    "containerLogMaxWorkers",
                    format!("{n}: must be at least 1"),
                ));
            }
        };
        let monitor_interval = match get(self.container_log_monitor_interval) {
            None => d.monitor_interval,
            Some(i) if i >= Duration::from_secs(3) => i,
            Some(i) => {
                return Err(invalid(
                    "containerLogMonitorInterval",
                    format!("{i:?}: must be at least 3s"),
                ));
            }
        };
        Ok(ContainerLogConfig {
            max_size,
            max_files,
            max_workers,
            monitor_interval,
        })
    }
}
