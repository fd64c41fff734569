//! Tests of [`super`] (`kubelet::gc`) against the fake runtime and temporary directories.

use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use runtime::fake::FakeRuntime;
use runtime::{Error, RuntimeService, cri};

use super::*;
use crate::pod::{LABEL_CONTAINER_NAME, LABEL_POD_NAME, LABEL_POD_NAMESPACE, LABEL_POD_UID};

struct Env {
    rt: Arc<FakeRuntime>,
    _tmp: tempfile::TempDir,
    root: PathBuf,
    pods: PathBuf,
    logs: PathBuf,
    mountinfo: PathBuf,
}

impl Env {
    fn new() -> Env {
        let tmp = tempfile::tempdir().expect("tempdir");
        let root = tmp.path().to_path_buf();
        let pods = root.join("pods");
        let logs = root.join("logs");
        std::fs::create_dir_all(&pods).expect("pods dir");
        std::fs::create_dir_all(&logs).expect("logs dir");
        let mountinfo = root.join("mountinfo");
        std::fs::write(
            &mountinfo,
            "22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw\n",
        )
        .expect("mountinfo");
        Env {
            rt: Arc::new(FakeRuntime::new()),
            _tmp: tmp,
            root,
            pods,
            logs,
            mountinfo,
        }
    }

    fn gc(&self) -> GarbageCollector {
        let rt: Arc<dyn RuntimeService> = self.rt.clone();
        GarbageCollector::new(rt, self.pods.clone(), self.logs.clone())
            .with_mountinfo(self.mountinfo.clone())
    }

    /// Runs a sandbox of pod `uid` (namespace `ns`, name `uid` too) logging to `log_dir`
    /// and makes the pod's directory with a file in it.
    async fn sandbox_in(&self, uid: &str, attempt: u32, log_dir: &Path) -> String {
        let labels = HashMap::from([
            (LABEL_POD_UID.to_string(), uid.to_string()),
            (LABEL_POD_NAME.to_string(), uid.to_string()),
            (LABEL_POD_NAMESPACE.to_string(), "ns".to_string()),
        ]);
        let config = cri::PodSandboxConfig {
            metadata: Some(cri::PodSandboxMetadata {
                name: uid.into(),
                uid: uid.into(),
                namespace: "ns".into(),
                attempt,
            }),
            log_directory: log_dir.to_string_lossy().into_owned(),
            labels,
            ..Default::default()
        };
        std::fs::create_dir_all(log_dir).expect("log dir");
        let volume = self
            .pods
            .join(uid)
            .join("volumes/kubernetes.io~empty-dir/data");
        std::fs::create_dir_all(&volume).expect("pod dir");
        std::fs::write(volume.join("file"), "x").expect("volume file");
        self.rt
            .run_pod_sandbox(cri::RunPodSandboxRequest {
                config: Some(config),
                runtime_handler: String::new(),
            })
            .await
            .expect("run sandbox")
            .pod_sandbox_id
    }

    async fn sandbox(&self, uid: &str, attempt: u32) -> String {
        let dir = self.log_dir(uid);
        self.sandbox_in(uid, attempt, &dir).await
    }

    fn log_dir(&self, uid: &str) -> PathBuf {
        self.logs.join(format!("ns_{uid}_{uid}"))
    }

    /// Creates container `name` (attempt `attempt`) of pod `uid` in `sid`, with its log file
    /// written; returns its id.
    async fn container(&self, sid: &str, uid: &str, name: &str, attempt: u32) -> String {
        let labels = HashMap::from([
            (LABEL_POD_UID.to_string(), uid.to_string()),
            (LABEL_POD_NAME.to_string(), uid.to_string()),
            (LABEL_POD_NAMESPACE.to_string(), "ns".to_string()),
            (LABEL_CONTAINER_NAME.to_string(), name.to_string()),
        ]);
        let id = self.create(sid, name, attempt, labels).await;
        let log = self.log_path(&id);
        if let Some(parent) = log.parent() {
            std::fs::create_dir_all(parent).expect("log parent");
        }
        std::fs::write(&log, "log line\n").expect("log file");
        id
    }

