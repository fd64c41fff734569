//! Tests of [`super`] (`pod::termination`): the file and its mount, reading it back, the log
//! tail, the pod budget, and the whole path through the fake runtime.

use super::*;
use std::io::Write;
use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;

fn container(path: Option<&str>) -> Container {
    Container {
        name: "app".into(),
        image: Some("busybox".into()),
        termination_message_path: path.map(str::to_string),
        ..Default::default()
    }
}

/// One CRI log record.
fn rec(stream: &str, tag: &str, text: &str) -> String {
    format!("2024-05-01T10:00:00.123456789Z {stream} {tag} {text}\n")
}

fn write(path: &Path, content: &[u8]) {
    std::fs::File::create(path)
        .and_then(|mut f| f.write_all(content))
        .expect("write");
}

/// An exited container's CRI status with the termination file `file` mounted at the default
/// path, the given policy, exit code and log.
fn exited(file: &Path, policy: &str, exit_code: i32, log: &Path) -> cri::ContainerStatus {
    cri::ContainerStatus {
        id: "c1".into(),
        state: cri::ContainerState::ContainerExited as i32,
        exit_code,
        reason: if exit_code == 0 { "Completed" } else { "Error" }.into(),
        annotations: [
            (
                ANNOTATION_TERMINATION_MESSAGE_PATH.to_string(),
                DEFAULT_PATH.to_string(),
            ),
            (
                ANNOTATION_TERMINATION_MESSAGE_POLICY.to_string(),
                policy.to_string(),
            ),
        ]
        .into(),
        mounts: vec![
            cri::Mount {
                container_path: "/data".into(),
                host_path: "/nonexistent/data".into(),
                ..Default::default()
            },
            cri::Mount {
                container_path: DEFAULT_PATH.into(),
                host_path: file.to_string_lossy().into_owned(),
                ..Default::default()
            },
        ],
        log_path: log.to_string_lossy().into_owned(),
        ..Default::default()
    }
}

#[test]
fn the_path_defaults_and_empty_means_none() {
    assert_eq!(message_path(&container(None)), Some("/dev/termination-log"));
    assert_eq!(message_path(&container(Some("/tmp/why"))), Some("/tmp/why"));
    assert_eq!(message_path(&container(Some(""))), None);
}

#[test]
fn the_file_is_made_empty_and_world_writable_and_mounted() {
    let dir = tempfile::tempdir().expect("tmp");
    // A umask that would take the write bits: the mode is still 0666.
    let old = nix::sys::stat::umask(nix::sys::stat::Mode::from_bits_truncate(0o022));
    let m = prepare_mount(dir.path(), "u-1", &container(None), 3);
    nix::sys::stat::umask(old);
    let m = m.expect("prepared").expect("a mount");
    assert_eq!(m.container_path, "/dev/termination-log");
    assert!(!m.readonly && !m.selinux_relabel);
    let host = Path::new(&m.host_path);
    let parent = dir.path().join("u-1/containers/app");
    assert_eq!(host.parent(), Some(parent.as_path()));
    let name = host.file_name().and_then(|n| n.to_str()).expect("name");
    let (restart, random) = name.split_once('-').expect("<restart>-<random>");
    assert_eq!(restart, "3");
    assert_eq!(random.len(), 8, "{name}");
    let meta = std::fs::metadata(host).expect("the file");
    assert!(meta.is_file());
    assert_eq!(meta.len(), 0);
    assert_eq!(meta.mode() & 0o7777, 0o666);

    // The next container (even of the same restart count) gets a file of its own.
    let again = prepare_mount(dir.path(), "u-1", &container(None), 3)
        .expect("prepared")
        .expect("a mount");
    assert_ne!(again.host_path, m.host_path);

    let custom = prepare_mount(dir.path(), "u-1", &container(Some("/var/why")), 0)
        .expect("prepared")
        .expect("a mount");
    assert_eq!(custom.container_path, "/var/why");
    assert!(custom.host_path.contains("/u-1/containers/app/0-"));
}

#[test]
fn no_path_no_file() {
    let dir = tempfile::tempdir().expect("tmp");
    let m = prepare_mount(dir.path(), "u-1", &container(Some("")), 0).expect("nothing to do");
    assert!(m.is_none());
    assert!(!dir.path().join("u-1").exists());
}

