//! Whether a sandbox process is alive: the process its pid file names, or any process, serving
//! the sandbox's state dir (recognised by its last argument, so that a reused PID does not
//! count), and killing them all for a sandbox being discarded.

use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::time::{Duration, Instant};

use super::Client;

impl Client {
    /// Whether the sandbox process is alive: the process its pid file names exists and serves
    /// this state dir (a PID another process reuses does not count). Before its pid file is
    /// written (during set-up) it counts as alive.
    pub fn process_alive(&self) -> bool {
        match std::fs::read_to_string(self.layout.pid_file()) {
            Ok(text) => self.serving(&text).is_some(),
            Err(_) => !self.is_stopped(),
        }
    }

    /// The sandbox process's PID, while it is alive.
    pub fn pid(&self) -> Option<i32> {
        let text = std::fs::read_to_string(self.layout.pid_file()).ok()?;
        self.serving(&text)
    }

    /// SIGKILLs every process serving this state dir, whatever its pid file says (a sandbox
    /// whose launch was cut short may not have written it yet), and waits (a few seconds at
    /// most) until they are gone. For a sandbox being discarded. Returns how many there were.
    pub fn kill_serving(&self) -> usize {
        let Some(ours) = self.dir_id() else {
            return 0;
        };
        let pids: Vec<i32> = self.pids_serving(ours).collect();
        for &pid in &pids {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline && pids.iter().any(|&p| self.serves(p, ours)) {
            std::thread::sleep(Duration::from_millis(10));
        }
        pids.len()
    }

    /// Whether any process serves this state dir, whatever its pid file says.
    pub fn served(&self) -> bool {
        self.dir_id()
            .is_some_and(|ours| self.pids_serving(ours).next().is_some())
    }

    /// The state dir's device and inode, by which a process serving it is recognised.
    fn dir_id(&self) -> Option<(u64, u64)> {
        let m = std::fs::metadata(&self.layout.dir).ok()?;
        Some((m.dev(), m.ino()))
    }

    /// Every process but this one that serves the state dir `ours`, from /proc.
    fn pids_serving(&self, ours: (u64, u64)) -> impl Iterator<Item = i32> + '_ {
        let me = std::process::id() as i32;
        std::fs::read_dir("/proc")
            .into_iter()
            .flat_map(|d| d.flatten())
            .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
            .filter(move |&pid| pid != me && self.serves(pid, ours))
    }

    /// The PID in the pid file's `text`, if that process serves this state dir: its last
    /// argument is its state dir, however spelled (compared as the same directory).
    fn serving(&self, text: &str) -> Option<i32> {
        let pid: i32 = text.trim().parse().ok()?;
        let ours = self.dir_id()?;
        self.serves(pid, ours).then_some(pid)
    }

    /// Whether process `pid` serves the state dir `(dev, ino)`: its last argument names it.
    fn serves(&self, pid: i32, ours: (u64, u64)) -> bool {
        serves_dir(pid, ours).unwrap_or(false)
    }
}

/// [`Client::serves`], `None` where /proc does not tell (the process is gone or a zombie).
fn serves_dir(pid: i32, (dev, ino): (u64, u64)) -> Option<bool> {
    // A zombie has no command line: it serves nothing.
    let cmd = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
    let last = cmd.split(|b| *b == 0).rfind(|arg| !arg.is_empty())?;
    let arg = Path::new(std::ffi::OsStr::from_bytes(last));
    let dir = if arg.is_absolute() {
        arg.to_path_buf()
    } else {
        Path::new(&format!("/proc/{pid}/cwd")).join(arg)
    };
    let m = std::fs::metadata(dir).ok()?;
    Some(m.dev() == dev && m.ino() == ino)
}