    async fn create(
        &self,
        sid: &str,
        name: &str,
        attempt: u32,
        labels: HashMap<String, String>,
    ) -> String {
        self.rt
            .create_container(cri::CreateContainerRequest {
                pod_sandbox_id: sid.into(),
                config: Some(cri::ContainerConfig {
                    metadata: Some(cri::ContainerMetadata {
                        name: name.into(),
                        attempt,
                    }),
                    image: Some(cri::ImageSpec {
                        image: "busybox".into(),
                        ..Default::default()
                    }),
                    log_path: format!("{name}/{attempt}.log"),
                    labels,
                    ..Default::default()
                }),
                sandbox_config: None,
            })
            .await
            .expect("create container")
            .container_id
    }

    async fn start(&self, id: &str) {
        self.rt
            .start_container(cri::StartContainerRequest {
                container_id: id.into(),
            })
            .await
            .expect("start");
    }

    /// Creates, starts and exits container `name` (attempt `attempt`).
    async fn dead(&self, sid: &str, uid: &str, name: &str, attempt: u32) -> String {
        let id = self.container(sid, uid, name, attempt).await;
        self.start(&id).await;
        self.rt.set_container_exited(&id, 1, "Error").expect("exit");
        id
    }

    async fn stop_sandbox(&self, sid: &str) {
        self.rt
            .stop_pod_sandbox(cri::StopPodSandboxRequest {
                pod_sandbox_id: sid.into(),
            })
            .await
            .expect("stop sandbox");
    }

    fn log_path(&self, id: &str) -> PathBuf {
        let c = self
            .rt
            .containers()
            .into_iter()
            .find(|c| c.id == id)
            .expect("container exists");
        PathBuf::from(c.log_path)
    }

    fn container_ids(&self) -> BTreeSet<String> {
        self.rt.containers().into_iter().map(|c| c.id).collect()
    }

    fn sandbox_ids(&self) -> BTreeSet<String> {
        self.rt.sandboxes().into_iter().map(|s| s.id).collect()
    }
}

fn set(ids: &[&String]) -> BTreeSet<String> {
    ids.iter().map(|s| s.to_string()).collect()
}

fn sorted(v: &[String]) -> BTreeSet<String> {
    v.iter().cloned().collect()
}

/// Every UID in `gone` is Gone, every UID in `terminated` Terminated, the rest Active.
fn states(
    gone: &'static [&'static str],
    terminated: &'static [&'static str],
) -> impl Fn(&str) -> PodState + Send + Sync {
    move |uid| {
        if gone.contains(&uid) {
            PodState::Gone
        } else if terminated.contains(&uid) {
            PodState::Terminated
        } else {
            PodState::Active
        }
    }
}

#[tokio::test]
async fn crash_loop_keeps_the_newest_dead_container_and_the_running_one() {
    let env = Env::new();
    let sid = env.sandbox("p1", 0).await;
    let mut dead = Vec::new();
    for attempt in 0..4 {
        dead.push(env.dead(&sid, "p1", "app", attempt).await);
    }
    let running = env.container(&sid, "p1", "app", 4).await;
    env.start(&running).await;
    let side = env.dead(&sid, "p1", "side", 0).await;
    let logs: Vec<PathBuf> = dead.iter().map(|id| env.log_path(id)).collect();

    let report = env.gc().collect(&states(&[], &[])).await;

    assert_eq!(report.errors, Vec::<String>::new());
    assert_eq!(
        sorted(&report.removed_containers),
        set(&[&dead[0], &dead[1], &dead[2]])
    );
    assert_eq!(
        env.container_ids(),
        set(&[&dead[3], &running, &side]),
        "the newest dead attempt, the running one and the other name's only one stay"
    );
    for log in &logs[..3] {
        assert!(!log.exists(), "{} removed", log.display());
    }
    assert!(logs[3].exists(), "the kept container's log stays");
    assert!(env.log_path(&running).exists());
    assert_eq!(env.sandbox_ids(), set(&[&sid]));
    assert!(report.removed_sandboxes.is_empty());
    assert!(env.pods.join("p1").is_dir());
    assert!(env.log_dir("p1").is_dir());
    // Each removal asked the status (for the log path) before removing.
    let calls = env.rt.called();
    assert_eq!(calls.iter().filter(|c| *c == "RemoveContainer").count(), 3);
    assert_eq!(calls.iter().filter(|c| *c == "ContainerStatus").count(), 3);

    // A second pass has nothing left to do.
    let again = env.gc().collect(&states(&[], &[])).await;
    assert_eq!(again, GcReport::default());
}