#[test]
fn bad_names_and_paths_are_refused() {
    let dir = tempfile::tempdir().expect("tmp");
    for uid in ["", "..", "a/b", "."] {
        let err = prepare_mount(dir.path(), uid, &container(None), 0).expect_err(uid);
        assert!(err.message().contains("cannot name a directory"), "{err}");
    }
    let err =
        prepare_mount(dir.path(), "u-1", &container(Some("relative")), 0).expect_err("relative");
    assert!(err.message().contains("must be absolute"), "{err}");
    // The pods dir cannot be made: an error, with the path in it.
    let file = dir.path().join("file");
    write(&file, b"x");
    let err = prepare_mount(&file, "u-1", &container(None), 0).expect_err("not a dir");
    assert!(
        err.message().contains("terminationMessagePath") && err.message().contains("file/u-1"),
        "{err}"
    );
}

#[test]
fn read_at_most_keeps_the_end() {
    let dir = tempfile::tempdir().expect("tmp");
    let f = dir.path().join("m");
    write(&f, b"short\n");
    assert_eq!(read_at_most(&f, 4096).expect("read"), "short\n");
    let long = format!("{}{}", "a".repeat(100), "b".repeat(4096));
    write(&f, long.as_bytes());
    assert_eq!(read_at_most(&f, 4096).expect("read"), "b".repeat(4096));
    // A character cut at the start is dropped, not turned into garbage.
    write(&f, "ééé".as_bytes());
    assert_eq!(read_at_most(&f, 5).expect("read"), "éé");
    let missing = read_at_most(&dir.path().join("nope"), 10).expect_err("missing");
    assert_eq!(missing.kind(), io::ErrorKind::NotFound);
}

#[test]
fn log_tail_joins_partial_lines_and_skips_garbage() {
    let dir = tempfile::tempdir().expect("tmp");
    let f = dir.path().join("0.log");
    let log = [
        rec("stdout", "F", "first"),
        rec("stderr", "P", "bo"),
        rec("stderr", "P", "o"),
        rec("stderr", "F", "m"),
        "not a record\n".to_string(),
        rec("stdout", "F", ""),
        rec("stdout", "F:x", "tagged"),
        rec("stdout", "P", "cut off"),
    ]
    .concat();
    write(&f, log.as_bytes());
    assert_eq!(
        log_tail(&f, 80, 2048).expect("tail"),
        "first\nboom\n\ntagged\ncut off"
    );
    assert_eq!(
        log_tail(&f, 2, 2048).expect("tail"),
        "tagged\ncut off",
        "a trailing partial line counts as a line"
    );
    assert_eq!(log_tail(&f, 80, 6).expect("tail"), "ut off");
    let missing = log_tail(&dir.path().join("nope"), 80, 2048).expect_err("missing");
    assert_eq!(missing.kind(), io::ErrorKind::NotFound);
    write(&f, b"");
    assert_eq!(log_tail(&f, 80, 2048).expect("empty"), "");
}

#[test]
fn log_tail_limits_lines_and_bytes_in_long_logs() {
    let dir = tempfile::tempdir().expect("tmp");
    let f = dir.path().join("0.log");
    // 5000 numbered lines (~250 KiB): far more than the first window read.
    let log: String = (0..5000)
        .map(|i| rec("stdout", "F", &format!("line {i}")))
        .collect();
    write(&f, log.as_bytes());
    let want: String = (4920..5000).map(|i| format!("line {i}\n")).collect();
    assert!(want.len() < 2048);
    assert_eq!(log_tail(&f, 80, 2048).expect("tail"), want);

    // Long lines: the bytes bind first, the last 2048 of them.
    let long: String = (0..200)
        .map(|i| rec("stderr", "F", &format!("{i:04}{}", "x".repeat(96))))
        .collect();
    write(&f, long.as_bytes());
    let got = log_tail(&f, 80, 2048).expect("tail");
    assert_eq!(got.len(), 2048);
    let text: String = (0..200)
        .map(|i| format!("{i:04}{}\n", "x".repeat(96)))
        .collect();
    assert_eq!(got, text[text.len() - 2048..]);

    // A line longer than the first window, split into partial records: still whole.
    let big: String = (0..40)
        .map(|_| rec("stdout", "P", &"y".repeat(1000)))
        .chain([rec("stdout", "F", "end")])
        .collect();
    write(&f, big.as_bytes());
    let got = log_tail(&f, 80, 100_000).expect("tail");
    assert_eq!(got, format!("{}end\n", "y".repeat(40_000)));
}

