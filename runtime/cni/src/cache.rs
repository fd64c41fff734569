//! The result cache, in libcni's format and place, so that other CNI runtimes and tools read it:
//! `<cache dir>/results/<network>-<container id>-<ifname>`, a JSON object of kind `cniCacheV1`
//! holding the network list as it was used (base64), the attachment's parameters and the ADD's
//! result.

use std::fs;
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use base64::Engine;
use base64::engine::general_purpose::STANDARD as BASE64;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::{Error, NetworkList};

const KIND: &str = "cniCacheV1";

/// One attachment in the cache: what an ADD was run with, and its result once it finished.
#[derive(Debug, Clone, PartialEq)]
pub struct CachedAttachment {
    /// The cache file.
    pub path: PathBuf,
    pub network_name: String,
    pub container_id: String,
    pub ifname: String,
    pub netns: PathBuf,
    pub args: Vec<(String, String)>,
    pub capability_args: Map<String, Value>,
    /// The network list the ADD used, as bytes (see [`NetworkList::raw`]).
    pub config: Vec<u8>,
    /// The result of the ADD; `None` while it runs, or when it failed and its DEL did too.
    pub result: Option<Value>,
}

impl CachedAttachment {
    /// The network list the ADD used.
    pub fn network(&self) -> Result<NetworkList, Error> {
        NetworkList::from_bytes(&self.config, &self.path)
    }
}

/// The file as libcni writes it (Go's `[]byte` is base64; its nil slices and maps are `null`).
#[derive(Serialize, Deserialize)]
struct File {
    kind: String,
    #[serde(rename = "containerId")]
    container_id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    config: Option<String>,
    #[serde(rename = "ifName")]
    if_name: String,
    #[serde(rename = "networkName")]
    network_name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    netns: Option<String>,
    #[serde(rename = "cniArgs", default, skip_serializing_if = "Option::is_none")]
    cni_args: Option<Vec<(String, String)>>,
    #[serde(
        rename = "capabilityArgs",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    capability_args: Option<Map<String, Value>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    result: Option<Value>,
}

fn results_dir(cache_dir: &Path) -> PathBuf {
    cache_dir.join("results")
}

/// Where the entry of an attachment is. The three parts are checked names (no `/`).
pub(crate) fn entry_path(
    cache_dir: &Path,
    network: &str,
    container_id: &str,
    ifname: &str,
) -> PathBuf {
    results_dir(cache_dir).join(format!("{network}-{container_id}-{ifname}"))
}

/// The entry at `path`; `None` when there is none.
pub(crate) fn read(path: &Path) -> Result<Option<CachedAttachment>, Error> {
    let bytes = match fs::read(path) {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(Error::io(format!("reading {}", path.display()), e)),
    };
    parse(&bytes, path).map(Some)
}

fn parse(bytes: &[u8], path: &Path) -> Result<CachedAttachment, Error> {
    let bad = |why: String| Error::Cache {
        path: path.to_path_buf(),
        why,
    };
    let file: File =
        serde_json::from_slice(bytes).map_err(|e| bad(format!("not an entry: {e}")))?;
    if file.kind != KIND {
        return Err(bad(format!("kind {:?}, not {KIND:?}", file.kind)));
    }
    let config = match file.config {
        Some(b64) => BASE64
            .decode(b64.as_bytes())
            .map_err(|e| bad(format!("config is not base64: {e}")))?,
        None => Vec::new(),
    };
    Ok(CachedAttachment {
        path: path.to_path_buf(),
        network_name: file.network_name,
        container_id: file.container_id,
        ifname: file.if_name,
        netns: PathBuf::from(file.netns.unwrap_or_default()),
        args: file.cni_args.unwrap_or_default(),
        capability_args: file.capability_args.unwrap_or_default(),
        config,
        result: file.result.filter(|r| !r.is_null()),
    })
}

/// Writes `entry` to `entry.path`: a new file renamed over the old one, so a reader sees the old
/// entry or the new one. The dirs are made 0700 and the file is 0600.
pub(crate) fn write(entry: &CachedAttachment) -> Result<(), Error> {
    let file = File {
        kind: KIND.to_string(),
        container_id: entry.container_id.clone(),
        config: Some(BASE64.encode(&entry.config)),
        if_name: entry.ifname.clone(),
        network_name: entry.network_name.clone(),
        netns: Some(entry.netns.to_string_lossy().into_owned()).filter(|n| !n.is_empty()),
        cni_args: Some(entry.args.clone()).filter(|a| !a.is_empty()),
        capability_args: Some(entry.capability_args.clone()).filter(|c| !c.is_empty()),
        result: entry.result.clone(),
    };
    let path = &entry.path;
    let what = || format!("writing the CNI cache entry {}", path.display());
    let bytes = serde_json::to_vec(&file).map_err(|e| Error::io(what(), e.into()))?;
    let dir = path
        .parent()
        .ok_or_else(|| Error::io(what(), std::io::ErrorKind::InvalidInput.into()))?;
    fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(|e| Error::io(what(), e))?;

    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    // A dot file: libcni's readers skip it as it is not an entry (no kind).
    let tmp = dir.join(format!(
        ".{name}.tmp-{}-{}",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    ));
    let result = (|| {
        let mut f = fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&tmp)?;
        f.write_all(&bytes)?;
        f.sync_all()?;
        drop(f);
        fs::rename(&tmp, path)?;
        // The rename itself, durable.
        fs::File::open(dir)?.sync_all()
    })();
    if let Err(e) = result {
        let _ = fs::remove_file(&tmp);
        return Err(Error::io(what(), e));
    }
    Ok(())
}

