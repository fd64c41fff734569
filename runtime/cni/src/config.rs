//! Network configuration lists: the files in the conf dir, and the versions of the spec.

use std::path::{Path, PathBuf};

use serde_json::{Map, Value};

use crate::Error;

/// The versions of the CNI spec this crate speaks, oldest first.
pub const SUPPORTED_VERSIONS: &[&str] = &["0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"];

/// The highest version this crate speaks (what VERSION sends).
pub const CURRENT_VERSION: &str = "1.1.0";

/// A `major.minor.patch` version, as the spec's are; missing parts are 0 (as libcni parses them).
pub(crate) fn parse_version(v: &str) -> Option<(u32, u32, u32)> {
    let mut parts = v.split('.');
    let major = parts.next()?.parse().ok()?;
    let minor = match parts.next() {
        Some(p) => p.parse().ok()?,
        None => 0,
    };
    let patch = match parts.next() {
        Some(p) => p.parse().ok()?,
        None => 0,
    };
    if parts.next().is_some() {
        return None;
    }
    Some((major, minor, patch))
}

/// Whether `v` is `min` or later; an unparsable `v` is not.
pub(crate) fn at_least(v: &str, min: (u32, u32, u32)) -> bool {
    parse_version(v).is_some_and(|v| v >= min)
}

fn speaks(v: &str) -> bool {
    SUPPORTED_VERSIONS.contains(&v)
}

/// A network configuration list, loaded from a file (or from a cache entry's copy of one).
#[derive(Debug, Clone)]
pub struct NetworkList {
    pub name: String,
    /// The version chosen: the highest of `cniVersion` and `cniVersions` this crate speaks.
    pub cni_version: String,
    /// Where it was loaded from.
    pub source: PathBuf,
    pub disable_check: bool,
    pub disable_gc: bool,
    /// The plugin configurations, in order; each has a string `type`.
    pub plugins: Vec<Map<String, Value>>,
    /// The list as bytes, what the cache entry of an attachment keeps: the file's bytes for a
    /// list, a list of one made of it for a single plugin's configuration.
    pub raw: Vec<u8>,
}

/// What [`load`] found.
#[derive(Debug, Default)]
pub struct Loaded {
    /// The first valid configuration, by file name.
    pub network: Option<NetworkList>,
    /// The files before it that are not valid, and why.
    pub skipped: Vec<(PathBuf, String)>,
}

/// Loads the first valid network configuration in `dir`: the files ending `.conf`, `.conflist` or
/// `.json`, sorted by name. A `.conf` or `.json` holding a single plugin's configuration (a `type`
/// and no `plugins`) becomes a list of one. Invalid files are skipped and listed with the reason.
/// A missing `dir` loads nothing; only a `dir` that cannot be read is an error.
pub fn load(dir: &Path) -> Result<Loaded, Error> {
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Loaded::default()),
        Err(e) => {
            return Err(Error::io(
                format!("reading the CNI conf dir {}", dir.display()),
                e,
            ));
        }
    };
    let mut files = Vec::new();
    for entry in entries {
        let entry = entry
            .map_err(|e| Error::io(format!("reading the CNI conf dir {}", dir.display()), e))?;
        let path = entry.path();
        let Some(kind) = file_kind(&path) else {
            continue;
        };
        // Symbolic links count as what they point at.
        if !std::fs::metadata(&path).is_ok_and(|m| m.is_file()) {
            continue;
        }
        files.push((entry.file_name(), path, kind));
    }
    files.sort_by(|a, b| a.0.cmp(&b.0));

    let mut loaded = Loaded::default();
    for (_, path, kind) in files {
        let parsed = std::fs::read(&path)
            .map_err(|e| Error::Config {
                path: path.clone(),
                why: format!("cannot read it: {e}"),
            })
            .and_then(|bytes| parse(&bytes, &path, kind == Kind::Single));
        match parsed {
            Ok(network) => {
                loaded.network = Some(network);
                break;
            }
            Err(Error::Config { why, .. }) => loaded.skipped.push((path, why)),
            Err(e) => loaded.skipped.push((path, e.to_string())),
        }
    }
    Ok(loaded)
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// `.conflist`: a list.
    List,
    /// `.conf`, `.json`: a list, or a single plugin's configuration.
    Single,
}

fn file_kind(path: &Path) -> Option<Kind> {
    match path.extension()?.to_str()? {
        "conflist" => Some(Kind::List),
        "conf" | "json" => Some(Kind::Single),
        _ => None,
    }
}

