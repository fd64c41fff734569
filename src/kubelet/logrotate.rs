//! Container log rotation, as upstream's container log manager: every
//! `containerLogMonitorInterval` the running containers' CRI log files are checked, and one
//! larger than `containerLogMaxSize` is rotated. A rotation first removes what an interrupted one
//! left (`.tmp` files, a rotated file whose compressed copy exists), then the oldest rotated
//! files so that at most `containerLogMaxFiles` - 2 are left, compresses every rotated file not
//! compressed yet (`<log>.<time>.gz`), and last renames the log to `<log>.<YYYYmmdd-HHMMSS>`
//! and asks the runtime to reopen it (ReopenContainerLog); if the runtime cannot, the rename is
//! undone. So a container has at most `containerLogMaxFiles` files: the current one, the newest
//! rotated one as it was, and older ones gzipped. `containerLogMaxWorkers` containers are
//! rotated at once.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use futures::StreamExt;
use runtime::{RuntimeService, cri};
use tokio_util::sync::CancellationToken;

use crate::config::ContainerLogConfig;

/// What a rotated file's name adds to the log's: `.` and the time of the rotation.
const TIME_FORMAT: &str = "%Y%m%d-%H%M%S";
const GZ: &str = ".gz";
const TMP: &str = ".tmp";

/// Checks and rotates the running containers' logs every monitor interval until `cancel`.
pub async fn run(rt: Arc<dyn RuntimeService>, cfg: ContainerLogConfig, cancel: CancellationToken) {
    let mut tick = tokio::time::interval(cfg.monitor_interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = tick.tick() => rotate_all(rt.as_ref(), &cfg).await,
        }
    }
}

/// One round: every running container, `max_workers` at a time.
pub async fn rotate_all(rt: &dyn RuntimeService, cfg: &ContainerLogConfig) {
    let filter = cri::ContainerFilter {
        state: Some(cri::ContainerStateValue {
            state: cri::ContainerState::ContainerRunning as i32,
        }),
        ..Default::default()
    };
    let containers = match rt
        .list_containers(cri::ListContainersRequest {
            filter: Some(filter),
        })
        .await
    {
        Ok(r) => r.containers,
        Err(e) => {
            tracing::warn!("container log rotation: listing containers: {e}");
            return;
        }
    };
    futures::stream::iter(containers)
        .for_each_concurrent(cfg.max_workers, |c| async move {
            if let Err(e) = rotate_if_needed(rt, &c.id, cfg).await {
                tracing::warn!(container = %c.id, "container log rotation: {e}");
            }
        })
        .await;
}

