//! CRI endpoint addresses: what `--listen` and `--container-runtime-endpoint`-style flags
//! accept, and the unix socket path they name. Owned here so the server and the remote client
//! agree on the syntax: `unix:///abs/path.sock`, or a plain path. Nothing else is supported (no
//! TCP: CRI carries no authentication, so it stays on a local socket).

use std::path::PathBuf;

use crate::{Error, Result};

/// The scheme prefix of a unix socket endpoint.
pub const UNIX_SCHEME: &str = "unix://";

/// The socket path named by `endpoint`: `unix:///run/x.sock` and `/run/x.sock` both give
/// `/run/x.sock`. An empty endpoint, an empty path or another scheme (`tcp://`, `npipe://`) is
/// `InvalidArgument`.
pub fn unix_socket_path(endpoint: &str) -> Result<PathBuf> {
    let endpoint = endpoint.trim();
    let path = match endpoint.strip_prefix(UNIX_SCHEME) {
        Some(path) => path,
        None if endpoint.contains("://") => {
            return Err(Error::invalid_argument(format!(
                "CRI endpoint {endpoint:?}: only unix sockets are supported (unix:///path)"
            )));
        }
        None => endpoint,
    };
    if path.is_empty() {
        return Err(Error::invalid_argument(format!(
            "CRI endpoint {endpoint:?} names no socket path"
        )));
    }
    Ok(PathBuf::from(path))
}

/// The endpoint for a socket path, as `unix://<path>`.
pub fn unix_endpoint(path: &std::path::Path) -> String {
    format!("{UNIX_SCHEME}{}", path.display())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unix_endpoints_and_plain_paths_are_accepted() {
        assert_eq!(
            unix_socket_path("unix:///run/containerd/containerd.sock").unwrap(),
            PathBuf::from("/run/containerd/containerd.sock")
        );
        assert_eq!(
            unix_socket_path("/run/nodelet/cri.sock").unwrap(),
            PathBuf::from("/run/nodelet/cri.sock")
        );
        assert_eq!(
            unix_socket_path("relative.sock").unwrap(),
            PathBuf::from("relative.sock")
        );
        let p = std::path::Path::new("/tmp/x.sock");
        assert_eq!(unix_socket_path(&unix_endpoint(p)).unwrap(), p);
    }

    #[test]
    fn other_schemes_and_empty_paths_are_invalid() {
        for bad in [
            "",
            "unix://",
            "tcp://127.0.0.1:1234",
            "npipe:////./pipe/x",
            "  ",
        ] {
            let err = unix_socket_path(bad).unwrap_err();
            assert_eq!(err.code(), crate::Code::InvalidArgument, "{bad:?}: {err}");
        }
    }
}