impl NetworkList {
    /// Parses a network configuration list, or a single plugin's configuration as a list of one
    /// (as a cache entry may hold either); `source` is where it came from, for errors.
    pub fn from_bytes(bytes: &[u8], source: &Path) -> Result<Self, Error> {
        parse(bytes, source, true)
    }

    /// The `type` of the `index`th plugin.
    pub fn plugin_type(&self, index: usize) -> Option<&str> {
        self.plugins.get(index)?.get("type")?.as_str()
    }
}

fn parse(bytes: &[u8], source: &Path, single_allowed: bool) -> Result<NetworkList, Error> {
    let bad = |why: String| Error::Config {
        path: source.to_path_buf(),
        why,
    };
    let value: Value =
        serde_json::from_slice(bytes).map_err(|e| bad(format!("not valid JSON: {e}")))?;
    let Value::Object(obj) = value else {
        return Err(bad("not a JSON object".to_string()));
    };
    let name = match obj.get("name") {
        Some(Value::String(name)) => name.clone(),
        Some(_) => return Err(bad("\"name\" is not a string".to_string())),
        None => return Err(bad("no \"name\"".to_string())),
    };
    if let Err(why) = check_name(&name) {
        return Err(bad(format!("network name {name:?} {why}")));
    }
    let cni_version = choose_version(&obj).map_err(bad)?;
    let disable_check = read_bool(&obj, "disableCheck").map_err(bad)?;
    let disable_gc = read_bool(&obj, "disableGC").map_err(bad)?;

    let (plugins, raw) = match obj.get("plugins") {
        Some(Value::Array(list)) => {
            if list.is_empty() {
                return Err(bad("\"plugins\" is empty".to_string()));
            }
            let mut plugins = Vec::with_capacity(list.len());
            for (i, plugin) in list.iter().enumerate() {
                let Value::Object(plugin) = plugin else {
                    return Err(bad(format!("plugin {i} is not a JSON object")));
                };
                check_plugin(plugin).map_err(|why| bad(format!("plugin {i}: {why}")))?;
                plugins.push(plugin.clone());
            }
            (plugins, bytes.to_vec())
        }
        Some(_) => return Err(bad("\"plugins\" is not a list".to_string())),
        None if single_allowed && obj.contains_key("type") => {
            check_plugin(&obj).map_err(bad)?;
            // As libcni does: a list of one, named and versioned as the plugin's configuration.
            let list = serde_json::json!({
                "cniVersion": cni_version,
                "name": name,
                "plugins": [Value::Object(obj.clone())],
            });
            let raw = serde_json::to_vec(&list)
                .map_err(|e| bad(format!("cannot serialize it as a list: {e}")))?;
            (vec![obj.clone()], raw)
        }
        None if single_allowed => {
            return Err(bad("neither \"plugins\" nor \"type\"".to_string()));
        }
        None => return Err(bad("no \"plugins\" list".to_string())),
    };
    Ok(NetworkList {
        name,
        cni_version,
        source: source.to_path_buf(),
        disable_check,
        disable_gc,
        plugins,
        raw,
    })
}

/// The highest version of `cniVersion` and `cniVersions` this crate speaks.
fn choose_version(obj: &Map<String, Value>) -> Result<String, String> {
    let mut offered = Vec::new();
    match obj.get("cniVersion") {
        Some(Value::String(v)) => offered.push(v.clone()),
        Some(_) => return Err("\"cniVersion\" is not a string".to_string()),
        None => {}
    }
    match obj.get("cniVersions") {
        Some(Value::Array(list)) => {
            for v in list {
                let Value::String(v) = v else {
                    return Err("\"cniVersions\" holds a non-string".to_string());
                };
                offered.push(v.clone());
            }
        }
        Some(_) => return Err("\"cniVersions\" is not a list".to_string()),
        None => {}
    }
    if offered.is_empty() {
        return Err("no \"cniVersion\"".to_string());
    }
    let best = offered
        .iter()
        .filter(|v| speaks(v))
        .max_by_key(|v| parse_version(v));
    match best {
        Some(v) => Ok(v.clone()),
        None => Err(format!(
            "CNI version {} is not supported (supported: {})",
            offered.join(", "),
            SUPPORTED_VERSIONS.join(", ")
        )),
    }
}

