//! Filtering and derived views over the fake runtime's state.

use super::{FakeContainer, FakeSandbox, State, now_ns};
use crate::cri;
use crate::error::{Error, Result};

impl State {
    /// The sandboxes matching `filter`, in creation order. A filter id
    /// matches exactly or as a unique prefix; otherwise nothing is listed.
    pub(super) fn select_sandboxes(&self, filter: &cri::PodSandboxFilter) -> Vec<&FakeSandbox> {
        let only = match filter.id.as_str() {
            "" => None,
            id => match self.find_sandbox(id) {
                Ok(Some(i)) => Some(i),
                _ => return Vec::new(),
            },
        };
        self.sandboxes
            .iter()
            .enumerate()
            .filter(|(i, s)| only.is_none_or(|o| o == *i) && s.matches(filter))
            .map(|(_, s)| s)
            .collect()
    }

    /// The containers matching `filter`, in creation order. Ids (container
    /// and sandbox) match exactly or as a unique prefix, like containerd.
    pub(super) fn select_containers(
        &self,
        mut filter: cri::ContainerFilter,
    ) -> Vec<&FakeContainer> {
        let only = match filter.id.as_str() {
            "" => None,
            id => match self.find_container(id) {
                Ok(Some(i)) => Some(i),
                _ => return Vec::new(),
            },
        };
        if !filter.pod_sandbox_id.is_empty() {
            if let Ok(Some(i)) = self.find_sandbox(&filter.pod_sandbox_id) {
                filter.pod_sandbox_id = self.sandboxes[i].id.clone();
            }
        }
        self.containers
            .iter()
            .enumerate()
            .filter(|(i, c)| only.is_none_or(|o| o == *i) && c.matches(&filter))
            .map(|(_, c)| c)
            .collect()
    }
}

/// `c` if it is running, else `FailedPrecondition`.
pub(super) fn running(c: &FakeContainer) -> Result<&FakeContainer> {
    if c.is_running() {
        Ok(c)
    } else {
        Err(Error::failed_precondition(format!(
            "container {:?} is not running",
            c.id
        )))
    }
}

/// Zero-valued stats of a sandbox and its running containers.
pub(super) fn sandbox_stats(st: &State, sb: &FakeSandbox) -> cri::PodSandboxStats {
    let now = now_ns();
    let containers = st
        .containers
        .iter()
        .filter(|c| c.pod_sandbox_id == sb.id && c.is_running())
        .map(|c| c.stats(now))
        .collect();
    cri::PodSandboxStats {
        attributes: Some(sb.attributes()),
        linux: Some(cri::LinuxPodSandboxStats {
            containers,
            ..Default::default()
        }),
        windows: None,
    }
}