#[test]
fn the_file_becomes_the_message_capped_at_4096() {
    let dir = tempfile::tempdir().expect("tmp");
    let file = dir.path().join("0-abc");
    let log = dir.path().join("0.log");
    write(&log, rec("stderr", "F", "from the log").as_bytes());
    write(&file, b"bye now\n");
    assert_eq!(message_of(&exited(&file, "File", 3, &log)), "bye now\n");
    // The file wins over the log under FallbackToLogsOnError too.
    assert_eq!(
        message_of(&exited(&file, FALLBACK_TO_LOGS_ON_ERROR, 3, &log)),
        "bye now\n"
    );
    // Capped: the last 4096 bytes.
    let big = format!("{}{}", "h".repeat(1000), "t".repeat(4096));
    write(&file, big.as_bytes());
    let got = message_of(&exited(&file, "File", 0, &log));
    assert_eq!(got.len(), MAX_CONTAINER_MESSAGE);
    assert_eq!(got, "t".repeat(4096));
    // No annotation, or no mount at that path: nothing.
    let mut st = exited(&file, "File", 1, &log);
    st.annotations.remove(ANNOTATION_TERMINATION_MESSAGE_PATH);
    assert_eq!(message_of(&st), "");
    let mut st = exited(&file, "File", 1, &log);
    st.mounts.retain(|m| m.container_path != DEFAULT_PATH);
    assert_eq!(message_of(&st), "");
    // A file that cannot be read is said so.
    let st = exited(dir.path(), "File", 1, &log);
    assert!(
        message_of(&st).starts_with("Error on reading termination log"),
        "{}",
        message_of(&st)
    );
}

#[test]
fn fallback_to_logs_only_on_failure_and_an_empty_file() {
    let dir = tempfile::tempdir().expect("tmp");
    let file = dir.path().join("0-abc");
    let log = dir.path().join("0.log");
    write(&file, b"");
    write(
        &log,
        [rec("stdout", "F", "starting"), rec("stderr", "F", "boom")]
            .concat()
            .as_bytes(),
    );
    let fallback = FALLBACK_TO_LOGS_ON_ERROR;
    assert_eq!(
        message_of(&exited(&file, fallback, 1, &log)),
        "starting\nboom\n"
    );
    // Succeeded: no log.
    assert_eq!(message_of(&exited(&file, fallback, 0, &log)), "");
    // Policy File: no log.
    assert_eq!(message_of(&exited(&file, "File", 1, &log)), "");
    // The file missing altogether counts as empty.
    let gone = dir.path().join("gone");
    assert_eq!(
        message_of(&exited(&gone, fallback, 2, &log)),
        "starting\nboom\n"
    );
    // A container that could not even run has no log to read.
    let mut st = exited(&file, fallback, 128, &log);
    st.reason = "ContainerCannotRun".into();
    assert_eq!(message_of(&st), "");
    // A log that cannot be read is said so.
    let st = exited(&file, fallback, 1, &dir.path().join("no.log"));
    assert!(
        message_of(&st).starts_with("Error on reading termination message from logs: "),
        "{}",
        message_of(&st)
    );
}

#[test]
fn fill_messages_touches_exited_containers_only_and_keeps_the_runtime_message() {
    let dir = tempfile::tempdir().expect("tmp");
    let file = dir.path().join("0-abc");
    let log = dir.path().join("0.log");
    write(&file, b"out of memory, sorry");
    let mut running = exited(&file, "File", 0, &log);
    running.state = cri::ContainerState::ContainerRunning as i32;
    let mut oom = exited(&file, "File", 137, &log);
    oom.message = "OOMKilled".into();
    let mut all = vec![running, oom, exited(&file, "File", 0, &log)];
    fill_messages(&mut all);
    let messages: Vec<&str> = all.iter().map(|c| c.message.as_str()).collect();
    assert_eq!(
        messages,
        [
            "",
            "OOMKilled: out of memory, sorry",
            "out of memory, sorry"
        ]
    );
}

fn statuses(names: &[&str], message: &str) -> Vec<k8s_openapi::api::core::v1::ContainerStatus> {
    let term = |m: &str| ContainerState {
        terminated: Some(k8s_openapi::api::core::v1::ContainerStateTerminated {
            message: Some(m.to_string()),
            ..Default::default()
        }),
        ..Default::default()
    };
    names
        .iter()
        .map(|n| k8s_openapi::api::core::v1::ContainerStatus {
            name: n.to_string(),
            state: Some(term(message)),
            last_state: Some(term(message)),
            ..Default::default()
        })
        .collect()
}

fn message_lens(st: &PodStatus) -> Vec<(usize, usize)> {
    let len = |s: &Option<ContainerState>| {
        s.as_ref()
            .and_then(|s| s.terminated.as_ref())
            .and_then(|t| t.message.as_ref())
            .map_or(0, String::len)
    };
    st.init_container_statuses
        .iter()
        .flatten()
        .chain(st.container_statuses.iter().flatten())
        .map(|c| (len(&c.state), len(&c.last_state)))
        .collect()
}