/// A boolean, or (as libcni accepts) the strings "true" and "false" in any case; absent is false.
fn read_bool(obj: &Map<String, Value>, key: &str) -> Result<bool, String> {
    match obj.get(key) {
        None => Ok(false),
        Some(Value::Bool(b)) => Ok(*b),
        Some(Value::String(s)) if s.eq_ignore_ascii_case("true") => Ok(true),
        Some(Value::String(s)) if s.eq_ignore_ascii_case("false") => Ok(false),
        Some(other) => Err(format!("{key:?} is not a boolean: {other}")),
    }
}

fn check_plugin(plugin: &Map<String, Value>) -> Result<(), String> {
    match plugin.get("type") {
        Some(Value::String(t)) => check_type(t),
        Some(_) => Err("\"type\" is not a string".to_string()),
        None => Err("no \"type\"".to_string()),
    }
}

/// A plugin type names an executable in a bin dir: a plain file name.
pub(crate) fn check_type(t: &str) -> Result<(), String> {
    if t.is_empty() {
        Err("\"type\" is empty".to_string())
    } else if t.contains('/') || t.contains("..") || t.contains('\0') || t == "." {
        Err(format!("plugin type {t:?} is not a plain file name"))
    } else {
        Ok(())
    }
}

/// The spec's rule for network names and container IDs: an alphanumeric character, then
/// alphanumerics, `_`, `.` and `-`. It also keeps them usable in a cache file's name.
pub(crate) fn check_name(name: &str) -> Result<(), &'static str> {
    let mut chars = name.chars();
    match chars.next() {
        None => return Err("is empty"),
        Some(c) if !c.is_ascii_alphanumeric() => {
            return Err("must start with a letter or digit");
        }
        Some(_) => {}
    }
    if chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-')) {
        Ok(())
    } else {
        Err("may hold only letters, digits, '_', '.' and '-'")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;

    fn write(dir: &Path, name: &str, body: &str) {
        fs::write(dir.join(name), body).unwrap();
    }

    #[test]
    fn versions() {
        assert_eq!(parse_version("1.1.0"), Some((1, 1, 0)));
        assert_eq!(parse_version("0.4"), Some((0, 4, 0)));
        assert_eq!(parse_version("1.x"), None);
        assert_eq!(parse_version("1.0.0.0"), None);
        assert!(at_least("1.0.0", (0, 4, 0)));
        assert!(!at_least("0.3.1", (0, 4, 0)));
        assert!(!at_least("", (0, 4, 0)));
    }

    #[test]
    fn load_takes_the_first_valid_file_by_name_and_reports_the_skipped() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        write(d, "00-broken.conflist", "{not json");
        write(
            d,
            "05-old.conflist",
            r#"{"cniVersion":"0.2.0","name":"old","plugins":[{"type":"bridge"}]}"#,
        );
        write(
            d,
            "07-noplugins.conflist",
            r#"{"cniVersion":"1.0.0","name":"x","type":"bridge"}"#,
        );
        write(
            d,
            "08-badtype.conflist",
            r#"{"cniVersion":"1.0.0","name":"x","plugins":[{"type":"../bin/sh"}]}"#,
        );
        write(
            d,
            "09-badname.conflist",
            r#"{"cniVersion":"1.0.0","name":"a/b","plugins":[{"type":"bridge"}]}"#,
        );
        write(
            d,
            "20-later.conflist",
            r#"{"cniVersion":"1.0.0","name":"later","plugins":[{"type":"bridge"}]}"#,
        );
        let good = r#"{"cniVersion":"1.0.0","name":"good","disableCheck":"TRUE","plugins":[{"type":"bridge","bridge":"cni0"},{"type":"portmap","capabilities":{"portMappings":true}}]}"#;
        write(d, "10-good.conflist", good);
        write(d, "01-readme.md", "not a config");
        fs::create_dir(d.join("03-dir.conf")).unwrap();

        let loaded = load(d).unwrap();
        let net = loaded.network.expect("a network");
        assert_eq!(net.name, "good");
        assert_eq!(net.cni_version, "1.0.0");
        assert_eq!(net.source, d.join("10-good.conflist"));
        assert!(net.disable_check);
        assert!(!net.disable_gc);
        assert_eq!(net.plugins.len(), 2);
        assert_eq!(net.plugin_type(1), Some("portmap"));
        assert_eq!(net.raw, good.as_bytes());

        let skipped: Vec<_> = loaded
            .skipped
            .iter()
            .map(|(p, why)| (p.file_name().unwrap().to_str().unwrap(), why.as_str()))
            .collect();
        assert_eq!(skipped.len(), 5, "{skipped:?}");
        assert_eq!(skipped[0].0, "00-broken.conflist");
        assert!(
            skipped[0].1.starts_with("not valid JSON"),
            "{}",
            skipped[0].1
        );
        assert_eq!(skipped[1].0, "05-old.conflist");
        assert!(
            skipped[1].1.contains("0.2.0 is not supported"),
            "{}",
            skipped[1].1
        );
        assert_eq!(skipped[2], ("07-noplugins.conflist", "no \"plugins\" list"));
        assert_eq!(skipped[3].0, "08-badtype.conflist");
        assert!(
            skipped[3].1.contains("not a plain file name"),
            "{}",
            skipped[3].1
        );
        assert_eq!(skipped[4].0, "09-badname.conflist");
    }

    #[test]
    fn load_wraps_a_single_plugin_conf() {
        let dir = tempfile::tempdir().unwrap();
        let single = r#"{"cniVersion":"0.4.0","name":"one","type":"bridge","bridge":"br9","ipam":{"type":"host-local"}}"#;
        write(dir.path(), "10-one.conf", single);
        let net = load(dir.path()).unwrap().network.unwrap();
        assert_eq!(net.name, "one");
        assert_eq!(net.cni_version, "0.4.0");
        assert_eq!(net.plugins.len(), 1);
        let original: Value = serde_json::from_str(single).unwrap();
        assert_eq!(Value::Object(net.plugins[0].clone()), original);
        // The raw bytes are a list that reads back as the same network.
        let again = NetworkList::from_bytes(&net.raw, Path::new("cache")).unwrap();
        assert_eq!(again.name, "one");
        assert_eq!(again.cni_version, "0.4.0");
        assert_eq!(again.plugins, net.plugins);
        let raw: Value = serde_json::from_slice(&net.raw).unwrap();
        assert_eq!(raw["plugins"][0], original);

        // .json too; a .conf that is neither is skipped.
        let dir = tempfile::tempdir().unwrap();
        write(
            dir.path(),
            "10-neither.conf",
            r#"{"cniVersion":"1.0.0","name":"n"}"#,
        );
        write(
            dir.path(),
            "20-one.json",
            r#"{"cniVersion":"1.0.0","name":"j","type":"ptp"}"#,
        );
        let loaded = load(dir.path()).unwrap();
        assert_eq!(loaded.network.unwrap().name, "j");
        assert_eq!(loaded.skipped[0].1, "neither \"plugins\" nor \"type\"");
    }

    #[test]
    fn load_chooses_the_highest_spoken_version() {
        let dir = tempfile::tempdir().unwrap();
        write(
            dir.path(),
            "10.conflist",
            r#"{"cniVersion":"0.3.1","cniVersions":["0.4.0","1.0.0","2.0.0","junk"],"name":"v","plugins":[{"type":"x"}]}"#,
        );
        let net = load(dir.path()).unwrap().network.unwrap();
        assert_eq!(net.cni_version, "1.0.0");

        let dir = tempfile::tempdir().unwrap();
        write(
            dir.path(),
            "10.conflist",
            r#"{"cniVersions":["1.1.0","0.4.0"],"name":"v","plugins":[{"type":"x"}]}"#,
        );
        assert_eq!(
            load(dir.path()).unwrap().network.unwrap().cni_version,
            "1.1.0"
        );

        let dir = tempfile::tempdir().unwrap();
        write(
            dir.path(),
            "10.conflist",
            r#"{"cniVersions":["2.0.0","0.2.0"],"name":"v","plugins":[{"type":"x"}]}"#,
        );
        write(
            dir.path(),
            "20.conflist",
            r#"{"name":"v","plugins":[{"type":"x"}]}"#,
        );
        let loaded = load(dir.path()).unwrap();
        assert!(loaded.network.is_none());
        assert!(
            loaded.skipped[0].1.contains("not supported"),
            "{:?}",
            loaded.skipped
        );
        assert_eq!(loaded.skipped[1].1, "no \"cniVersion\"");
    }

    #[test]
    fn load_of_a_missing_dir_is_empty_and_of_a_file_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let loaded = load(&dir.path().join("nope")).unwrap();
        assert!(loaded.network.is_none() && loaded.skipped.is_empty());
        write(dir.path(), "file", "");
        assert!(matches!(
            load(&dir.path().join("file")),
            Err(Error::Io { .. })
        ));
    }
}
