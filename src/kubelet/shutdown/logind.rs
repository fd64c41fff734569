//! The shutdown sequence's trigger under systemd-logind, as upstream's node shutdown manager
//! does it on Linux: at start the agent makes sure logind's `InhibitDelayMaxSec` is at least the
//! shutdown grace period (writing a logind.conf drop-in and making logind read it again when it
//! is not) and takes a *delay* inhibitor lock on shutdown. When logind announces the shutdown
//! (`PrepareForShutdown(true)`), the sequence runs and the lock is released, so the machine goes
//! down only once the pods are stopped and their statuses written (or logind's delay is up). A
//! cancelled shutdown (`PrepareForShutdown(false)`) lifts the shutting-down state and takes the
//! lock again. When the bus goes away (D-Bus or logind restarted), the watch starts over.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use tokio_util::sync::CancellationToken;
use zbus::proxy::CacheProperties;
use zbus::zvariant::OwnedFd;

use super::NodeShutdown;
use crate::api::events::{EventRecorder, EventType, Reason};

/// Where the drop-in raising logind's delay goes.
pub const LOGIND_CONF_DIR: &str = "/etc/systemd/logind.conf.d";
/// The drop-in's name: after upstream's `99-kubelet.conf`, so that nodelet's value wins.
const DROP_IN: &str = "99-nodelet.conf";
/// How long logind may take to read its configuration again after SIGHUP.
const RELOAD_WAIT: Duration = Duration::from_secs(3);
/// How often a lost bus is tried again (doubling up to [`MAX_RETRY`]).
const FIRST_RETRY: Duration = Duration::from_secs(1);
const MAX_RETRY: Duration = Duration::from_secs(30);

#[zbus::proxy(
    interface = "org.freedesktop.login1.Manager",
    default_service = "org.freedesktop.login1",
    default_path = "/org/freedesktop/login1"
)]
trait Login1Manager {
    /// Takes an inhibitor lock: held as long as the returned descriptor is open.
    fn inhibit(&self, what: &str, who: &str, why: &str, mode: &str) -> zbus::Result<OwnedFd>;

    #[zbus(property, name = "InhibitDelayMaxUSec")]
    fn inhibit_delay_max_usec(&self) -> zbus::Result<u64>;

    #[zbus(signal)]
    fn prepare_for_shutdown(&self, start: bool) -> zbus::Result<()>;
}

#[zbus::proxy(
    interface = "org.freedesktop.systemd1.Manager",
    default_service = "org.freedesktop.systemd1",
    default_path = "/org/freedesktop/systemd1"
)]
trait Systemd1Manager {
    fn kill_unit(&self, name: &str, whom: &str, signal: i32) -> zbus::Result<()>;
}

/// Why the logind watch could not start.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot reach systemd-logind on the system bus: {0}")]
    Bus(#[source] zbus::Error),
    #[error("systemd-logind: {what}: {source}")]
    Logind {
        what: &'static str,
        #[source]
        source: zbus::Error,
    },
    #[error("unable to override inhibit delay by shutdown manager: writing {path}: {source}")]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// Upstream's words.
    #[error(
        "node shutdown manager was unable to update logind InhibitDelayMaxSec to {} (ShutdownGracePeriod), current value of InhibitDelayMaxSec ({}) is less than requested ShutdownGracePeriod",
        crate::util::go_duration(*.requested),
        crate::util::go_duration(*.current)
    )]
    DelayTooShort {
        requested: Duration,
        current: Duration,
    },
}

fn failed(what: &'static str) -> impl FnOnce(zbus::Error) -> Error {
    move |source| Error::Logind { what, source }
}

/// A connection to logind.
struct Logind {
    conn: zbus::Connection,
    manager: Login1ManagerProxy<'static>,
}

impl Logind {
    async fn connect() -> Result<Logind, Error> {
        let conn = zbus::Connection::system().await.map_err(Error::Bus)?;
        let manager = Login1ManagerProxy::builder(&conn)
            .cache_properties(CacheProperties::No)
            .build()
            .await
            .map_err(Error::Bus)?;
        Ok(Logind { conn, manager })
    }

    /// logind's `InhibitDelayMaxSec`.
    async fn inhibit_delay(&self) -> Result<Duration, Error> {
        let usec = self
            .manager
            .inhibit_delay_max_usec()
            .await
            .map_err(failed("reading InhibitDelayMaxUSec"))?;
        Ok(Duration::from_micros(usec))
    }

