use std::path::Path;

use super::*;

fn json(text: &str) -> Result<Spec, SpecError> {
    parse(Path::new("/etc/cdi/x.json"), text.as_bytes())
}

fn yaml(text: &str) -> Result<Spec, SpecError> {
    parse(Path::new("/etc/cdi/x.yaml"), text.as_bytes())
}

/// A spec of `version` with one device whose edits are `edits` (JSON).
fn with_edits(version: &str, edits: &str) -> String {
    format!(
        r#"{{"cdiVersion": "{version}", "kind": "example.com/dev",
            "devices": [{{"name": "one", "containerEdits": {edits}}}]}}"#
    )
}

#[test]
fn a_full_json_spec() {
    let s = json(
        r#"{
        "cdiVersion": "0.8.0",
        "kind": "example.com/gpu",
        "annotations": {"a": "b"},
        "devices": [
            {"name": "gpu0", "annotations": {"c": "d"}, "containerEdits": {
                "env": ["GPU=0"],
                "deviceNodes": [{"path": "/dev/gpu0", "hostPath": "/dev/nvidia0", "type": "c",
                                 "major": 195, "minor": 0, "fileMode": 438,
                                 "permissions": "rw", "uid": 0, "gid": 44}],
                "mounts": [{"hostPath": "/usr/lib/libgpu.so", "containerPath": "/usr/lib/libgpu.so",
                            "options": ["ro", "bind"], "type": "bind"}],
                "hooks": [{"hookName": "createContainer", "path": "/usr/bin/gpu-hook",
                           "args": ["gpu-hook", "x"], "env": ["A=1"], "timeout": 5}],
                "additionalGids": [44]
            }}
        ],
        "containerEdits": {"env": ["VENDOR=example"]}
    }"#,
    )
    .unwrap();
    assert_eq!(s.kind, "example.com/gpu");
    let d = &s.devices[0];
    assert_eq!(d.name, "gpu0");
    let n = &d.container_edits.device_nodes[0];
    assert_eq!(
        (n.path.as_str(), n.host_path.as_str(), n.typ.as_str()),
        ("/dev/gpu0", "/dev/nvidia0", "c")
    );
    assert_eq!(
        (n.major, n.minor, n.file_mode, n.gid),
        (195, 0, Some(438), Some(44))
    );
    assert_eq!(d.container_edits.hooks[0].timeout, Some(5));
    assert_eq!(d.container_edits.additional_gids, [44]);
    assert_eq!(s.container_edits.env, ["VENDOR=example"]);
}

#[test]
fn a_yaml_spec_with_nulls() {
    let s = yaml(
        "---\ncdiVersion: 0.5.0\nkind: vendor.com/device\ndevices:\n  - name: \"0\"\n    \
         containerEdits:\n      env: [X=1]\n      deviceNodes:\n        - path: /dev/xyz\n          \
         hostPath: /dev/null\n      mounts: null\ncontainerEdits:\n  env: ~\n",
    )
    .unwrap();
    assert_eq!(s.devices[0].name, "0");
    assert_eq!(
        s.devices[0].container_edits.device_nodes[0].host_path,
        "/dev/null"
    );
    assert!(s.container_edits.env.is_empty());
}

