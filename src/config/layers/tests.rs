//! Precedence of the layers, as upstream documents it: defaults, `--config`, the drop-ins in
//! name order (mappings merged, lists replaced), then flags.

use super::*;
use serde_json::json;
use std::time::Duration;

const HEAD: &str = "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n";

fn write(dir: &Path, name: &str, body: &str) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, format!("{HEAD}{body}")).unwrap();
    p
}

#[test]
fn flags_over_drop_ins_over_the_file_over_defaults() {
    let dir = tempfile::tempdir().unwrap();
    let file = write(
        dir.path(),
        "config.yaml",
        "maxPods: 20\nport: 20250\nsyncFrequency: 30s\nclusterDNS: [10.0.0.9, 10.0.0.8]\n\
         evictionHard: {memory.available: 100Mi, nodefs.available: 10%}\n\
         authentication: {anonymous: {enabled: false}, webhook: {enabled: true, cacheTTL: 5m}}\n",
    );
    let drop_ins = dir.path().join("conf.d");
    std::fs::create_dir(&drop_ins).unwrap();
    // Applied in name order: 20 after 10; a file not named *.conf is not read.
    write(
        &drop_ins,
        "20-b.conf",
        "maxPods: 40\nclusterDNS: [10.0.0.2]\n",
    );
    write(
        &drop_ins,
        "10-a.conf",
        "maxPods: 30\nport: 30250\nevictionHard: {memory.available: 200Mi}\n\
         authentication: {webhook: {cacheTTL: 8m}}\n",
    );
    std::fs::write(drop_ins.join("ignored.yaml"), "not even yaml: [").unwrap();
    let layers = Layers {
        file: Some(file),
        drop_in_dir: Some(drop_ins),
        flags: vec![(vec!["maxPods"], json!(50))],
    };
    let (cfg, warnings) = load_layers(&layers).unwrap();
    assert!(warnings.is_empty(), "{warnings:?}");
    assert_eq!(cfg.max_pods, 50, "the flag wins");
    assert_eq!(cfg.server.port, 30250, "a drop-in over the file");
    assert_eq!(cfg.sync_frequency, Duration::from_secs(30), "the file's");
    assert_eq!(
        cfg.cluster_dns,
        vec!["10.0.0.2".parse::<std::net::IpAddr>().unwrap()],
        "lists replaced whole, by the last drop-in"
    );
    // Maps merged key by key; structs too.
    assert_eq!(cfg.eviction_hard["memory.available"], "200Mi");
    assert_eq!(cfg.eviction_hard["nodefs.available"], "10%");
    assert!(
        cfg.server.token_webhook,
        "the file's, under a drop-in's sibling key"
    );
    assert_eq!(cfg.server.token_cache_ttl, Duration::from_secs(480));
    assert!(!cfg.server.anonymous);
    assert_eq!(
        cfg.node_status_update_frequency,
        Duration::from_secs(10),
        "default"
    );
}

#[test]
fn a_map_flag_replaces_the_map() {
    let dir = tempfile::tempdir().unwrap();
    let file = write(
        dir.path(),
        "c.yaml",
        "evictionHard: {memory.available: 100Mi, nodefs.available: 10%}\n",
    );
    let layers = Layers {
        file: Some(file),
        drop_in_dir: None,
        flags: vec![(vec!["evictionHard"], json!({"imagefs.available": "5%"}))],
    };
    let (cfg, _) = load_layers(&layers).unwrap();
    assert_eq!(
        cfg.eviction_hard.keys().collect::<Vec<_>>(),
        vec!["imagefs.available"]
    );
}

#[test]
fn without_files_the_legacy_server_defaults_apply_under_the_flags() {
    let (cfg, _) = load_layers(&Layers::default()).unwrap();
    assert!(cfg.server.anonymous);
    assert_eq!(cfg.server, crate::config::ServerConfig::legacy());
    let layers = Layers {
        flags: vec![(vec!["authentication", "anonymous", "enabled"], json!(false))],
        ..Default::default()
    };
    let (cfg, _) = load_layers(&layers).unwrap();
    assert!(!cfg.server.anonymous);
    // With a file, the file's defaults (upstream's v1beta1 ones).
    let dir = tempfile::tempdir().unwrap();
    let file = write(dir.path(), "c.yaml", "");
    let (cfg, _) = load_layers(&Layers {
        file: Some(file),
        ..Default::default()
    })
    .unwrap();
    assert!(!cfg.server.anonymous);
}

#[test]
fn a_bad_drop_in_is_refused_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), "10-ok.conf", "maxPods: 30\n");
    let bad = write(dir.path(), "20-bad.conf", "maxPods: many\n");
    let layers = Layers {
        drop_in_dir: Some(dir.path().to_path_buf()),
        ..Default::default()
    };
    let e = load_layers(&layers).unwrap_err().to_string();
    assert!(e.starts_with(&bad.display().to_string()), "{e}");
    assert!(e.contains("maxPods"), "{e}");

    std::fs::write(&bad, "kind: KubeletConfiguration\nmaxPods: 3\n").unwrap();
    let e = load_layers(&layers).unwrap_err().to_string();
    assert!(e.contains("20-bad.conf: apiVersion: missing"), "{e}");

    std::fs::write(&bad, "maxPods: [").unwrap();
    let e = load_layers(&layers).unwrap_err().to_string();
    assert!(e.contains("parsing") && e.contains("20-bad.conf"), "{e}");
}

#[test]
fn a_missing_drop_in_dir_is_empty() {
    let layers = Layers {
        drop_in_dir: Some(PathBuf::from("/nonexistent/nodelet-conf.d")),
        ..Default::default()
    };
    assert!(load_layers(&layers).is_ok());
}

#[test]
fn merge_is_recursive_for_mappings_only() {
    let mut base = json!({"a": {"b": 1, "c": [1, 2]}, "d": 1});
    merge(&mut base, json!({"a": {"c": [3], "e": 2}, "d": {"x": 1}}));
    assert_eq!(
        base,
        json!({"a": {"b": 1, "c": [3], "e": 2}, "d": {"x": 1}})
    );
}
