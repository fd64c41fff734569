//! Plugins that fail: errors, bad output, deadlines, and the DELs and cache entries after them.

use std::time::Instant;

use super::*;

#[tokio::test]
async fn a_failed_add_is_deleted_in_reverse_and_its_error_returned() {
    let lab = Lab::new();
    lab.ok_plugin("first", RESULT1);
    lab.ok_plugin("second", RESULT1);
    lab.plugin(
        "failing",
        ALL_VERSIONS,
        &[(
            "ADD",
            r#"echo "some stderr" >&2
echo '{"cniVersion":"1.0.0","code":7,"msg":"bad config","details":"subnet too small"}'
exit 1"#,
        )],
    );
    let cni = lab.cni(Duration::from_secs(10));
    let net = list(json!({
        "cniVersion": "1.0.0", "name": "net",
        "plugins": [{"type": "first"}, {"type": "second"}, {"type": "failing"}]
    }));
    let err = cni.add(&net, &attachment("c1")).await.unwrap_err();
    match &err {
        Error::Plugin {
            plugin,
            command,
            code,
            msg,
            details,
            stderr,
        } => {
            assert_eq!(plugin, "failing");
            assert_eq!(command, "ADD");
            assert_eq!(*code, 7);
            assert_eq!(msg, "bad config");
            assert_eq!(details, "subnet too small");
            assert_eq!(stderr, "some stderr\n");
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(err.code(), Some(7));
    assert!(
        err.to_string()
            .contains("\"failing\" failed ADD: code 7: bad config")
    );
    let runs = lab.runs();
    assert_eq!(
        who(&runs),
        [
            "first ADD",
            "second ADD",
            "failing ADD",
            "failing DEL",
            "second DEL",
            "first DEL"
        ]
    );
    for del in &runs[3..] {
        assert!(del.stdin.get("prevResult").is_none(), "{}", del.stdin);
        assert_eq!(del.env["CNI_CONTAINERID"], "c1");
    }
    assert!(!lab.entry("net", "c1", "eth0").exists());
    assert!(cni.cached().is_empty());
}

#[tokio::test]
async fn a_failed_add_whose_del_fails_keeps_its_entry_for_gc() {
    let lab = Lab::new();
    lab.ok_plugin("first", RESULT1);
    lab.plugin(
        "broken",
        ALL_VERSIONS,
        &[
            ("ADD", r#"echo '{"code":100,"msg":"no"}'; exit 1"#),
            ("DEL", r#"echo '{"code":11,"msg":"try again"}'; exit 1"#),
        ],
    );
    let cni = lab.cni(Duration::from_secs(10));
    let net = list(json!({
        "cniVersion": "1.1.0", "name": "net", "disableGC": true,
        "plugins": [{"type": "first"}, {"type": "broken"}]
    }));
    let err = cni.add(&net, &attachment("c1")).await.unwrap_err();
    assert_eq!(
        err.code(),
        Some(100),
        "the ADD's error, not the DEL's: {err}"
    );
    assert_eq!(who(&lab.runs()), ["first ADD", "broken ADD", "broken DEL"]);
    let entry = read_json(&lab.entry("net", "c1", "eth0"));
    assert!(entry.get("result").is_none());

    // A later GC (the plugin mended) deletes it with the list it was added with.
    lab.ok_plugin("broken", RESULT1);
    let report = cni.gc(&net, &[]).await.unwrap();
    assert_eq!(report.deleted, [("c1".to_string(), "eth0".to_string())]);
    assert!(report.errors.is_empty(), "{:?}", report.errors);
    let runs = lab.runs();
    assert_eq!(who(&runs), ["broken DEL", "first DEL"]);
    assert!(runs[0].stdin.get("prevResult").is_none());
    assert!(!lab.entry("net", "c1", "eth0").exists());
}

#[tokio::test]
async fn garbage_on_stdout_is_an_error() {
    let lab = Lab::new();
    lab.plugin(
        "garbage",
        ALL_VERSIONS,
        &[("ADD", "echo 'this is not json'; echo 'whoops' >&2")],
    );
    lab.plugin(
        "garbage-fail",
        ALL_VERSIONS,
        &[("ADD", "echo 'oops, not json'; exit 3")],
    );
    lab.plugin("silent-fail", ALL_VERSIONS, &[("ADD", "exit 2")]);
    let cni = lab.cni(Duration::from_secs(10));

    let net = list(json!({"cniVersion": "1.0.0", "name": "g", "plugins": [{"type": "garbage"}]}));
    let err = cni.add(&net, &attachment("c1")).await.unwrap_err();
    match &err {
        Error::BadOutput {
            plugin,
            why,
            stderr,
            ..
        } => {
            assert_eq!(plugin, "garbage");
            assert!(why.contains("this is not json"), "{why}");
            assert_eq!(stderr, "whoops\n");
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(who(&lab.runs()), ["garbage ADD", "garbage DEL"]);
    assert!(!lab.entry("g", "c1", "eth0").exists());

    let net =
        list(json!({"cniVersion": "1.0.0", "name": "g", "plugins": [{"type": "garbage-fail"}]}));
    let err = cni.add(&net, &attachment("c1")).await.unwrap_err();
    assert_eq!(err.code(), Some(UNPARSABLE));
    match &err {
        Error::Plugin { msg, details, .. } => {
            assert_eq!(msg, "exit status 3, no CNI error object on stdout");
            assert_eq!(details, "oops, not json\n");
        }
        other => panic!("{other:?}"),
    }
    let net =
        list(json!({"cniVersion": "1.0.0", "name": "g", "plugins": [{"type": "silent-fail"}]}));
    let err = cni.add(&net, &attachment("c1")).await.unwrap_err();
    assert_eq!(err.code(), Some(UNPARSABLE));
    assert!(
        err.to_string().contains("exit status 2, nothing on stdout"),
        "{err}"
    );
}

fn gone(pid: &str) -> bool {
    // Gone, or a zombie its new parent has not reaped yet.
    match fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(stat) => stat
            .rsplit_once(')')
            .is_some_and(|(_, rest)| rest.trim_start().starts_with('Z')),
    }
}

#[tokio::test]
async fn a_plugin_past_its_deadline_is_killed_with_its_children() {
    let lab = Lab::new();
    lab.plugin(
        "sleeper",
        ALL_VERSIONS,
        &[(
            "ADD",
            r#"echo "going to sleep" >&2
echo $$ > "$d/sh.pid"
sleep 60 &
echo $! > "$d/sleep.pid"
wait"#,
        )],
    );
    let cni = lab.cni(Duration::from_millis(800));
    let net = list(json!({"cniVersion": "1.0.0", "name": "s", "plugins": [{"type": "sleeper"}]}));
    let started = Instant::now();
    let err = cni.add(&net, &attachment("c1")).await.unwrap_err();
    assert!(started.elapsed() < Duration::from_secs(10));
    match &err {
        Error::Timeout {
            plugin,
            command,
            after,
            stderr,
        } => {
            assert_eq!(plugin, "sleeper");
            assert_eq!(command, "ADD");
            assert_eq!(*after, Duration::from_millis(800));
            assert_eq!(stderr, "going to sleep\n");
        }
        other => panic!("{other:?}"),
    }
    for file in ["sh.pid", "sleep.pid"] {
        let pid = fs::read_to_string(lab.log.join(file)).unwrap();
        let pid = pid.trim();
        let deadline = Instant::now() + Duration::from_secs(5);
        while !gone(pid) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
        }
        assert!(gone(pid), "{file} {pid} still runs");
    }
    // The DEL after it ran (and did not sleep).
    assert_eq!(who(&lab.runs()), ["sleeper ADD", "sleeper DEL"]);
    assert!(!lab.entry("s", "c1", "eth0").exists());
}

#[tokio::test]
async fn a_dropped_call_leaves_no_process() {
    let lab = Lab::new();
    lab.plugin(
        "sleeper",
        ALL_VERSIONS,
        &[(
            "ADD",
            "sleep 60 &\necho $! > \"$d/sleep.tmp\"\nmv \"$d/sleep.tmp\" \"$d/sleep.pid\"\nwait",
        )],
    );
    let cni = lab.cni(Duration::from_secs(60));
    let net = list(json!({"cniVersion": "1.0.0", "name": "s", "plugins": [{"type": "sleeper"}]}));
    let att = attachment("c1");
    let pid_file = lab.log.join("sleep.pid");
    let add = cni.add(&net, &att);
    let wait = async {
        while !pid_file.exists() {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    tokio::select! {
        _ = add => panic!("the ADD finished"),
        () = wait => {}
    }
    let pid = fs::read_to_string(&pid_file).unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    while !gone(pid.trim()) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(gone(pid.trim()), "sleep {pid} still runs");
}