    /// Makes logind's delay at least `wanted` (upstream's `OverrideInhibitDelay` and
    /// `ReloadLogindConf`): a drop-in in `conf_dir`, then SIGHUP to logind through systemd.
    async fn ensure_inhibit_delay(&self, wanted: Duration, conf_dir: &Path) -> Result<(), Error> {
        let current = self.inhibit_delay().await?;
        if current >= wanted {
            return Ok(());
        }
        let path = conf_dir.join(DROP_IN);
        write_drop_in(&path, wanted).map_err(|source| Error::Write {
            path: path.clone(),
            source,
        })?;
        let systemd = Systemd1ManagerProxy::new(&self.conn)
            .await
            .map_err(Error::Bus)?;
        systemd
            .kill_unit("systemd-logind.service", "all", libc_sighup())
            .await
            .map_err(failed(
                "asking systemd to send SIGHUP to systemd-logind.service",
            ))?;
        // logind reads the file again when it handles the signal, a moment later.
        let until = tokio::time::Instant::now() + RELOAD_WAIT;
        loop {
            let current = self.inhibit_delay().await?;
            if current >= wanted {
                tracing::info!(path = %path.display(), delay = ?current, "raised logind's InhibitDelayMaxSec to the shutdown grace period");
                return Ok(());
            }
            if tokio::time::Instant::now() >= until {
                return Err(Error::DelayTooShort {
                    requested: wanted,
                    current,
                });
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// A delay lock on shutdown, held until the descriptor is dropped.
    async fn inhibit(&self) -> Result<OwnedFd, Error> {
        self.manager
            .inhibit(
                "shutdown",
                "nodelet",
                "Kubelet needs time to handle node shutdown",
                "delay",
            )
            .await
            .map_err(failed("taking a delay inhibitor lock"))
    }
}

fn libc_sighup() -> i32 {
    nix::sys::signal::Signal::SIGHUP as i32
}

/// The drop-in's text: whole seconds, rounded up.
fn drop_in_text(wanted: Duration) -> String {
    let secs = wanted.as_secs() + u64::from(wanted.subsec_nanos() > 0);
    format!(
        "# Written by nodelet: logind waits this long for the node's pods to stop before the\n\
         # machine shuts down (its shutdownGracePeriod).\n[Login]\nInhibitDelayMaxSec={secs}\n"
    )
}

fn write_drop_in(path: &Path, wanted: Duration) -> std::io::Result<()> {
    let dir = path.parent().unwrap_or(Path::new("/"));
    std::fs::create_dir_all(dir)?;
    let tmp = path.with_extension("conf.tmp");
    std::fs::write(&tmp, drop_in_text(wanted))?;
    std::fs::rename(&tmp, path)
}

/// Watches logind for the node's shutdown until `cancel` (see the module's text). When logind
/// cannot be reached at start, says why once and gives up, as upstream does; a bus lost later
/// is tried again.
pub async fn watch(
    shutdown: Arc<NodeShutdown>,
    grace: Duration,
    conf_dir: PathBuf,
    events: EventRecorder,
    cancel: CancellationToken,
) {
    let mut started = false;
    let mut retry = FIRST_RETRY;
    loop {
        let outcome = tokio::select! {
            _ = cancel.cancelled() => return,
            r = watch_once(&shutdown, grace, &conf_dir, &events, &mut started) => r,
        };
        match outcome {
            Ok(()) => {
                tracing::warn!("lost systemd-logind's shutdown signals; watching again");
                retry = FIRST_RETRY;
            }
            Err(e) if !started => {
                tracing::error!(error = %e, "failed to start node shutdown manager: graceful node shutdown needs systemd-logind (or nodeletShutdownOnSigterm: true)");
                return;
            }
            Err(e) => {
                tracing::warn!(error = %e, retry = ?retry, "unable to watch the node for shutdown events");
            }
        }
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = tokio::time::sleep(retry) => {}
        }
        retry = (retry * 2).min(MAX_RETRY);
    }
}

/// One connection's watch: `Ok` when the signal stream ends.
async fn watch_once(
    shutdown: &NodeShutdown,
    grace: Duration,
    conf_dir: &Path,
    events: &EventRecorder,
    started: &mut bool,
) -> Result<(), Error> {
    let logind = Logind::connect().await?;
    logind.ensure_inhibit_delay(grace, conf_dir).await?;
    let mut signals = logind
        .manager
        .receive_prepare_for_shutdown()
        .await
        .map_err(failed("subscribing to PrepareForShutdown"))?;
    let mut lock = Some(logind.inhibit().await?);
    *started = true;
    tracing::info!(grace = ?grace, "holding a delay inhibitor lock on the node's shutdown");
    let node = events.node_ref();
    while let Some(signal) = signals.next().await {
        let start = match signal.args() {
            Ok(args) => args.start,
            Err(e) => {
                tracing::warn!(error = %e, "a PrepareForShutdown signal without its argument");
                continue;
            }
        };
        if start {
            tracing::info!("logind announced the node's shutdown");
            events.event(
                &node,
                EventType::Normal,
                Reason::NodeShutdown,
                "Shutdown manager detected shutdown event",
            );
            shutdown.run().await;
            // Released: logind goes on with the shutdown.
            drop(lock.take());
            tracing::info!("released the shutdown inhibitor lock");
        } else {
            tracing::info!("logind cancelled the node's shutdown");
            events.event(
                &node,
                EventType::Normal,
                Reason::NodeShutdown,
                "Shutdown manager detected shutdown cancellation",
            );
            shutdown.state.end();
            if lock.is_none() {
                lock = Some(logind.inhibit().await?);
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_drop_in_rounds_the_grace_period_up_to_whole_seconds() {
        let text = drop_in_text(Duration::from_millis(20_500));
        assert!(
            text.contains("\n[Login]\nInhibitDelayMaxSec=21\n"),
            "{text}"
        );
        let text = drop_in_text(Duration::from_secs(30));
        assert!(text.ends_with("InhibitDelayMaxSec=30\n"), "{text}");
    }

    #[test]
    fn the_drop_in_is_written_whole() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("logind.conf.d").join(DROP_IN);
        write_drop_in(&path, Duration::from_secs(45)).unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(text.ends_with("InhibitDelayMaxSec=45\n"), "{text}");
        let names: Vec<_> = std::fs::read_dir(path.parent().unwrap())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, [std::ffi::OsString::from(DROP_IN)]);
    }

    #[test]
    fn a_delay_too_short_is_reported_in_upstreams_words() {
        let e = Error::DelayTooShort {
            requested: Duration::from_secs(30),
            current: Duration::from_secs(5),
        };
        assert_eq!(
            e.to_string(),
            "node shutdown manager was unable to update logind InhibitDelayMaxSec to 30s (ShutdownGracePeriod), current value of InhibitDelayMaxSec (5s) is less than requested ShutdownGracePeriod"
        );
    }
}
