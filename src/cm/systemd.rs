//! The systemd cgroup driver: the kubelet's cgroups are systemd slices, made and stopped through
//! systemd's D-Bus API (`StartTransientUnit`, `SetUnitProperties`, `StopUnit`), as upstream's
//! (runc's) systemd cgroup manager does. A cgroup name (`<cgroupRoot parts>`, `kubepods`,
//! `burstable`, `pod<uid>`) becomes slice names by systemd's own rule: each part escaped (`-` is
//! `_`), joined by `-`, `.slice` added, every prefix a parent slice:
//!
//! ```text
//! kubepods                          /kubepods.slice
//! kubepods burstable pod<uid>       /kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod<uid with _>.slice
//! ```
//!
//! The values are given to systemd as unit properties (`CPUWeight`, `CPUQuotaPerSecUSec`,
//! `CPUQuotaPeriodUSec`, `MemoryMax`, `TasksMax`) so that a `daemon-reload` keeps them, and then
//! written to the cgroup files too (systemd's quota has a 10 ms granularity; the files get the
//! exact value), as runc does. The CRI `cgroup_parent` of a pod is its slice's name; the runtime
//! makes its own scopes under it. On cgroup v1 systemd makes a slice in the hierarchies it
//! manages (cpu, memory, pids, blkio, devices) and the others get it from the files, as runc's
//! v1 systemd manager does.
//!
//! The D-Bus calls run on a thread of their own (a small current-thread runtime holding the
//! connection), so the container manager stays synchronous.

use std::sync::mpsc as std_mpsc;
use std::time::Duration;

use tokio::sync::mpsc;
use zbus::zvariant::{OwnedObjectPath, Value};

use super::resources::{CFS_PERIOD_US, ResourceConfig};

/// How long a slice systemd was asked to make may take to appear in the cgroup filesystem,
/// or a stopped one to go.
pub const UNIT_WAIT: Duration = Duration::from_secs(10);

/// What the systemd driver could not do.
#[derive(Debug, thiserror::Error)]
pub enum SystemdError {
    #[error(
        "cgroupDriver systemd: cannot reach systemd on the system bus ({0}); is systemd the init \
         system? (on a machine without it, set cgroupDriver: cgroupfs)"
    )]
    Connect(Box<zbus::Error>),
    #[error(
        "cgroupDriver systemd: systemd is not this machine's init system (no /run/systemd/system); \
         set cgroupDriver: cgroupfs"
    )]
    NotBooted,
    #[error("systemd {call} {unit}: {source}")]
    Call {
        call: &'static str,
        unit: String,
        #[source]
        source: Box<zbus::Error>,
    },
    #[error("systemd made {unit} but its cgroup {path} did not appear within {UNIT_WAIT:?}")]
    NotRealized { unit: String, path: String },
    #[error("the systemd D-Bus worker is gone")]
    Gone,
}

