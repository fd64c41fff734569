//! The unix sockets the device manager serves on: the directory made with its mode, a stale
//! socket replaced, the socket given its mode, and connections accepted with a pause after an
//! error (typically EMFILE) instead of a spinning loop.

use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};

use futures::Stream;
use tokio::net::{UnixListener, UnixStream};

/// Binds `<dir>/<name>` (`dir` made, and set, to `dir_mode`; the socket set to `socket_mode`
/// when given) and returns its path and its connections; `what` names it in the log.
pub fn bind(
    dir: &Path,
    name: &str,
    dir_mode: u32,
    socket_mode: Option<u32>,
    what: &'static str,
) -> std::io::Result<(
    PathBuf,
    impl Stream<Item = std::io::Result<UnixStream>> + Send + use<>,
)> {
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(dir_mode)
        .create(dir)?;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(dir_mode))?;
    let socket = dir.join(name);
    match std::fs::remove_file(&socket) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    let listener = UnixListener::bind(&socket)?;
    if let Some(mode) = socket_mode {
        std::fs::set_permissions(&socket, std::fs::Permissions::from_mode(mode))?;
    }
    let incoming = futures::stream::unfold(listener, move |l| async move {
        let conn = l.accept().await.map(|(io, _)| io);
        if let Err(e) = &conn {
            tracing::warn!("{what}: accepting a connection: {e}");
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
        Some((conn, l))
    });
    tracing::info!(socket = %socket.display(), "{what} serving");
    Ok((socket, incoming))
}