#[test]
fn the_pod_budget_is_shared_evenly() {
    let full = "m".repeat(MAX_CONTAINER_MESSAGE);
    // Three containers: 4 KiB each fits the 12 KiB.
    let mut st = PodStatus {
        container_statuses: Some(statuses(&["a", "b", "c"], &full)),
        ..Default::default()
    };
    truncate_to_pod_budget(&mut st, 3);
    assert_eq!(message_lens(&st), [(4096, 4096); 3]);
    // One init and four app containers: 12 KiB / 5 each, current and last state.
    let mut st = PodStatus {
        init_container_statuses: Some(statuses(&["i"], &full)),
        container_statuses: Some(statuses(&["a", "b", "c", "d"], &full)),
        ..Default::default()
    };
    truncate_to_pod_budget(&mut st, 5);
    assert_eq!(message_lens(&st), [(2457, 2457); 5]);
    let total: usize = message_lens(&st).iter().map(|(s, _)| s).sum();
    assert!(total <= MAX_POD_MESSAGES);
    // At a character boundary.
    let mut st = PodStatus {
        container_statuses: Some(statuses(&["a", "b", "c", "d", "e"], &"é".repeat(2000))),
        ..Default::default()
    };
    truncate_to_pod_budget(&mut st, 5);
    assert_eq!(message_lens(&st), [(2456, 2456); 5]);
}

/// The whole path on the fake runtime: the sync creates the container with the file mounted,
/// the "container" writes it, exits, and the status carries the message.
#[tokio::test]
async fn through_the_sync_and_the_status() {
    use crate::model::PodRef;
    use crate::pod::images::{ImageManager, ImagePulls};
    use crate::pod::manager::RuntimeManager;
    use crate::pod::sync::{NoEvents, PodSync, runtime_pod_status};
    use crate::pod::{Backoff, StatusContext, compute_pod_actions, pod_status};
    use runtime::RuntimeService;
    use runtime::fake::FakeRuntime;
    use std::sync::Arc;

    let rt = Arc::new(FakeRuntime::new());
    let images = ImageManager::new(rt.clone(), ImagePulls::default());
    let m = RuntimeManager::new(rt.clone(), images, Arc::new(NoEvents), Backoff::default());
    let p = crate::pod::spec::tests::pod(serde_json::json!({"restartPolicy": "Never",
        "containers": [{"name": "app", "image": "busybox:1.36"},
                       {"name": "quiet", "image": "busybox:1.36", "terminationMessagePath": ""}]}));
    let pods = tempfile::tempdir().expect("pods dir");
    let opts = crate::pod::ContainerOptions {
        pods_dir: pods.path().to_path_buf(),
        ..Default::default()
    };
    let now = std::time::SystemTime::now();
    let snap = runtime_pod_status(rt.as_ref(), "u-1")
        .await
        .expect("status");
    let who = PodRef::of(&p);
    let actions = compute_pod_actions(&p, &who, &snap.status, &m.backoff(), now);
    let sync = PodSync {
        pod: &p,
        who: &who,
        snapshot: &snap,
        actions: &actions,
        opts: &opts,
        now,
    };
    let res = m.sync_pod(&sync).await.expect("sync");
    assert_eq!(res.started.len(), 2, "{res:?}");
    let listed = rt.list_containers(Default::default()).await.expect("list");
    let mut host_file = None;
    for c in &listed.containers {
        let st = rt
            .container_status(cri::ContainerStatusRequest {
                container_id: c.id.clone(),
                verbose: false,
            })
            .await
            .expect("status")
            .status
            .expect("a status");
        let name = st.metadata.as_ref().map(|m| m.name.as_str());
        let mounts: Vec<&str> = st
            .mounts
            .iter()
            .map(|m| m.container_path.as_str())
            .collect();
        if name == Some("app") {
            assert_eq!(mounts, ["/etc/hosts", "/dev/termination-log"]);
            host_file = st.mounts.last().map(|m| PathBuf::from(&m.host_path));
        } else {
            assert_eq!(mounts, ["/etc/hosts"]);
        }
        rt.set_container_exited(&c.id, 3, "Error").expect("exit");
    }
    let host_file = host_file.expect("app's termination file");
    assert!(host_file.starts_with(pods.path().join("u-1/containers/app")));
    write(&host_file, b"bye now\n");

    let snap = runtime_pod_status(rt.as_ref(), "u-1")
        .await
        .expect("status");
    let status = pod_status(
        &p,
        snap.sandboxes.first(),
        &snap.containers,
        &StatusContext::default(),
    );
    let term = |name: &str| {
        status
            .container_statuses
            .iter()
            .flatten()
            .find(|c| c.name == name)
            .and_then(|c| c.state.as_ref())
            .and_then(|s| s.terminated.clone())
            .expect("terminated")
    };
    assert_eq!(term("app").message.as_deref(), Some("bye now\n"));
    assert_eq!(term("app").exit_code, 3);
    assert_eq!(term("quiet").message, None);
}
