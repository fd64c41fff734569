//! Unix socket paths that fit `sun_path` (108 bytes) whatever the root dir: a path too long is
//! reached through an `O_PATH` descriptor of its directory, as `/proc/<pid>/fd/<n>/<name>`
//! (short, and valid for any process that may look into this one's descriptors, as libcontainer's
//! init does when it connects to a console socket). The socket itself stays where it is, so a
//! restarted agent finds it by its real path.

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

/// `sun_path`'s size, with its terminating NUL.
const SUN_PATH_MAX: usize = 108;

/// A path to bind or connect a unix socket at; keep it alive until the bind or connect is done.
#[derive(Debug)]
pub struct SocketPath {
    path: PathBuf,
    /// The directory's descriptor behind a `/proc/<pid>/fd/<n>` path.
    _dir: Option<File>,
}

impl SocketPath {
    /// `path` itself when it fits, else its short form through its directory.
    pub fn new(path: &Path) -> io::Result<SocketPath> {
        if path.as_os_str().len() < SUN_PATH_MAX {
            return Ok(SocketPath {
                path: path.to_path_buf(),
                _dir: None,
            });
        }
        let (Some(dir), Some(name)) = (path.parent(), path.file_name()) else {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{} names no socket in a directory", path.display()),
            ));
        };
        let dir = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC)
            .open(dir)?;
        let short = PathBuf::from(format!(
            "/proc/{}/fd/{}",
            std::process::id(),
            dir.as_raw_fd()
        ))
        .join(name);
        if short.as_os_str().len() >= SUN_PATH_MAX {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("socket name {name:?} is too long for a unix socket"),
            ));
        }
        Ok(SocketPath {
            path: short,
            _dir: Some(dir),
        })
    }

    /// The path to bind or connect at.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::net::{UnixListener, UnixStream};

    #[test]
    fn a_socket_under_a_long_directory_binds_and_connects() {
        let top = tempfile::tempdir().expect("tempdir");
        let deep = top.path().join("a".repeat(90)).join("b".repeat(40));
        std::fs::create_dir_all(&deep).expect("mkdir");
        let sock = deep.join("sandbox.sock");
        assert!(sock.as_os_str().len() > 108);
        assert!(UnixListener::bind(&sock).is_err(), "too long as it is");
        let listener = {
            let p = SocketPath::new(&sock).expect("short path");
            assert!(p.path().starts_with("/proc/"));
            UnixListener::bind(p.path()).expect("bind")
        };
        // The socket is at its real path, and reachable through another short path.
        assert!(sock.exists());
        let p = SocketPath::new(&sock).expect("short path");
        let _client = UnixStream::connect(p.path()).expect("connect");
        let (_served, _) = listener.accept().expect("accept");
        // A short path is used as it is.
        let short = top.path().join("s.sock");
        assert_eq!(SocketPath::new(&short).expect("path").path(), short);
    }
}