#[tokio::test]
async fn a_gone_pod_loses_everything_once_nothing_runs() {
    let env = Env::new();
    // p1: two sandboxes, both stopped, with dead containers in each.
    let old = env.sandbox("p1", 0).await;
    let a0 = env.dead(&old, "p1", "app", 0).await;
    env.stop_sandbox(&old).await;
    let new = env.sandbox("p1", 1).await;
    let a1 = env.dead(&new, "p1", "app", 1).await;
    let created = env.container(&new, "p1", "app", 2).await;
    env.stop_sandbox(&new).await;
    // busy: gone too, but a container still runs in a ready sandbox.
    let busy_sb = env.sandbox("busy", 0).await;
    let busy_dead = env.dead(&busy_sb, "busy", "app", 0).await;
    let busy_run = env.container(&busy_sb, "busy", "app", 1).await;
    env.start(&busy_run).await;
    // keep: active, same shape as p1.
    let keep_sb = env.sandbox("keep", 0).await;
    let keep_c = env.dead(&keep_sb, "keep", "app", 0).await;
    env.stop_sandbox(&keep_sb).await;
    // A directory of a pod from before a restart, nothing of it in the runtime.
    std::fs::create_dir_all(env.pods.join("old-uid/etc-hosts")).expect("old pod dir");
    std::fs::create_dir_all(env.logs.join("ns_old_old-uid/app")).expect("old log dir");
    let p1_logs = [env.log_path(&a0), env.log_path(&a1)];
    env.rt.clear_calls();

    let report = env
        .gc()
        .collect(&states(&["p1", "busy", "old-uid"], &[]))
        .await;

    assert_eq!(report.errors, Vec::<String>::new());
    assert_eq!(
        sorted(&report.removed_containers),
        set(&[&a0, &a1, &created, &busy_dead])
    );
    assert_eq!(sorted(&report.removed_sandboxes), set(&[&old, &new]));
    assert_eq!(report.removed_pod_dirs, vec!["old-uid", "p1"]);
    assert_eq!(
        report.removed_log_dirs,
        vec![env.logs.join("ns_old_old-uid"), env.log_dir("p1")]
    );
    assert_eq!(env.container_ids(), set(&[&busy_run, &keep_c]));
    assert_eq!(env.sandbox_ids(), set(&[&busy_sb, &keep_sb]));
    assert!(!env.pods.join("p1").exists());
    assert!(!env.log_dir("p1").exists());
    assert!(!env.pods.join("old-uid").exists());
    assert!(p1_logs.iter().all(|l| !l.exists()));
    // Something of busy still runs: its directories stay.
    assert!(env.pods.join("busy").is_dir());
    assert!(env.log_dir("busy").is_dir());
    assert!(env.log_path(&busy_run).exists());
    assert!(env.pods.join("keep").is_dir());
    assert!(env.log_dir("keep").is_dir());
    // Sandboxes were stopped before their removal.
    let calls = env.rt.called();
    let removals: Vec<usize> = (0..calls.len())
        .filter(|&i| calls[i] == "RemovePodSandbox")
        .collect();
    assert_eq!(removals.len(), 2, "{calls:?}");
    for i in removals {
        assert_eq!(calls[i - 1], "StopPodSandbox", "{calls:?}");
    }
}

#[tokio::test]
async fn a_terminated_pod_keeps_its_newest_dead_container_per_name() {
    let env = Env::new();
    let sid = env.sandbox("done", 0).await;
    let init: Vec<String> = {
        let mut v = Vec::new();
        for a in 0..2 {
            v.push(env.dead(&sid, "done", "init", a).await);
        }
        v
    };
    let mut app = Vec::new();
    for a in 0..3 {
        app.push(env.dead(&sid, "done", "app", a).await);
    }
    env.stop_sandbox(&sid).await;

    let report = env.gc().collect(&states(&[], &["done"])).await;

    assert_eq!(report.errors, Vec::<String>::new());
    assert_eq!(
        sorted(&report.removed_containers),
        set(&[&init[0], &app[0], &app[1]])
    );
    assert_eq!(env.container_ids(), set(&[&init[1], &app[2]]));
    assert_eq!(env.sandbox_ids(), set(&[&sid]), "its only sandbox stays");
    assert!(env.pods.join("done").is_dir());
    assert!(env.log_dir("done").is_dir());
    assert!(env.log_path(&app[2]).exists());
}

