//! The built-in runtime's CRI-level records: what each sandbox and container was created from.
//! Live state (PIDs, exit codes) belongs to the sandbox processes; these records hold what CRI
//! asked for, persisted as one JSON file per object so a restarted agent finds everything again.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use serde::{Deserialize, Serialize};

use crate::cri;
use crate::{Error, Result};

/// A pod sandbox as created.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SandboxRecord {
    pub id: String,
    pub config: cri::PodSandboxConfig,
    pub runtime_handler: String,
    pub created_at: i64,
    /// True once StopPodSandbox ran (or the sandbox process was found gone).
    pub stopped: bool,
    /// The pod cgroup containers are placed under.
    pub cgroup_parent: String,
    /// The pod's address on the runtime's pod network, held until the sandbox stops.
    #[serde(default)]
    pub ip: Option<std::net::IpAddr>,
    /// Its address of the other family on a dual-stack pod network.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub second_ip: Option<std::net::IpAddr>,
    /// In CNI mode: the network the sandbox is attached to, until its DEL has run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cni_network: Option<String>,
    /// In CNI mode: the pod's addresses from its network (IPv4 first), held until it stops.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub cni_ips: Vec<std::net::IpAddr>,
}

impl SandboxRecord {
    /// The addresses the sandbox holds on the runtime's bridge.
    pub fn bridge_ips(&self) -> Vec<std::net::IpAddr> {
        self.ip.into_iter().chain(self.second_ip).collect()
    }

    /// Every address of the pod, of the bridge or of its CNI network, the first first.
    pub fn pod_ips(&self) -> Vec<std::net::IpAddr> {
        let mut ips = self.bridge_ips();
        ips.extend(self.cni_ips.iter().copied());
        ips
    }
}

/// A container as created.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ContainerRecord {
    pub id: String,
    pub sandbox_id: String,
    pub config: cri::ContainerConfig,
    /// The image as the request named it.
    pub image_ref: String,
    /// The image's id (`sha256:` of its config).
    pub image_id: String,
    /// A repo digest of the image, when known.
    pub image_digest: String,
    pub created_at: i64,
    pub log_path: String,
    /// The image's stop signal, already parsed.
    pub stop_signal: Option<i32>,
    /// The identity the container's process runs as (uid, gid, supplementary groups), as
    /// resolved at creation from the security context and the image's /etc/passwd and
    /// /etc/group.
    #[serde(default)]
    pub user: Option<(u32, u32, Vec<u32>)>,
}

/// Records in memory, mirrored to `dir/{sandboxes,containers}/<id>.json`.
#[derive(Debug)]
pub struct Records {
    dir: PathBuf,
    pub sandboxes: Mutex<BTreeMap<String, SandboxRecord>>,
    pub containers: Mutex<BTreeMap<String, ContainerRecord>>,
    /// The ids of the sandbox and container records found unreadable at load, which were set
    /// aside (moved to `dir/corrupt/`).
    pub set_aside: SetAside,
}

/// The ids of records set aside at load.
#[derive(Debug, Default)]
pub struct SetAside {
    pub sandboxes: Vec<String>,
    pub containers: Vec<String>,
}

fn internal(what: &str, path: &Path, e: impl std::fmt::Display) -> Error {
    Error::internal(format!("{what} {}: {e}", path.display()))
}

impl Records {
    /// Loads every record under `dir`. An unreadable one (torn, corrupt) is reported and set
    /// aside in `dir/corrupt/`, its id kept in [`Records::set_aside`]; the others load.
    pub fn load(dir: &Path) -> Result<Self> {
        let corrupt = dir.join("corrupt");
        let (sandboxes, bad_sandboxes) = load_all(&dir.join("sandboxes"), &corrupt)?;
        let (containers, bad_containers) = load_all(&dir.join("containers"), &corrupt)?;
        let records = Records {
            dir: dir.to_path_buf(),
            sandboxes: Mutex::new(sandboxes),
            containers: Mutex::new(containers),
            set_aside: SetAside {
                sandboxes: bad_sandboxes,
                containers: bad_containers,
            },
        };
        Ok(records)
    }

