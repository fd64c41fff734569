//! The configuration's layers and their precedence, as upstream's kubelet applies them:
//! defaults, then the `--config` file, then each `*.conf` file of the `--config-dir`
//! drop-in directory in name order, then the command line's flags.
//!
//! Files are merged as documents before their values are read: a mapping (a struct such as
//! `authentication`, or a map such as `evictionHard`) is merged key by key, anything else (a
//! scalar, a list such as `clusterDNS`) replaced whole. Each drop-in is a full
//! `KubeletConfiguration` (its `apiVersion` and `kind` are checked) and is checked alone too,
//! so a bad value is refused naming the file it is in. A flag replaces the field it names, a
//! map flag (`--eviction-hard`) the whole map, as upstream's flag values do.

use std::path::{Path, PathBuf};

use serde_json::{Map, Value};

use super::{Error, KubeletConfig, document, from_document};

/// Where a configuration comes from, lowest precedence first.
#[derive(Debug, Default, Clone)]
pub struct Layers {
    /// `--config`.
    pub file: Option<PathBuf>,
    /// `--config-dir`.
    pub drop_in_dir: Option<PathBuf>,
    /// The flags that name configuration fields: each a path of field names (`["authentication",
    /// "anonymous", "enabled"]`) and its value, in the order given (a later one wins).
    pub flags: Vec<(Vec<&'static str>, Value)>,
}

/// The settings of a kubelet started without a configuration file (no `--config`, no
/// drop-ins): the command line's legacy defaults for the server (upstream's
/// `applyLegacyDefaults`), a layer beneath the flags.
fn legacy_defaults() -> Map<String, Value> {
    let v = serde_json::json!({
        "authentication": {"anonymous": {"enabled": true}, "webhook": {"enabled": false}},
        "authorization": {"mode": "AlwaysAllow"},
    });
    match v {
        Value::Object(m) => m,
        _ => Map::new(),
    }
}

/// Reads every layer and returns the effective configuration with its warnings (unknown
/// fields, each once).
pub fn load_layers(layers: &Layers) -> Result<(KubeletConfig, Vec<String>), Error> {
    let mut merged = match &layers.file {
        Some(path) => read_document(path)?,
        None => Map::new(),
    };
    let drop_ins = match &layers.drop_in_dir {
        Some(dir) => drop_in_files(dir)?,
        None => Vec::new(),
    };
    if layers.file.is_none() && drop_ins.is_empty() {
        merged = legacy_defaults();
    }
    for path in &drop_ins {
        let doc = read_document(path)?;
        // Checked alone, so its errors name it.
        from_document(doc.clone()).map_err(|e| in_file(path, e))?;
        merge_maps(&mut merged, doc);
    }
    for (path, value) in &layers.flags {
        set_path(&mut merged, path, value.clone());
    }
    from_document(merged)
}

/// The drop-in directory's `*.conf` files, sorted by name. A missing directory has none (as
/// upstream, which reads it only when it exists); anything else unreadable is an error.
fn drop_in_files(dir: &Path) -> Result<Vec<PathBuf>, Error> {
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(source) => {
            return Err(Error::ReadDir {
                path: dir.to_path_buf(),
                source,
            });
        }
    };
    let mut files = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|source| Error::ReadDir {
            path: dir.to_path_buf(),
            source,
        })?;
        let path = entry.path();
        if path.extension().is_some_and(|e| e == "conf") && !path.is_dir() {
            files.push(path);
        }
    }
    files.sort();
    Ok(files)
}

fn read_document(path: &Path) -> Result<Map<String, Value>, Error> {
    let text = std::fs::read_to_string(path).map_err(|source| Error::Read {
        path: path.to_path_buf(),
        source,
    })?;
    document(&text).map_err(|e| match e {
        Error::Parse { error, .. } => Error::Parse {
            path: path.to_path_buf(),
            error,
        },
        other => in_file(path, other),
    })
}

fn in_file(path: &Path, error: Error) -> Error {
    Error::InFile {
        path: path.to_path_buf(),
        error: Box::new(error),
    }
}

/// Merges `over` into `base`: mappings key by key (recursively), anything else replaced.
pub fn merge(base: &mut Value, over: Value) {
    match (base, over) {
        (Value::Object(b), Value::Object(o)) => merge_maps(b, o),
        (b, o) => *b = o,
    }
}

fn merge_maps(base: &mut Map<String, Value>, over: Map<String, Value>) {
    for (k, v) in over {
        match base.get_mut(&k) {
            Some(b) => merge(b, v),
            None => {
                base.insert(k, v);
            }
        }
    }
}

/// Sets the field at `path` to `value`, replacing what was there (a mapping on the way that
/// is not one is replaced by one).
fn set_path(map: &mut Map<String, Value>, path: &[&str], value: Value) {
    let Some((last, parents)) = path.split_last() else {
        return;
    };
    let mut cur = map;
    for p in parents {
        let entry = cur
            .entry((*p).to_string())
            .or_insert_with(|| Value::Object(Map::new()));
        if !entry.is_object() {
            *entry = Value::Object(Map::new());
        }
        let Value::Object(next) = entry else {
            return;
        };
        cur = next;
    }
    cur.insert((*last).to_string(), value);
}

#[cfg(test)]
mod tests;