#[tokio::test]
async fn older_dead_sandboxes_go_ready_ones_never() {
    let env = Env::new();
    // p1 (active): an old stopped sandbox holding a dead container that a newer attempt in
    // the new sandbox supersedes; the sandbox goes once the container is gone.
    let s0 = env.sandbox("p1", 0).await;
    let c0 = env.dead(&s0, "p1", "app", 0).await;
    env.stop_sandbox(&s0).await;
    let s1 = env.sandbox("p1", 1).await;
    let c1 = env.dead(&s1, "p1", "app", 1).await;
    let s2 = env.sandbox("p1", 2).await;
    // p2 (active): two stopped sandboxes; the newest stays.
    let q0 = env.sandbox("p2", 0).await;
    env.stop_sandbox(&q0).await;
    let q1 = env.sandbox("p2", 1).await;
    env.stop_sandbox(&q1).await;
    // p3 (gone): two ready sandboxes, no containers: never removed.
    let r0 = env.sandbox("p3", 0).await;
    let r1 = env.sandbox("p3", 1).await;

    let report = env.gc().collect(&states(&["p3"], &[])).await;

    assert_eq!(report.errors, Vec::<String>::new());
    assert_eq!(report.removed_containers, vec![c0.clone()]);
    // s1 is older than s2 but READY: it stays.
    assert_eq!(sorted(&report.removed_sandboxes), set(&[&s0, &q0]));
    assert_eq!(env.sandbox_ids(), set(&[&s1, &s2, &q1, &r0, &r1]));
    assert_eq!(env.container_ids(), set(&[&c1]));
    // p3 still has sandboxes: its directories stay although it is gone.
    assert!(env.pods.join("p3").is_dir());
    assert!(report.removed_pod_dirs.is_empty());
    // The logs of p3 have no container: that directory may go.
    assert_eq!(report.removed_log_dirs, vec![env.log_dir("p3")]);
}

#[tokio::test]
async fn a_created_container_that_is_the_newest_of_its_name_stays() {
    let env = Env::new();
    let sid = env.sandbox("p1", 0).await;
    let old = env.dead(&sid, "p1", "app", 0).await;
    let stale_created = env.container(&sid, "p1", "app", 1).await;
    let created = env.container(&sid, "p1", "app", 2).await;

    let report = env.gc().collect(&states(&[], &[])).await;

    assert_eq!(report.errors, Vec::<String>::new());
    assert_eq!(
        sorted(&report.removed_containers),
        set(&[&old, &stale_created])
    );
    assert_eq!(env.container_ids(), set(&[&created]));
}

#[tokio::test]
async fn foreign_containers_and_sandboxes_are_left_alone() {
    let env = Env::new();
    let foreign_sb = env
        .rt
        .run_pod_sandbox(cri::RunPodSandboxRequest {
            config: Some(cri::PodSandboxConfig {
                metadata: Some(cri::PodSandboxMetadata {
                    name: "other".into(),
                    uid: "other-uid".into(),
                    namespace: "x".into(),
                    attempt: 0,
                }),
                ..Default::default()
            }),
            runtime_handler: String::new(),
        })
        .await
        .expect("sandbox")
        .pod_sandbox_id;
    let mut foreign = Vec::new();
    for a in 0..3 {
        let id = env.create(&foreign_sb, "c", a, HashMap::new()).await;
        env.start(&id).await;
        env.rt
            .set_container_exited(&id, 0, "Completed")
            .expect("exit");
        foreign.push(id);
    }
    let second_sb = env
        .rt
        .run_pod_sandbox(cri::RunPodSandboxRequest {
            config: Some(cri::PodSandboxConfig {
                metadata: Some(cri::PodSandboxMetadata {
                    name: "other".into(),
                    uid: "other-uid".into(),
                    namespace: "x".into(),
                    attempt: 1,
                }),
                ..Default::default()
            }),
            runtime_handler: String::new(),
        })
        .await
        .expect("sandbox")
        .pod_sandbox_id;
    env.stop_sandbox(&foreign_sb).await;
    env.stop_sandbox(&second_sb).await;
    // A directory named by the foreign sandbox's UID stays too: the runtime still holds
    // something of that UID.
    std::fs::create_dir_all(env.pods.join("other-uid")).expect("dir");

    let all_gone = |_: &str| PodState::Gone;
    let report = env.gc().collect(&all_gone).await;

    assert_eq!(report, GcReport::default());
    assert_eq!(env.container_ids().len(), 3);
    assert_eq!(env.sandbox_ids(), set(&[&foreign_sb, &second_sb]));
    assert!(env.pods.join("other-uid").is_dir());
}