    fn path(&self, kind: &str, id: &str) -> PathBuf {
        self.dir.join(kind).join(format!("{id}.json"))
    }

    pub fn save_sandbox(&self, r: &SandboxRecord) -> Result<()> {
        write_atomic(&self.path("sandboxes", &r.id), r)?;
        lock(&self.sandboxes).insert(r.id.clone(), r.clone());
        Ok(())
    }

    pub fn save_container(&self, r: &ContainerRecord) -> Result<()> {
        write_atomic(&self.path("containers", &r.id), r)?;
        lock(&self.containers).insert(r.id.clone(), r.clone());
        Ok(())
    }

    pub fn remove_sandbox(&self, id: &str) {
        let _ = std::fs::remove_file(self.path("sandboxes", id));
        lock(&self.sandboxes).remove(id);
    }

    pub fn remove_container(&self, id: &str) {
        let _ = std::fs::remove_file(self.path("containers", id));
        lock(&self.containers).remove(id);
    }

    pub fn sandbox(&self, id: &str) -> Option<SandboxRecord> {
        lock(&self.sandboxes).get(id).cloned()
    }

    pub fn container(&self, id: &str) -> Option<ContainerRecord> {
        lock(&self.containers).get(id).cloned()
    }

    /// The sandbox a container belongs to, without cloning its record.
    pub fn sandbox_of(&self, container_id: &str) -> Option<String> {
        lock(&self.containers)
            .get(container_id)
            .map(|c| c.sandbox_id.clone())
    }

    pub fn all_sandboxes(&self) -> Vec<SandboxRecord> {
        lock(&self.sandboxes).values().cloned().collect()
    }

    pub fn all_containers(&self) -> Vec<ContainerRecord> {
        lock(&self.containers).values().cloned().collect()
    }

    /// The container records `keep` accepts, only those cloned (a pod's containers out of a
    /// node's: listing per sandbox must not copy every record each time).
    pub fn containers_where(
        &self,
        keep: impl Fn(&ContainerRecord) -> bool,
    ) -> Vec<ContainerRecord> {
        lock(&self.containers)
            .values()
            .filter(|r| keep(r))
            .cloned()
            .collect()
    }

    /// Resolves a full id or a unique prefix of one, as containerd does.
    pub fn resolve_sandbox(&self, id: &str) -> Result<Option<String>> {
        resolve(lock(&self.sandboxes).keys(), id)
    }

    pub fn resolve_container(&self, id: &str) -> Result<Option<String>> {
        resolve(lock(&self.containers).keys(), id)
    }

    /// The sandbox with this id or unique id prefix, if any.
    pub fn find_sandbox(&self, id: &str) -> Result<Option<SandboxRecord>> {
        Ok(self.resolve_sandbox(id)?.and_then(|id| self.sandbox(&id)))
    }

    /// The container with this id or unique id prefix, if any.
    pub fn find_container(&self, id: &str) -> Result<Option<ContainerRecord>> {
        Ok(self
            .resolve_container(id)?
            .and_then(|id| self.container(&id)))
    }

    /// Like [`Records::find_sandbox`], with NotFound for an unknown id.
    pub fn need_sandbox(&self, id: &str) -> Result<SandboxRecord> {
        self.find_sandbox(id)?
            .ok_or_else(|| Error::not_found(format!("pod sandbox {id} not found")))
    }

    /// Like [`Records::find_container`], with NotFound for an unknown id.
    pub fn need_container(&self, id: &str) -> Result<ContainerRecord> {
        self.find_container(id)?
            .ok_or_else(|| Error::not_found(format!("container {id} not found")))
    }
}

/// Locks a mutex, recovering the data if a panicking thread poisoned it.
pub fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn resolve<'a>(ids: impl Iterator<Item = &'a String>, id: &str) -> Result<Option<String>> {
    if id.is_empty() {
        return Err(Error::invalid_argument("an id is required"));
    }
    let matches: Vec<&String> = ids.filter(|k| k.starts_with(id)).collect();
    if let Some(exact) = matches.iter().find(|k| k.as_str() == id) {
        return Ok(Some((*exact).clone()));
    }
    match matches.as_slice() {
        [] => Ok(None),
        [one] => Ok(Some((*one).clone())),
        _ => Err(Error::invalid_argument(format!(
            "id prefix {id:?} is ambiguous"
        ))),
    }
}