/// Removes the entry at `path`; one that is not there is removed.
pub(crate) fn remove(path: &Path) -> Result<(), Error> {
    match fs::remove_file(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(Error::io(
            format!("removing the CNI cache entry {}", path.display()),
            e,
        )),
    }
}

/// Every entry in the cache (of any network), by file name; an entry that cannot be read is an
/// `Err` in the list. A missing cache dir has none.
pub(crate) fn list(cache_dir: &Path) -> Result<Vec<Result<CachedAttachment, Error>>, Error> {
    let dir = results_dir(cache_dir);
    let entries = match fs::read_dir(&dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(Error::io(format!("reading {}", dir.display()), e)),
    };
    let mut names = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|e| Error::io(format!("reading {}", dir.display()), e))?;
        let name = entry.file_name();
        // Our temporary files.
        if name.as_encoded_bytes().starts_with(b".") {
            continue;
        }
        if entry.file_type().is_ok_and(|t| t.is_file()) {
            names.push(name);
        }
    }
    names.sort();
    Ok(names
        .into_iter()
        .filter_map(|name| {
            // An entry removed since the listing (a DEL done meanwhile) is no entry.
            read(&dir.join(name)).transpose()
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn writes_libcni_s_format_and_reads_it_back() {
        let dir = tempfile::tempdir().unwrap();
        let cache = dir.path().join("cache");
        let path = entry_path(&cache, "net", "c1", "eth0");
        assert_eq!(path, cache.join("results/net-c1-eth0"));
        let mut entry = CachedAttachment {
            path: path.clone(),
            network_name: "net".into(),
            container_id: "c1".into(),
            ifname: "eth0".into(),
            netns: "/run/netns/x".into(),
            args: vec![("K".into(), "V".into())],
            capability_args: json!({"portMappings": []}).as_object().unwrap().clone(),
            config: br#"{"name":"net"}"#.to_vec(),
            result: None,
        };
        write(&entry).unwrap();
        let file: Value = serde_json::from_slice(&fs::read(&path).unwrap()).unwrap();
        assert_eq!(
            file,
            json!({
                "kind": "cniCacheV1",
                "containerId": "c1",
                "config": "eyJuYW1lIjoibmV0In0=",
                "ifName": "eth0",
                "networkName": "net",
                "netns": "/run/netns/x",
                "cniArgs": [["K", "V"]],
                "capabilityArgs": {"portMappings": []}
            })
        );
        let mode = |p: &Path| fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&path), 0o600);
        assert_eq!(mode(&cache.join("results")), 0o700);
        assert_eq!(read(&path).unwrap().unwrap(), entry);

        entry.result = Some(json!({"cniVersion": "1.0.0"}));
        write(&entry).unwrap();
        assert_eq!(read(&path).unwrap().unwrap(), entry);
        // No temporary file left behind.
        assert_eq!(fs::read_dir(cache.join("results")).unwrap().count(), 1);

        // libcni's nulls read as empty.
        let other = cache.join("results/net-c2-eth0");
        fs::write(
            &other,
            r#"{"kind":"cniCacheV1","containerId":"c2","config":null,"ifName":"eth0","networkName":"net","cniArgs":null,"capabilityArgs":null,"result":null}"#,
        )
        .unwrap();
        fs::write(cache.join("results/zz-garbage"), "nope").unwrap();
        let all = list(&cache).unwrap();
        assert_eq!(all.len(), 3);
        assert_eq!(all[0].as_ref().unwrap().container_id, "c1");
        let c2 = all[1].as_ref().unwrap();
        assert!(c2.args.is_empty() && c2.config.is_empty() && c2.result.is_none());
        assert!(matches!(all[2], Err(Error::Cache { .. })));

        remove(&path).unwrap();
        remove(&path).unwrap();
        assert!(read(&path).unwrap().is_none());
        assert!(list(&dir.path().join("none")).unwrap().is_empty());
    }
}