#[test]
fn versions_0_3_to_0_8_are_read() {
    for v in VERSIONS.iter().chain(&["v0.6.0"]) {
        json(&with_edits(v, r#"{"env": ["A=1"]}"#)).unwrap_or_else(|e| panic!("{v}: {e}"));
    }
    for (v, why) in [
        (
            "1.0.0",
            "not supported: nodelet reads CDI specs of versions 0.3.0 to 0.8.0",
        ),
        ("0.2.0", "not supported"),
        ("0.9.0", "is not a CDI spec version"),
        ("", "is not a CDI spec version"),
    ] {
        let err = json(&with_edits(v, r#"{"env": ["A=1"]}"#))
            .unwrap_err()
            .to_string();
        assert!(err.contains(why), "{v}: {err}");
    }
}

#[test]
fn fields_newer_than_the_version_are_refused() {
    let cases = [
        (
            with_edits("0.3.0", r#"{"mounts": [{"hostPath": "/a", "containerPath": "/a", "type": "bind"}]}"#),
            "a mount's type needs cdiVersion 0.4.0 or later, the spec says 0.3.0",
        ),
        (
            with_edits("0.4.0", r#"{"deviceNodes": [{"path": "/dev/a", "hostPath": "/dev/b"}]}"#),
            "a device node's hostPath needs cdiVersion 0.5.0",
        ),
        (
            with_edits("0.6.0", r#"{"additionalGids": [5]}"#),
            "additionalGids needs cdiVersion 0.7.0",
        ),
        (
            with_edits("0.6.0", r#"{"intelRdt": {"closID": "x"}}"#),
            "intelRdt needs cdiVersion 0.7.0",
        ),
        (
            r#"{"cdiVersion": "0.4.0", "kind": "a/b", "devices": [{"name": "0", "containerEdits": {"env": ["A=1"]}}]}"#.into(),
            "a device name starting with a digit needs cdiVersion 0.5.0",
        ),
        (
            r#"{"cdiVersion": "0.5.0", "kind": "a/b", "annotations": {"k": "v"}, "devices": [{"name": "x", "containerEdits": {"env": ["A=1"]}}]}"#.into(),
            "annotations needs cdiVersion 0.6.0",
        ),
        (
            r#"{"cdiVersion": "0.5.0", "kind": "a/b.c", "devices": [{"name": "x", "containerEdits": {"env": ["A=1"]}}]}"#.into(),
            "a dot in the kind's class needs cdiVersion 0.6.0",
        ),
    ];
    for (text, why) in cases {
        let err = json(&text).unwrap_err().to_string();
        assert!(err.contains(why), "{text}: {err}");
    }
    // The same fields at their versions are fine.
    json(&with_edits(
        "0.7.0",
        r#"{"additionalGids": [5], "intelRdt": {"closID": "x"}}"#,
    ))
    .unwrap();
}

#[test]
fn bad_specs_say_why() {
    let cases: Vec<(String, &str)> = vec![
        ("{".into(), "is not a valid CDI spec (JSON)"),
        (r#"{"kind": "a/b", "devices": []}"#.into(), "missing field `cdiVersion`"),
        (
            r#"{"cdiVersion": "0.6.0", "kind": "a/b", "devices": [], "extra": 1}"#.into(),
            "unknown field `extra`",
        ),
        (r#"{"cdiVersion": "0.6.0", "kind": "a/b", "devices": []}"#.into(), "the spec has no devices"),
        (
            r#"{"cdiVersion": "0.6.0", "kind": "ab", "devices": [{"name": "x", "containerEdits": {"env": ["A=1"]}}]}"#.into(),
            "kind \"ab\" must be vendor/class",
        ),
        (
            r#"{"cdiVersion": "0.6.0", "kind": "a/b", "devices": [{"name": "x!", "containerEdits": {"env": ["A=1"]}}]}"#.into(),
            "device name \"x!\" must end with a letter or a digit",
        ),
        (
            r#"{"cdiVersion": "0.6.0", "kind": "a/b", "devices": [{"name": "x", "containerEdits": {"env": ["A=1"]}}, {"name": "x", "containerEdits": {"env": ["A=1"]}}]}"#.into(),
            "device \"x\" is defined twice",
        ),
        (
            r#"{"cdiVersion": "0.6.0", "kind": "a/b", "devices": [{"name": "x"}]}"#.into(),
            "device \"x\" has no containerEdits",
        ),
        (with_edits("0.6.0", r#"{"env": ["=1"]}"#), "\"=1\" is not NAME=value"),
        (with_edits("0.6.0", r#"{"env": ["NOVALUE"]}"#), "\"NOVALUE\" is not NAME=value"),
        (
            with_edits("0.6.0", r#"{"deviceNodes": [{"path": "/dev/a", "type": "x"}]}"#),
            "type \"x\" is none of b, c, u, p",
        ),
        (
            with_edits("0.6.0", r#"{"deviceNodes": [{"path": "/dev/a", "permissions": "rwx"}]}"#),
            "permissions \"rwx\" must be made of r, w and m",
        ),
        (with_edits("0.6.0", r#"{"deviceNodes": [{"path": ""}]}"#), "empty path"),
        (
            with_edits("0.6.0", r#"{"hooks": [{"hookName": "preStart", "path": "/bin/true"}]}"#),
            "hook name \"preStart\" is none of",
        ),
        (
            with_edits("0.6.0", r#"{"mounts": [{"hostPath": "", "containerPath": "/a"}]}"#),
            "both hostPath and containerPath are needed",
        ),
        (
            with_edits("0.8.0", r#"{"netDevices": [{"hostInterfaceName": "eth1", "name": "net1"}]}"#),
            "netDevices is a CDI 1.1.0 field",
        ),
        (with_edits("0.6.0", r#"{"devicenodes": []}"#), "unknown field `devicenodes`"),
    ];
    for (text, why) in cases {
        let err = json(&text).unwrap_err().to_string();
        assert!(err.contains(why), "{text}: {err}");
    }
    let err = yaml("cdiVersion: [").unwrap_err().to_string();
    assert!(err.contains("is not a valid CDI spec (YAML)"), "{err}");
    let err = yaml("cdiVersion: 0.6.0\nkind: a/b\ndevices: []\nbogus: 1\n")
        .unwrap_err()
        .to_string();
    assert!(err.contains("unknown field `bogus`"), "{err}");
}