#[tokio::test]
async fn a_failed_removal_is_reported_and_the_pass_goes_on() {
    let env = Env::new();
    let sid = env.sandbox("p1", 0).await;
    let mut dead = Vec::new();
    for a in 0..3 {
        dead.push(env.dead(&sid, "p1", "app", a).await);
    }
    env.rt
        .inject_error("RemoveContainer", Error::unavailable("disk on fire"));

    let report = env.gc().collect(&states(&[], &[])).await;

    assert_eq!(report.errors.len(), 1, "{:?}", report.errors);
    assert!(
        report.errors[0].contains("disk on fire"),
        "{:?}",
        report.errors
    );
    assert_eq!(report.removed_containers.len(), 1);
    assert_eq!(env.container_ids().len(), 2);
    // The failed one goes on the next pass (its log file is already gone).
    let again = env.gc().collect(&states(&[], &[])).await;
    assert_eq!(again.errors, Vec::<String>::new());
    assert_eq!(again.removed_containers.len(), 1);
    assert_eq!(env.container_ids(), set(&[&dead[2]]));

    // A failing listing ends the pass without removing anything.
    env.rt
        .inject_error("ListContainers", Error::unavailable("runtime down"));
    let failed = env.gc().collect(&states(&["p1"], &[])).await;
    assert_eq!(failed.errors.len(), 1);
    assert!(failed.errors[0].contains("runtime down"));
    assert!(failed.removed_containers.is_empty());
    assert_eq!(env.container_ids(), set(&[&dead[2]]));

    // A failing sandbox removal is reported; the directories then stay (it is still there).
    env.stop_sandbox(&sid).await;
    env.rt
        .inject_error("RemovePodSandbox", Error::unavailable("busy"));
    let partial = env.gc().collect(&states(&["p1"], &[])).await;
    assert_eq!(partial.removed_containers, vec![dead[2].clone()]);
    assert!(partial.removed_sandboxes.is_empty());
    assert_eq!(partial.errors.len(), 1, "{:?}", partial.errors);
    assert!(partial.errors[0].contains(&sid));
    assert!(partial.removed_pod_dirs.is_empty());
    assert!(env.pods.join("p1").is_dir());
    // Its logs hold no container any more.
    assert_eq!(partial.removed_log_dirs, vec![env.log_dir("p1")]);
}

#[tokio::test]
async fn a_pod_dir_with_a_mount_below_it_is_skipped() {
    let env = Env::new();
    std::fs::create_dir_all(env.pods.join("mounted/volumes/kubernetes.io~empty-dir")).expect("dir");
    std::fs::create_dir_all(env.pods.join("plain/volumes")).expect("dir");
    let mount = env
        .pods
        .join("mounted/volumes/kubernetes.io~empty-dir/my data");
    let escaped = mount.to_string_lossy().replace(' ', "\\040");
    std::fs::write(
        &env.mountinfo,
        format!(
            "22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw\n\
             600 22 0:90 / {escaped} rw,relatime shared:300 - tmpfs tmpfs rw,size=1024k\n"
        ),
    )
    .expect("mountinfo");
    // A symbolic link in the pods dir pointing elsewhere: neither followed nor removed.
    let outside = env.root.join("outside");
    std::fs::create_dir_all(&outside).expect("outside");
    std::fs::write(outside.join("precious"), "keep").expect("file");
    std::os::unix::fs::symlink(&outside, env.pods.join("link")).expect("symlink");

    let all_gone = |_: &str| PodState::Gone;
    let report = env.gc().collect(&all_gone).await;

    assert_eq!(report.removed_pod_dirs, vec!["plain"]);
    assert_eq!(report.errors.len(), 1, "{:?}", report.errors);
    assert!(
        report.errors[0].contains(&mount.display().to_string()),
        "the error names the mount: {:?}",
        report.errors
    );
    assert!(mount.parent().is_some_and(Path::is_dir));
    assert!(!env.pods.join("plain").exists());
    assert!(outside.join("precious").exists());
    assert!(
        std::fs::symlink_metadata(env.pods.join("link")).is_ok_and(|m| m.is_symlink()),
        "the link itself stays"
    );
}

