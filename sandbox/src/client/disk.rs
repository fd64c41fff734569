//! What a sandbox left on disk, read without asking its process (which may be gone): the
//! statuses it persisted, the spec it was launched with, whether it was shut down; and the
//! clean-up of one whose process died or whose state dir was lost.

use super::Client;
use crate::spec::ContainerStatus;
use crate::{Error, Result};

impl Client {
    /// Container statuses persisted on disk: what is known of a sandbox whose process is gone.
    pub fn persisted(&self) -> Vec<ContainerStatus> {
        crate::process::read_persisted(&self.layout)
    }

    /// The spec the sandbox was launched with.
    pub fn spec(&self) -> Result<crate::Spec> {
        let path = self.layout.spec();
        let text = std::fs::read(&path).map_err(|e| Error::io("reading", &path, e))?;
        Ok(serde_json::from_slice(&text)?)
    }

    /// After the sandbox process died without shutting down: see [`crate::process::reap_dead`].
    /// Blocks (kills and waits, at most seconds).
    pub fn reap_dead(&self, cgroup_parent: &str) -> Result<Vec<ContainerStatus>> {
        crate::process::reap_dead(&self.layout, cgroup_parent)
    }

    /// For a sandbox whose state dir is gone while its process is too (the dir was on a tmpfs
    /// that a reboot emptied): makes the state dir again as a shut-down sandbox's, holding
    /// `containers` as their persisted statuses (what the caller still knows of them), so that
    /// they read, are reaped ([`Self::reap_dead`]) and removed as any stopped sandbox's.
    pub fn restore_lost(&self, containers: &[ContainerStatus]) -> Result<()> {
        let dir = self.layout.status_dir();
        std::fs::create_dir_all(&dir).map_err(|e| Error::io("creating", &dir, e))?;
        for status in containers {
            crate::process::persist(&self.layout, status);
        }
        let marker = self.layout.stopped_marker();
        std::fs::write(&marker, b"").map_err(|e| Error::io("writing", &marker, e))
    }

    /// Whether the sandbox has been shut down (its process ended after cleaning up).
    pub fn is_stopped(&self) -> bool {
        self.layout.stopped_marker().exists()
    }
}