#[zbus::proxy(
    interface = "org.freedesktop.systemd1.Manager",
    default_service = "org.freedesktop.systemd1",
    default_path = "/org/freedesktop/systemd1"
)]
trait Systemd1Manager {
    fn start_transient_unit(
        &self,
        name: &str,
        mode: &str,
        properties: &[(&str, Value<'_>)],
        aux: &[(&str, &[(&str, Value<'_>)])],
    ) -> zbus::Result<OwnedObjectPath>;

    fn set_unit_properties(
        &self,
        name: &str,
        runtime: bool,
        properties: &[(&str, Value<'_>)],
    ) -> zbus::Result<()>;

    fn stop_unit(&self, name: &str, mode: &str) -> zbus::Result<OwnedObjectPath>;
}

/// One D-Bus call for the worker.
enum Call {
    /// Makes the slice (or, when it is there, sets its properties).
    Start(String, Vec<Property>),
    Set(String, Vec<Property>),
    Stop(String),
}

/// A unit property as the worker sends it.
#[derive(Debug, Clone, PartialEq)]
pub enum Property {
    Bool(&'static str, bool),
    U64(&'static str, u64),
    Str(&'static str, String),
}

impl Property {
    fn value(&self) -> (&str, Value<'_>) {
        match self {
            Property::Bool(k, v) => (k, Value::from(*v)),
            Property::U64(k, v) => (k, Value::from(*v)),
            Property::Str(k, v) => (k, Value::from(v.as_str())),
        }
    }
}

type Reply = std_mpsc::Sender<Result<(), SystemdError>>;

/// A handle on the D-Bus worker thread.
pub struct Systemd {
    tx: mpsc::UnboundedSender<(Call, Reply)>,
    /// cgroup v1 (systemd's legacy hierarchy): CPU shares as `CPUShares`.
    legacy: bool,
}

impl Systemd {
    /// Connects to systemd on the system bus (from a thread of its own); `legacy`: the
    /// machine has cgroup v1.
    pub fn connect(legacy: bool) -> Result<Systemd, SystemdError> {
        // systemd's own test of having booted the machine (`sd_booted`).
        if !std::path::Path::new("/run/systemd/system").is_dir() {
            return Err(SystemdError::NotBooted);
        }
        let (tx, mut rx) = mpsc::unbounded_channel::<(Call, Reply)>();
        let (ready_tx, ready_rx) = std_mpsc::channel();
        std::thread::Builder::new()
            .name("cm-systemd".into())
            .spawn(move || {
                let rt = match tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                {
                    Ok(rt) => rt,
                    Err(e) => {
                        let _ = ready_tx.send(Err(SystemdError::Connect(Box::new(
                            zbus::Error::InputOutput(std::sync::Arc::new(e)),
                        ))));
                        return;
                    }
                };
                rt.block_on(async move {
                    let proxy = match connect().await {
                        Ok(p) => {
                            let _ = ready_tx.send(Ok(()));
                            p
                        }
                        Err(e) => {
                            let _ = ready_tx.send(Err(e));
                            return;
                        }
                    };
                    while let Some((call, reply)) = rx.recv().await {
                        let _ = reply.send(run(&proxy, call).await);
                    }
                });
            })
            .map_err(|e| {
                SystemdError::Connect(Box::new(zbus::Error::InputOutput(std::sync::Arc::new(e))))
            })?;
        ready_rx.recv().map_err(|_| SystemdError::Gone)??;
        Ok(Systemd { tx, legacy })
    }

    fn call(&self, call: Call) -> Result<(), SystemdError> {
        let (reply, rx) = std_mpsc::channel();
        self.tx
            .send((call, reply))
            .map_err(|_| SystemdError::Gone)?;
        rx.recv().map_err(|_| SystemdError::Gone)?
    }

    /// Makes the slice `unit` with `config`'s values (when it exists already, as after an
    /// agent restart, its properties are set instead).
    pub fn start_slice(&self, unit: &str, config: &ResourceConfig) -> Result<(), SystemdError> {
        let mut props = vec![
            Property::Str("Description", format!("nodelet pod cgroup {unit}")),
            Property::Bool("DefaultDependencies", false),
            Property::Bool("MemoryAccounting", true),
            Property::Bool("CPUAccounting", true),
            Property::Bool("IOAccounting", true),
            Property::Bool("TasksAccounting", true),
        ];
        props.extend(properties(config, self.legacy));
        self.call(Call::Start(unit.to_string(), props))
    }

    /// Gives the slice `unit` `config`'s values as unit properties (nothing when it sets none).
    pub fn set(&self, unit: &str, config: &ResourceConfig) -> Result<(), SystemdError> {
        let props = properties(config, self.legacy);
        if props.is_empty() {
            return Ok(());
        }
        self.call(Call::Set(unit.to_string(), props))
    }

    /// Stops the unit `unit` (systemd kills what still runs in it and removes its cgroup).
    pub fn stop(&self, unit: &str) -> Result<(), SystemdError> {
        self.call(Call::Stop(unit.to_string()))
    }
}

async fn connect() -> Result<Systemd1ManagerProxy<'static>, SystemdError> {
    let conn = zbus::Connection::system()
        .await
        .map_err(|e| SystemdError::Connect(Box::new(e)))?;
    Systemd1ManagerProxy::new(&conn)
        .await
        .map_err(|e| SystemdError::Connect(Box::new(e)))
}

async fn run(proxy: &Systemd1ManagerProxy<'static>, call: Call) -> Result<(), SystemdError> {
    let err = |call: &'static str, unit: &str| {
        let unit = unit.to_string();
        move |source| SystemdError::Call {
            call,
            unit,
            source: Box::new(source),
        }
    };
    match call {
        Call::Start(unit, props) => {
            let values: Vec<(&str, Value<'_>)> = props.iter().map(Property::value).collect();
            match proxy
                .start_transient_unit(&unit, "replace", &values, &[])
                .await
            {
                Ok(_) => Ok(()),
                Err(zbus::Error::MethodError(name, _, _))
                    if name.as_str() == "org.freedesktop.systemd1.UnitExists" =>
                {
                    // Made by an earlier agent: its values are set again.
                    let resources: Vec<(&str, Value<'_>)> = props
                        .iter()
                        .filter(|p| is_resource(p))
                        .map(Property::value)
                        .collect();
                    proxy
                        .set_unit_properties(&unit, true, &resources)
                        .await
                        .map_err(err("SetUnitProperties", &unit))
                }
                Err(e) => Err(err("StartTransientUnit", &unit)(e)),
            }
        }
        Call::Set(unit, props) => {
            let values: Vec<(&str, Value<'_>)> = props.iter().map(Property::value).collect();
            proxy
                .set_unit_properties(&unit, true, &values)
                .await
                .map_err(err("SetUnitProperties", &unit))
        }
        Call::Stop(unit) => match proxy.stop_unit(&unit, "replace").await {
            Ok(_) => Ok(()),
            Err(zbus::Error::MethodError(name, _, _))
                if name.as_str() == "org.freedesktop.systemd1.NoSuchUnit" =>
            {
                Ok(())
            }
            Err(e) => Err(err("StopUnit", &unit)(e)),
        },
    }
}

fn is_resource(p: &Property) -> bool {
    matches!(
        p,
        Property::U64(
            "CPUWeight"
                | "CPUShares"
                | "CPUQuotaPerSecUSec"
                | "CPUQuotaPeriodUSec"
                | "MemoryMax"
                | "TasksMax",
            _
        )
    )
}

/// `config`'s values as systemd unit properties: shares as `CPUWeight` on v2 (the same
/// conversion as the files) and as `CPUShares` on v1 (`legacy`, as runc's v1 systemd manager
/// gives them: systemd would turn a weight back into other shares than the file's), the CFS
/// quota per second rounded up to systemd's 10 ms, limits of -1 as infinity (`u64::MAX`;
/// systemd applies `MemoryMax` as `memory.limit_in_bytes` on v1).
pub fn properties(config: &ResourceConfig, legacy: bool) -> Vec<Property> {
    let mut out = Vec::new();
    if let Some(shares) = config.cpu_shares {
        out.push(if legacy {
            Property::U64("CPUShares", shares.max(2))
        } else {
            Property::U64(
                "CPUWeight",
                super::cgroupfs::shares_to_weight(shares).max(1),
            )
        });
    }
    if config.cpu_quota.is_some() || config.cpu_period.is_some() {
        let period = config.cpu_period.unwrap_or(CFS_PERIOD_US).max(1);
        let per_sec = match config.cpu_quota.filter(|q| *q > 0) {
            Some(q) => {
                let us = (q as u64).saturating_mul(1_000_000) / period;
                us.div_ceil(10_000) * 10_000
            }
            None => u64::MAX,
        };
        out.push(Property::U64("CPUQuotaPeriodUSec", period));
        out.push(Property::U64("CPUQuotaPerSecUSec", per_sec));
    }
    // A limit of -1 (none) is systemd's infinity.
    let limit = |l: i64| u64::try_from(l).ok().filter(|l| *l > 0).unwrap_or(u64::MAX);
    if let Some(l) = config.memory_limit {
        out.push(Property::U64("MemoryMax", limit(l)));
    }
    if let Some(l) = config.pids_limit {
        out.push(Property::U64("TasksMax", limit(l)));
    }
    out
}

/// systemd's escape of one cgroup name part for a slice name (upstream's
/// `escapeSystemdCgroupName`): `-` separates slice levels, so it becomes `_`.
fn escape(part: &str) -> String {
    part.replace('-', "_")
}

/// The slice name of the cgroup `parts` (`["kubepods", "burstable"]` is
/// `kubepods-burstable.slice`).
pub fn slice_name(parts: &[&str]) -> String {
    let escaped: Vec<String> = parts.iter().map(|p| escape(p)).collect();
    format!("{}.slice", escaped.join("-"))
}

/// The cgroupfs path of the slice of `parts`: each prefix a slice
/// (`/kubepods.slice/kubepods-burstable.slice`).
pub fn slice_path(parts: &[&str]) -> String {
    let mut out = String::new();
    for i in 1..=parts.len() {
        out.push('/');
        out.push_str(&slice_name(&parts[..i]));
    }
    if out.is_empty() {
        out.push('/');
    }
    out
}

/// The pod UID a pod slice's name carries (`kubepods-burstable-pod12_34.slice` is `12-34`).
pub fn pod_uid(slice: &str) -> Option<String> {
    let stem = slice.strip_suffix(".slice")?;
    let last = stem.rsplit('-').next()?;
    let uid = last.strip_prefix("pod")?;
    (!uid.is_empty()).then(|| uid.replace('_', "-"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slice_names_and_paths_as_systemd_expands_them() {
        assert_eq!(slice_name(&["kubepods"]), "kubepods.slice");
        assert_eq!(
            slice_path(&["kubepods", "burstable", "pod12-34"]),
            "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod12_34.slice"
        );
        assert_eq!(
            slice_path(&["nl-e2e", "kubepods"]),
            "/nl_e2e.slice/nl_e2e-kubepods.slice"
        );
        assert_eq!(
            pod_uid("kubepods-besteffort-pod12_34_ab.slice").as_deref(),
            Some("12-34-ab")
        );
        assert_eq!(pod_uid("kubepods-burstable.slice"), None);
        assert_eq!(pod_uid("kubepods-pod.slice"), None);
        assert_eq!(pod_uid("nodelet-x.scope"), None);
    }

    #[test]
    fn properties_follow_the_cgroup_values() {
        let g = ResourceConfig {
            cpu_shares: Some(204),
            cpu_quota: Some(20_000),
            cpu_period: Some(100_000),
            memory_limit: Some(64 << 20),
            pids_limit: Some(-1),
        };
        assert_eq!(
            properties(&g, false),
            vec![
                Property::U64("CPUWeight", 29),
                Property::U64("CPUQuotaPeriodUSec", 100_000),
                Property::U64("CPUQuotaPerSecUSec", 200_000),
                Property::U64("MemoryMax", 64 << 20),
                Property::U64("TasksMax", u64::MAX),
            ]
        );
        // 1 ms of quota a 100 ms period is 10 ms a second; 1.5 ms is rounded up to 20.
        let q = |quota| {
            properties(
                &ResourceConfig {
                    cpu_quota: Some(quota),
                    ..Default::default()
                },
                false,
            )[1]
            .clone()
        };
        assert_eq!(q(1000), Property::U64("CPUQuotaPerSecUSec", 10_000));
        assert_eq!(q(1500), Property::U64("CPUQuotaPerSecUSec", 20_000));
        assert_eq!(q(-1), Property::U64("CPUQuotaPerSecUSec", u64::MAX));
        assert!(properties(&ResourceConfig::default(), false).is_empty());
        // cgroup v1: the shares themselves (at least systemd's minimum), the rest the same.
        let v1 = properties(&g, true);
        assert_eq!(v1[0], Property::U64("CPUShares", 204));
        assert_eq!(v1[1..], properties(&g, false)[1..]);
        let best_effort = ResourceConfig {
            cpu_shares: Some(2),
            ..Default::default()
        };
        assert_eq!(
            properties(&best_effort, true),
            vec![Property::U64("CPUShares", 2)]
        );
    }
}