/// The records in `dir`, and the ids of those that could not be read, which are moved to
/// `corrupt` as `<kind>-<id>.json.<unix time>` (or, if even that fails, left and skipped).
fn load_all<T: for<'de> Deserialize<'de>>(
    dir: &Path,
    corrupt: &Path,
) -> Result<(BTreeMap<String, T>, Vec<String>)> {
    std::fs::create_dir_all(dir).map_err(|e| internal("creating", dir, e))?;
    let kind = dir
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let mut out = BTreeMap::new();
    let mut bad = Vec::new();
    let entries = std::fs::read_dir(dir).map_err(|e| internal("reading", dir, e))?;
    for entry in entries.flatten() {
        let path = entry.path();
        let Some(id) = path
            .file_name()
            .and_then(|n| n.to_str())
            .and_then(|n| n.strip_suffix(".json"))
        else {
            continue;
        };
        match std::fs::read(&path)
            .map_err(|e| e.to_string())
            .and_then(|b| serde_json::from_slice::<T>(&b).map_err(|e| e.to_string()))
        {
            Ok(r) => {
                out.insert(id.to_string(), r);
            }
            Err(e) => {
                let stamp = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |d| d.as_secs());
                let aside = corrupt.join(format!("{kind}-{id}.json.{stamp}"));
                let moved =
                    std::fs::create_dir_all(corrupt).and_then(|()| std::fs::rename(&path, &aside));
                match moved {
                    Ok(()) => tracing::error!(
                        "unreadable record {} ({e}): set aside as {}",
                        path.display(),
                        aside.display()
                    ),
                    Err(m) => tracing::error!(
                        "unreadable record {} ({e}), skipped; setting it aside failed: {m}",
                        path.display()
                    ),
                }
                bad.push(id.to_string());
            }
        }
    }
    Ok((out, bad))
}

fn write_atomic<T: Serialize>(path: &Path, value: &T) -> Result<()> {
    let bytes = serde_json::to_vec(value).map_err(|e| internal("encoding", path, e))?;
    let tmp = path.with_extension("json.tmp");
    // A write the disk could not take leaves nothing half-written behind.
    let written = std::fs::write(&tmp, bytes)
        .map_err(|e| internal("writing", &tmp, e))
        .and_then(|()| std::fs::rename(&tmp, path).map_err(|e| internal("renaming", path, e)));
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    written
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefixes_resolve_uniquely() {
        let ids = ["abc123".to_string(), "abd456".to_string()];
        assert_eq!(
            resolve(ids.iter(), "abc").unwrap().as_deref(),
            Some("abc123")
        );
        assert!(resolve(ids.iter(), "ab").is_err());
        assert_eq!(resolve(ids.iter(), "zzz").unwrap(), None);
        assert!(resolve(ids.iter(), "").is_err());
    }

    #[test]
    fn records_survive_a_reload() {
        let dir = tempfile::tempdir().unwrap();
        let r = Records::load(dir.path()).unwrap();
        r.save_sandbox(&SandboxRecord {
            id: "s1".into(),
            config: cri::PodSandboxConfig::default(),
            runtime_handler: String::new(),
            created_at: 1,
            stopped: false,
            cgroup_parent: "/x".into(),
            ip: Some(std::net::Ipv4Addr::new(10, 88, 0, 7).into()),
            second_ip: None,
            cni_network: None,
            cni_ips: Vec::new(),
        })
        .unwrap();
        std::fs::write(dir.path().join("sandboxes/broken.json"), b"{").unwrap();
        let again = Records::load(dir.path()).unwrap();
        assert_eq!(again.sandbox("s1").unwrap().cgroup_parent, "/x");
        assert_eq!(
            again.sandbox("s1").unwrap().ip,
            Some(std::net::Ipv4Addr::new(10, 88, 0, 7).into())
        );
        assert!(again.sandbox("broken").is_none());
        again.remove_sandbox("s1");
        assert!(Records::load(dir.path()).unwrap().sandbox("s1").is_none());
    }
}