/// Why a container's log could not be rotated.
#[derive(Debug, thiserror::Error)]
enum RotateError {
    #[error("reading its status: {0}")]
    Status(#[source] runtime::Error),
    #[error("no status")]
    NoStatus,
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{0}")]
    Join(#[from] tokio::task::JoinError),
    #[error("renaming {} to {}: {source}", from.display(), to.display())]
    Rename {
        from: PathBuf,
        to: PathBuf,
        source: std::io::Error,
    },
    #[error("reopening the log: {0}")]
    Reopen(#[source] runtime::Error),
}

/// Rotates container `id`'s log if it is larger than the limit.
async fn rotate_if_needed(
    rt: &dyn RuntimeService,
    id: &str,
    cfg: &ContainerLogConfig,
) -> Result<(), RotateError> {
    let status = rt
        .container_status(cri::ContainerStatusRequest {
            container_id: id.to_string(),
            verbose: false,
        })
        .await
        .map_err(RotateError::Status)?
        .status
        .ok_or(RotateError::NoStatus)?;
    if status.log_path.is_empty() || status.state != cri::ContainerState::ContainerRunning as i32 {
        return Ok(());
    }
    let log = PathBuf::from(&status.log_path);
    let size = match tokio::fs::metadata(&log).await {
        Ok(m) => m.len(),
        // Not written yet, or being rotated by someone else.
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(source) => return Err(RotateError::Io { path: log, source }),
    };
    if size < cfg.max_size {
        return Ok(());
    }
    let max_files = cfg.max_files;
    let prepared = log.clone();
    tokio::task::spawn_blocking(move || prepare(&prepared, max_files))
        .await?
        .map_err(|source| RotateError::Io {
            path: log.clone(),
            source,
        })?;
    let rotated = rotated_name(&log, chrono::Utc::now());
    if let Err(source) = std::fs::rename(&log, &rotated) {
        let (from, to) = (log, rotated);
        return Err(RotateError::Rename { from, to, source });
    }
    if let Err(e) = rt
        .reopen_container_log(cri::ReopenContainerLogRequest {
            container_id: id.to_string(),
        })
        .await
    {
        // The runtime still writes to the renamed file: give it its name back.
        if let Err(back) = std::fs::rename(&rotated, &log) {
            tracing::error!(
                "renaming {} back to {}: {back}",
                rotated.display(),
                log.display()
            );
        }
        return Err(RotateError::Reopen(e));
    }
    tracing::debug!(container = %id, "rotated {} to {}", log.display(), rotated.display());
    Ok(())
}

/// The name `log` is rotated to at `now`: `<log>.<YYYYmmdd-HHMMSS>`, with `-<n>` added when a
/// rotation in the same second took that name.
fn rotated_name(log: &Path, now: chrono::DateTime<chrono::Utc>) -> PathBuf {
    let base = format!("{}.{}", log.display(), now.format(TIME_FORMAT));
    let mut name = PathBuf::from(&base);
    let mut n = 1;
    while name.exists() || PathBuf::from(format!("{}{GZ}", name.display())).exists() {
        name = PathBuf::from(format!("{base}-{n}"));
        n += 1;
    }
    name
}

/// The rotated files of `log` (`<log>.<something>`, temporary ones included), sorted by name,
/// which is by time.
fn rotated_files(log: &Path) -> std::io::Result<Vec<PathBuf>> {
    let (Some(dir), Some(name)) = (log.parent(), log.file_name()) else {
        return Ok(Vec::new());
    };
    let prefix = format!("{}.", name.to_string_lossy());
    let mut out: Vec<PathBuf> = std::fs::read_dir(dir)?
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with(&prefix))
        .map(|e| e.path())
        .collect();
    out.sort();
    Ok(out)
}

/// Everything before the rename (see the module doc): afterwards `log` has at most
/// `max_files` - 2 rotated files, all compressed.
fn prepare(log: &Path, max_files: usize) -> std::io::Result<()> {
    // What an interrupted rotation left: temporary files, and originals of compressed files.
    let files = rotated_files(log)?;
    for f in &files {
        let name = f.to_string_lossy();
        let compressed = PathBuf::from(format!("{name}{GZ}"));
        if name.ends_with(TMP) || (!name.ends_with(GZ) && files.contains(&compressed)) {
            remove(f)?;
        }
    }
    // The oldest go, so that the one about to be rotated and the current log fit.
    let files = rotated_files(log)?;
    let keep = max_files.saturating_sub(2);
    if files.len() > keep {
        for f in &files[..files.len() - keep] {
            remove(f)?;
        }
    }
    for f in rotated_files(log)? {
        if !f.to_string_lossy().ends_with(GZ) {
            compress(&f)?;
        }
    }
    Ok(())
}

fn remove(f: &Path) -> std::io::Result<()> {
    match std::fs::remove_file(f) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

/// Gzips `f` into `<f>.gz` (through a temporary file, so a crash leaves no half file under the
/// final name) and removes `f`.
fn compress(f: &Path) -> std::io::Result<()> {
    let gz = PathBuf::from(format!("{}{GZ}", f.display()));
    let tmp = PathBuf::from(format!("{}{TMP}", gz.display()));
    let mut src = std::fs::File::open(f)?;
    let out = std::fs::File::create(&tmp)?;
    let mut enc = flate2::write::GzEncoder::new(out, flate2::Compression::default());
    let written = std::io::copy(&mut src, &mut enc)
        .and_then(|_| enc.finish())
        .and_then(|mut out| out.flush().map(|()| out))
        .and_then(|out| out.sync_all());
    if let Err(e) = written {
        let _ = std::fs::remove_file(&tmp);
        return Err(e);
    }
    std::fs::rename(&tmp, &gz)?;
    remove(f)
}

#[cfg(test)]
mod tests;