#[tokio::test]
async fn an_unreadable_mount_table_removes_no_directory() {
    let env = Env::new();
    std::fs::create_dir_all(env.pods.join("gone")).expect("dir");
    std::fs::remove_file(&env.mountinfo).expect("rm mountinfo");

    let report = env.gc().collect(&|_: &str| PodState::Gone).await;

    assert!(report.removed_pod_dirs.is_empty());
    assert_eq!(report.errors.len(), 1, "{:?}", report.errors);
    assert!(env.pods.join("gone").is_dir());
}

#[tokio::test]
async fn log_dirs_that_do_not_parse_and_active_pods_stay() {
    let env = Env::new();
    for name in ["garbage", "ns_only", "_name_uid", "ns__uid", "ns_name_"] {
        std::fs::create_dir_all(env.logs.join(name)).expect("dir");
    }
    std::fs::create_dir_all(env.logs.join("ns_web_u-active")).expect("dir");
    std::fs::create_dir_all(env.logs.join("ns_web_u-gone")).expect("dir");
    std::fs::write(env.logs.join("ns_file_u-gone2"), "not a dir").expect("file");

    let report = env
        .gc()
        .collect(&|uid: &str| {
            if uid == "u-active" {
                PodState::Active
            } else {
                PodState::Gone
            }
        })
        .await;

    assert_eq!(report.errors, Vec::<String>::new());
    assert_eq!(
        report.removed_log_dirs,
        vec![env.logs.join("ns_web_u-gone")]
    );
    for name in [
        "garbage",
        "ns_only",
        "_name_uid",
        "ns__uid",
        "ns_name_",
        "ns_web_u-active",
        "ns_file_u-gone2",
    ] {
        assert!(env.logs.join(name).exists(), "{name} stays");
    }
}

#[tokio::test]
async fn a_log_path_outside_the_pod_logs_dir_is_not_touched() {
    let env = Env::new();
    let elsewhere = env.root.join("elsewhere");
    let sid = env.sandbox_in("p1", 0, &elsewhere).await;
    let old = env.dead(&sid, "p1", "app", 0).await;
    let _new = env.dead(&sid, "p1", "app", 1).await;
    let old_log = env.log_path(&old);
    assert!(old_log.starts_with(&elsewhere));

    let report = env.gc().collect(&states(&[], &[])).await;

    assert_eq!(report.removed_containers, vec![old]);
    assert!(
        old_log.exists(),
        "a file outside the pod logs dir is not the kubelet's"
    );
}

#[test]
fn collect_is_send() {
    fn assert_send<T: Send>(_: T) {}
    let rt: Arc<dyn RuntimeService> = Arc::new(FakeRuntime::new());
    let gc = GarbageCollector::new(rt, PathBuf::from("/p"), PathBuf::from("/l"));
    let f = |_: &str| PodState::Active;
    assert_send(gc.collect(&f));
}

#[test]
fn log_dir_names_parse_to_the_uid() {
    assert_eq!(
        log_dir_uid("kube-system_coredns-abc_0f3c1d2e-1111-2222-3333-444455556666"),
        Some("0f3c1d2e-1111-2222-3333-444455556666")
    );
    assert_eq!(log_dir_uid("ns_na_me_uid"), Some("uid"));
    assert_eq!(log_dir_uid("ns_uid"), None);
    assert_eq!(log_dir_uid("nounderscore"), None);
    assert_eq!(log_dir_uid("ns_name_"), None);
    assert_eq!(log_dir_uid("_name_uid"), None);
    assert_eq!(log_dir_uid("ns__uid"), None);
}

#[test]
fn is_below_refuses_escapes() {
    let logs = Path::new("/var/log/pods");
    assert!(is_below(Path::new("/var/log/pods/ns_a_u/c/0.log"), logs));
    assert!(!is_below(Path::new("/var/log/pods/../../etc/passwd"), logs));
    assert!(!is_below(Path::new("/var/log/podsx/a.log"), logs));
    assert!(!is_below(Path::new("var/log/pods/a.log"), logs));
    assert!(!is_below(logs, logs));
}
