//! User namespaces for pods with `hostUsers: false`, as upstream's userns manager gives them:
//! each such pod gets its own block of 65536 host IDs (container IDs 0..65536 map onto it, UIDs
//! and GIDs alike) out of the kubelet's range: the `kubelet` user's entries in /etc/subuid and
//! /etc/subgid when it has them, else 65536 up to 2^32. A pod's block is written to
//! `<pods dir>/<uid>/userns` (upstream's format), so a restarted kubelet gives a running pod the
//! IDs it has, and is given back when the pod has terminated.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use k8s_openapi::api::core::v1::Pod;
use runtime::{Error, Result, cri};
use serde::{Deserialize, Serialize};

/// Host IDs per pod (upstream's default `idsPerPod`).
pub const IDS_PER_POD: u32 = 65536;

const FILE: &str = "userns";

/// The kubelet's range when no `kubelet` entry says otherwise: above the node's own IDs.
pub const DEFAULT_RANGE: (u32, u32) = (IDS_PER_POD, u32::MAX - IDS_PER_POD + 1);

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Mapping {
    container_id: u32,
    host_id: u32,
    length: u32,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Record {
    uid_mappings: Vec<Mapping>,
    gid_mappings: Vec<Mapping>,
}

/// Gives pods their blocks of host IDs.
pub struct UsernsManager {
    pods_dir: PathBuf,
    first: u32,
    blocks: u32,
    /// Pod UID → block index.
    used: Mutex<BTreeMap<String, u32>>,
}

/// The `first:count` range of `user` in a subordinate-ID file's text (`name:first:count`).
fn subordinate_range(text: &str, user: &str) -> Option<(u32, u32)> {
    text.lines().find_map(|line| {
        let mut f = line.trim().split(':');
        if f.next()? != user {
            return None;
        }
        Some((f.next()?.parse().ok()?, f.next()?.parse().ok()?))
    })
}

/// The kubelet's range of host IDs: the `kubelet` user's subordinate IDs (the same for UIDs and
/// GIDs), else [`DEFAULT_RANGE`].
pub fn kubelet_range(subuid: &Path, subgid: &Path) -> Result<(u32, u32)> {
    let read = |p: &Path| std::fs::read_to_string(p).unwrap_or_default();
    match (
        subordinate_range(&read(subuid), "kubelet"),
        subordinate_range(&read(subgid), "kubelet"),
    ) {
        (None, None) => Ok(DEFAULT_RANGE),
        (Some(u), Some(g)) if u == g => Ok(u),
        (u, g) => Err(Error::invalid_argument(format!(
            "the kubelet user's subordinate UIDs {u:?} and GIDs {g:?} must be the same range"
        ))),
    }
}

impl UsernsManager {
    /// A manager over `range` (`first`, `length`: multiples of 65536) that takes back the
    /// blocks recorded under `pods_dir`.
    pub fn new(pods_dir: &Path, range: (u32, u32)) -> Result<Self> {
        let (first, length) = range;
        if first % IDS_PER_POD != 0 || length % IDS_PER_POD != 0 || length == 0 || first == 0 {
            return Err(Error::invalid_argument(format!(
                "user namespace range {first}+{length}: must start above 0 and both be \
                 multiples of {IDS_PER_POD}"
            )));
        }
        let m = UsernsManager {
            pods_dir: pods_dir.to_path_buf(),
            first,
            blocks: length / IDS_PER_POD,
            used: Mutex::new(BTreeMap::new()),
        };
        let mut used = BTreeMap::new();
        for entry in std::fs::read_dir(pods_dir).into_iter().flatten().flatten() {
            let Some(uid) = entry.file_name().to_str().map(str::to_string) else {
                continue;
            };
            let path = entry.path().join(FILE);
            let Ok(data) = std::fs::read(&path) else {
                continue;
            };
            match serde_json::from_slice::<Record>(&data)
                .ok()
                .and_then(|r| m.block_of(&r))
            {
                Some(block) => {
                    used.insert(uid, block);
                }
                None => tracing::warn!(
                    path = %path.display(),
                    "ignoring a user namespace record outside the kubelet's range"
                ),
            }
        }
        *m.lock() = used;
        Ok(m)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, u32>> {
        self.used.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn block_of(&self, r: &Record) -> Option<u32> {
        let [u] = r.uid_mappings.as_slice() else {
            return None;
        };
        let offset = u.host_id.checked_sub(self.first)?;
        let ok = r.gid_mappings == r.uid_mappings
            && u.container_id == 0
            && u.length == IDS_PER_POD
            && offset % IDS_PER_POD == 0;
        let block = offset / IDS_PER_POD;
        (ok && block < self.blocks).then_some(block)
    }

    /// The user namespace of `pod`: `None` unless it asks for `hostUsers: false`, else mode POD
    /// with the pod's block (given now if it has none).
    pub fn user_namespace(&self, pod: &Pod) -> Result<Option<cri::UserNamespace>> {
        let Some(spec) = pod.spec.as_ref() else {
            return Ok(None);
        };
        if spec.host_users != Some(false) {
            return Ok(None);
        }
        for (host, what) in [
            (spec.host_network, "hostNetwork"),
            (spec.host_pid, "hostPID"),
            (spec.host_ipc, "hostIPC"),
        ] {
            if host == Some(true) {
                return Err(Error::invalid_argument(format!(
                    "spec.hostUsers: false cannot be combined with spec.{what}: true"
                )));
            }
        }
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        if uid.is_empty() || uid.contains('/') || uid.starts_with('.') {
            return Err(Error::invalid_argument(format!(
                "pod UID {uid:?} cannot name a pod directory"
            )));
        }
        let mut used = self.lock();
        let block =
            match used.get(&uid) {
                Some(b) => *b,
                None => {
                    let taken: std::collections::BTreeSet<u32> = used.values().copied().collect();
                    let free = (0..self.blocks).find(|b| !taken.contains(b)).ok_or_else(|| {
                    Error::resource_exhausted(format!(
                        "no user namespace left: all {} blocks of {IDS_PER_POD} IDs are in use",
                        self.blocks
                    ))
                })?;
                    let record = self.record(free);
                    let dir = self.pods_dir.join(&uid);
                    let data = serde_json::to_vec(&record)
                        .map_err(|e| Error::internal(format!("encoding user namespace: {e}")))?;
                    std::fs::create_dir_all(&dir)
                        .and_then(|()| std::fs::write(dir.join(FILE), data))
                        .map_err(|e| {
                            Error::internal(format!("recording {}: {e}", dir.join(FILE).display()))
                        })?;
                    used.insert(uid, free);
                    free
                }
            };
        let record = self.record(block);
        let to_cri = |m: &[Mapping]| {
            m.iter()
                .map(|m| cri::IdMapping {
                    container_id: m.container_id,
                    host_id: m.host_id,
                    length: m.length,
                })
                .collect()
        };
        Ok(Some(cri::UserNamespace {
            mode: cri::NamespaceMode::Pod as i32,
            uids: to_cri(&record.uid_mappings),
            gids: to_cri(&record.gid_mappings),
        }))
    }

    fn record(&self, block: u32) -> Record {
        let m = vec![Mapping {
            container_id: 0,
            host_id: self.first + block * IDS_PER_POD,
            length: IDS_PER_POD,
        }];
        Record {
            uid_mappings: m.clone(),
            gid_mappings: m,
        }
    }

    /// Gives back the blocks of pods `keep` does not name (pods deleted while the kubelet was
    /// down).
    pub fn release_others(&self, keep: impl Fn(&str) -> bool) {
        let gone: Vec<String> = self.lock().keys().filter(|u| !keep(u)).cloned().collect();
        for uid in gone {
            tracing::info!(pod_uid = %uid, "giving back the user namespace of a pod no source wants");
            self.release(&uid);
        }
    }

    /// Gives `uid`'s block back (its pod has terminated). Unknown pods are fine.
    pub fn release(&self, uid: &str) {
        if self.lock().remove(uid).is_some() {
            let path = self.pods_dir.join(uid).join(FILE);
            if let Err(e) = std::fs::remove_file(&path) {
                tracing::warn!(path = %path.display(), "removing user namespace record: {e}");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(uid: &str, host_users: Option<bool>) -> Pod {
        let mut p = Pod::default();
        p.metadata.uid = Some(uid.into());
        p.spec = Some(k8s_openapi::api::core::v1::PodSpec {
            host_users,
            ..Default::default()
        });
        p
    }

    fn host_id(ns: &Option<cri::UserNamespace>) -> u32 {
        let ns = ns.as_ref().expect("a user namespace");
        assert_eq!(ns.mode, cri::NamespaceMode::Pod as i32);
        assert_eq!(ns.uids, ns.gids);
        assert_eq!((ns.uids[0].container_id, ns.uids[0].length), (0, 65536));
        ns.uids[0].host_id
    }

    #[test]
    fn blocks_are_given_kept_across_restarts_and_given_back() {
        let dir = tempfile::tempdir().unwrap();
        let m = UsernsManager::new(dir.path(), (65536, 3 * 65536)).unwrap();
        assert_eq!(m.user_namespace(&pod("node-users", None)).unwrap(), None);
        assert_eq!(
            m.user_namespace(&pod("explicit", Some(true))).unwrap(),
            None
        );
        let a = host_id(&m.user_namespace(&pod("a", Some(false))).unwrap());
        let b = host_id(&m.user_namespace(&pod("b", Some(false))).unwrap());
        assert_eq!((a, b), (65536, 131072));
        // Asked again, the same block.
        assert_eq!(
            host_id(&m.user_namespace(&pod("a", Some(false))).unwrap()),
            a
        );
        // A restarted kubelet reads the blocks back.
        let m = UsernsManager::new(dir.path(), (65536, 3 * 65536)).unwrap();
        assert_eq!(
            host_id(&m.user_namespace(&pod("b", Some(false))).unwrap()),
            b
        );
        let c = host_id(&m.user_namespace(&pod("c", Some(false))).unwrap());
        assert_eq!(c, 196608);
        let err = m.user_namespace(&pod("d", Some(false))).unwrap_err();
        assert_eq!(err.code(), runtime::Code::ResourceExhausted);
        // Given back, a block serves the next pod.
        m.release("a");
        assert!(!dir.path().join("a/userns").exists());
        assert_eq!(
            host_id(&m.user_namespace(&pod("d", Some(false))).unwrap()),
            a
        );
        m.release("never-seen");
        // Housekeeping gives back what no pod wants.
        m.release_others(|uid| uid == "b");
        assert!(dir.path().join("b/userns").exists());
        assert!(!dir.path().join("c/userns").exists());
        assert_eq!(
            host_id(&m.user_namespace(&pod("e", Some(false))).unwrap()),
            a
        );
    }

    #[test]
    fn bad_pods_ranges_and_records() {
        let dir = tempfile::tempdir().unwrap();
        let m = UsernsManager::new(dir.path(), DEFAULT_RANGE).unwrap();
        let mut host_net = pod("h", Some(false));
        host_net.spec.as_mut().unwrap().host_network = Some(true);
        let err = m.user_namespace(&host_net).unwrap_err();
        assert!(err.message().contains("hostNetwork"), "{err}");
        assert!(m.user_namespace(&pod("../x", Some(false))).is_err());
        for range in [(0, 65536), (65536, 1000), (1000, 65536), (65536, 0)] {
            assert!(UsernsManager::new(dir.path(), range).is_err(), "{range:?}");
        }
        // A record that is not one of ours is ignored, not trusted.
        std::fs::create_dir_all(dir.path().join("odd")).unwrap();
        std::fs::write(
            dir.path().join("odd/userns"),
            r#"{"uidMappings":[{"containerId":0,"hostId":0,"length":65536}],"gidMappings":[{"containerId":0,"hostId":0,"length":65536}]}"#,
        )
        .unwrap();
        std::fs::create_dir_all(dir.path().join("junk")).unwrap();
        std::fs::write(dir.path().join("junk/userns"), "not json").unwrap();
        let m = UsernsManager::new(dir.path(), DEFAULT_RANGE).unwrap();
        assert_eq!(
            host_id(&m.user_namespace(&pod("odd", Some(false))).unwrap()),
            65536
        );
    }

    #[test]
    fn the_kubelet_users_subordinate_ids() {
        let dir = tempfile::tempdir().unwrap();
        let (u, g) = (dir.path().join("subuid"), dir.path().join("subgid"));
        assert_eq!(kubelet_range(&u, &g).unwrap(), DEFAULT_RANGE);
        std::fs::write(&u, "alice:100000:65536\nkubelet:65536:655360\n").unwrap();
        std::fs::write(&g, "kubelet:65536:655360\n").unwrap();
        assert_eq!(kubelet_range(&u, &g).unwrap(), (65536, 655360));
        std::fs::write(&g, "kubelet:131072:655360\n").unwrap();
        assert!(kubelet_range(&u, &g).is_err());
    }
}
