//! `nodelet cri check` as a user runs it: the real binary against `nodelet cri serve` and a
//! private containerd 1.6 in one run, the test image from a busybox archive served by the
//! command's own registry on loopback, JSON out, with the bench. Then both runtimes are checked
//! to hold nothing of the run: no pod, no container, not the image it pulled.
//!
//! Needs root, and Debian's `containerd`, `runc` and `docker-registry`; skips loudly otherwise.
//! The usage errors need neither.

mod common;

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

use common::containerd::Containerd;
use common::cri_serve::{CriNode, CriServe};
use common::*;
use runtime::{ImageService, RuntimeService, cri};
use serde_json::Value;

fn check(args: &[&str]) -> Output {
    Command::new(nodelet_bin())
        .args(["cri", "check"])
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("running nodelet cri check")
}

/// The tests share this binary's bridge and subnet (`own_network`): one at a time.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// `nodelet cri serve` on a root dir of its own (busybox imported), on this binary's network.
async fn serve_node(tag: &str) -> (CriNode, NetworkGuard, CriServe) {
    let node = CriNode::new(tag);
    let net = own_network(node.root.path());
    let cidr = net.pod_cidrs[0].to_string();
    let args = ["--pod-bridge", &net.bridge, "--pod-cidr", &cidr];
    let server = node.serve("serve.log", &args).await;
    (node, NetworkGuard(net), server)
}

/// Starts `nodelet cri check` with its stdout piped and its stderr lines sent to the channel.
fn spawn_check(args: &[&str]) -> (Child, std::sync::mpsc::Receiver<String>) {
    let mut child = Command::new(nodelet_bin())
        .args(["cri", "check"])
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawning nodelet cri check");
    let stderr = child.stderr.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            eprintln!("check: {line}");
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    (child, rx)
}

/// Waits (60 s at most) for a stderr line holding `what`.
fn wait_for_line(rx: &std::sync::mpsc::Receiver<String>, what: &str) {
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        match rx.recv_timeout(left) {
            Ok(line) if line.contains(what) => return,
            Ok(_) => {}
            Err(e) => panic!("no line with {what:?} from nodelet cri check: {e}"),
        }
    }
}

fn signal(pid: u32, sig: &str) {
    let st = Command::new("kill")
        .args([sig, &pid.to_string()])
        .status()
        .expect("kill");
    assert!(st.success(), "kill {sig} {pid}");
}

/// The pods and containers on `endpoint`.
async fn held(endpoint: &str) -> (Vec<cri::PodSandbox>, Vec<cri::Container>) {
    let rt = runtime::remote::connect(endpoint, Duration::from_secs(20))
        .await
        .expect("connect");
    let pods = rt.list_pod_sandbox(Default::default()).await.unwrap();
    let cs = rt.list_containers(Default::default()).await.unwrap();
    (pods.items, cs.containers)
}

/// What each runtime is known to fail (tests/cri_suite.rs says why), and what it then says.
const CONTAINERD_FAILS: [(&str, &str); 6] = [
    ("target_pid_namespace", "the target's command"),
    ("pod_user_namespace", "UID and GID maps"),
    (
        "idempotence_of_stopped_and_removed",
        "must succeed, got not found",
    ),
    ("idempotence_of_unknown_ids", "must succeed, got not found"),
    ("container_events", "unimplemented"),
    ("container_events_carry_statuses", "unimplemented"),
];
/// nodelet passes every scenario.
const NODELET_FAILS: [(&str, &str); 0] = [];

/// Holds one cell of the report to what the runtime is known to do.
fn expect(name: &str, cell: &Value, fails: &[(&str, &str)], may_skip: bool) -> Result<(), String> {
    let status = cell["status"].as_str().unwrap_or_default();
    let message = cell["message"].as_str().unwrap_or_default();
    match fails.iter().find(|(s, _)| *s == name) {
        Some((_, says)) if status == "fail" && message.contains(says) => Ok(()),
        Some(_) => Err(format!("{name}: known to fail, got {cell}")),
        None if status == "pass" || (status == "skip" && may_skip) => Ok(()),
        None => Err(format!("{name}: {cell}")),
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn check_compares_nodelet_and_containerd_and_leaves_nothing() {
    let test = "check_compares_nodelet_and_containerd_and_leaves_nothing";
    if !root_or_skip(test) {
        return;
    }
    let bin = match common::containerd::prerequisites() {
        Ok(bin) => bin,
        Err(why) => return skip(&why, test),
    };
    let archive = busybox_archive();

    let _one = ONE_AT_A_TIME.lock().await;
    let (node, _network, server) = serve_node("check").await;
    let ctd = Containerd::start(&bin, &archive).await;

    // The command's registry gets a port chosen here, so that containerd's registry hosts
    // dir (whose `_default` sends every other name to the harness's registry) can point this
    // host:port at itself, over plain HTTP as for any loopback registry.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port();
    let host = format!("127.0.0.1:{port}");
    let hosts_dir = ctd.dir().join("certs.d").join(&host);
    std::fs::create_dir_all(&hosts_dir).unwrap();
    std::fs::write(
        hosts_dir.join("hosts.toml"),
        format!(
            "server = \"http://{host}\"\n\n[host.\"http://{host}\"]\n  \
             capabilities = [\"pull\", \"resolve\"]\n"
        ),
    )
    .unwrap();

    let nodelet_ep = node.endpoint.clone();
    let ctd_ep = ctd.endpoint();
    let out = check(&[
        "--endpoint",
        &nodelet_ep,
        "--endpoint",
        &ctd_ep,
        "--image-archive",
        archive.to_str().unwrap(),
        "--registry-listen",
        &host,
        "--output",
        "json",
        "--bench",
        "--iterations",
        "3",
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let diag = || {
        format!(
            "stderr:\n{stderr}\nthe server:\n{}\ncontainerd:\n{}",
            server.log(),
            ctd.log()
        )
    };
    let report: Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("stdout is not JSON ({e}): {:?}\n{}", out.stdout, diag()));
    eprintln!("{}", serde_json::to_string_pretty(&report).unwrap());
    // containerd fails two scenarios: exit status 1.
    assert_eq!(out.status.code(), Some(1), "{}", diag());

    assert_eq!(report["endpoints"], serde_json::json!([nodelet_ep, ctd_ep]));
    let scenarios = report["scenarios"].as_array().expect("scenarios");
    let names: Vec<&str> = scenarios
        .iter()
        .filter_map(|s| s["name"].as_str())
        .collect();
    let all: Vec<&str> = cri_check::SCENARIOS.iter().map(|s| s.name).collect();
    assert_eq!(names, all);
    for s in scenarios {
        let name = s["name"].as_str().unwrap();
        let ours = &s["results"][&nodelet_ep];
        if let Err(e) = expect(name, ours, &NODELET_FAILS, false) {
            panic!("nodelet: {e}\n{}", diag());
        }
        // containerd skips the pod-network scenarios only when it has no pod network.
        let theirs = &s["results"][&ctd_ep];
        if let Err(e) = expect(name, theirs, &CONTAINERD_FAILS, !ctd.has_pod_network()) {
            panic!("containerd: {e}\n{}", diag());
        }
    }
    assert_eq!(report["passed"], false);

    for ep in [&nodelet_ep, &ctd_ep] {
        let ops = report["bench"][ep].as_object().expect("bench per endpoint");
        assert!(ops.get("error").is_none(), "{ep}: {ops:?}");
        for op in cri_check::OPERATIONS {
            let o = &ops[op];
            let median = o["median_ms"]
                .as_f64()
                .unwrap_or_else(|| panic!("{ep} {op}: {o}"));
            let p90 = o["p90_ms"].as_f64().unwrap();
            assert!(median > 0.0 && p90 >= median, "{ep} {op}: {o}");
            let ratio = o["ratio"].as_f64().unwrap();
            if ep == &nodelet_ep {
                assert_eq!(ratio, 1.0, "the first endpoint is the reference");
            } else {
                let nodelet = report["bench"][&nodelet_ep][op]["median_ms"]
                    .as_f64()
                    .unwrap();
                // (The medians are rounded to 0.1 ms, the ratio is not.)
                let rounded = median / nodelet;
                assert!((ratio - rounded).abs() <= 0.1 * rounded, "{op}: {o}");
            }
        }
        // Both runtimes' processes are found by the sockets' peer credentials.
        let memory = &report["memory"][ep];
        assert!(
            memory["runtime_kib"].as_u64().unwrap_or(0) > 0,
            "{ep}: {memory}"
        );
    }

    // Nothing of the run is left on either runtime, the image it pulled included; but where
    // the image was there before (busybox imported into nodelet's store), it stays.
    let pulled = format!("{host}/library/busybox:latest");
    for (ep, had_it) in [(&nodelet_ep, true), (&ctd_ep, false)] {
        let rt = runtime::remote::connect(ep, Duration::from_secs(20))
            .await
            .expect("connect");
        let pods = rt.list_pod_sandbox(Default::default()).await.unwrap();
        assert!(pods.items.is_empty(), "{ep}: pods left: {:?}", pods.items);
        let cs = rt.list_containers(Default::default()).await.unwrap();
        assert!(cs.containers.is_empty(), "{ep}: containers left");
        let req = cri::ImageStatusRequest {
            image: Some(cri::ImageSpec {
                image: pulled.clone(),
                ..Default::default()
            }),
            verbose: false,
        };
        let status = rt.image_status(req).await.unwrap();
        if had_it {
            let image = status.image.expect("the image that was there");
            assert!(
                image.repo_tags.iter().any(|t| t == common::BUSYBOX),
                "{ep}: {:?}",
                image.repo_tags
            );
        } else {
            assert_eq!(status.image, None, "{ep}: the run's image is still there");
        }
    }

    // The text report: a column per endpoint, and the timing table.
    let out = check(&[
        "--endpoint",
        &nodelet_ep,
        "--endpoint",
        &ctd_ep,
        "--image",
        common::BUSYBOX,
        "--focus",
        "^runtime_version|^exec_sync$",
        "--bench",
        "--iterations",
        "2",
    ]);
    let text = String::from_utf8_lossy(&out.stdout);
    eprintln!("{text}");
    assert_eq!(out.status.code(), Some(0), "{text}\n{}", diag());
    let head = text.lines().next().unwrap_or_default();
    assert!(
        head.contains("nodelet") && head.contains("containerd"),
        "{head}"
    );
    let rows: Vec<&str> = text.lines().filter(|l| l.contains(" pass")).collect();
    assert_eq!(rows.len(), 2, "{text}");
    assert!(
        rows.iter().all(|r| r.matches("pass").count() == 2),
        "{text}"
    );
    assert!(text.contains("CreateContainer"), "{text}");
    drop(server);
    node.assert_all_gone();
}

#[tokio::test(flavor = "multi_thread")]
async fn ctrl_c_stops_the_run_and_removes_what_it_made() {
    if !root_or_skip("ctrl_c_stops_the_run_and_removes_what_it_made") {
        return;
    }
    let _one = ONE_AT_A_TIME.lock().await;
    let (node, _network, server) = serve_node("checkint").await;
    let (child, rx) = spawn_check(&[
        "--endpoint",
        &node.endpoint,
        "--image",
        common::BUSYBOX,
        "--output",
        "json",
    ]);
    // Interrupted while a scenario runs, its pod up: stop_container_grace_period, the next
    // after exec_sync, waits seconds for a container that ignores SIGTERM.
    wait_for_line(&rx, "exec_sync");
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while held(&node.endpoint).await.0.is_empty() {
        assert!(
            std::time::Instant::now() < deadline,
            "no pod of the run seen"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    signal(child.id(), "-INT");
    let out = child.wait_with_output().unwrap();
    assert_eq!(
        out.status.code(),
        Some(1),
        "an interrupted run does not pass"
    );
    let report: Value = serde_json::from_slice(&out.stdout).expect("the report, in JSON");
    assert_eq!(report["interrupted"], true);
    let status = |name: &str| {
        let s = report["scenarios"].as_array().unwrap().iter();
        let row = s.clone().find(|r| r["name"] == name).cloned();
        row.map(|r| r["results"][&node.endpoint].clone())
    };
    let first = status("runtime_version_and_status").unwrap();
    assert_eq!(first["status"], "pass", "{first}");
    let last = status("idempotence_of_unknown_ids").unwrap();
    assert_eq!(
        (&last["status"], &last["message"]),
        (&"skip".into(), &"interrupted".into())
    );
    let (pods, containers) = held(&node.endpoint).await;
    assert!(
        pods.is_empty() && containers.is_empty(),
        "left: {pods:?} {containers:?}"
    );
    drop(server);
    node.assert_all_gone();
}

#[tokio::test(flavor = "multi_thread")]
async fn a_runtime_that_hangs_is_reported_not_waited_on() {
    if !root_or_skip("a_runtime_that_hangs_is_reported_not_waited_on") {
        return;
    }
    let _one = ONE_AT_A_TIME.lock().await;
    let (node, _network, server) = serve_node("checkhang").await;
    let (child, rx) = spawn_check(&[
        "--endpoint",
        &node.endpoint,
        "--image",
        common::BUSYBOX,
        "--focus",
        "^(runtime_version_and_status|container_lifecycle_logs_and_exit_codes|exec_sync)$",
        "--timeout",
        "2",
        "--output",
        "json",
    ]);
    wait_for_line(&rx, "runtime_version_and_status");
    // The runtime stops answering (its process stopped, its socket still there).
    signal(server.pid(), "-STOP");
    let began = std::time::Instant::now();
    let out = tokio::task::spawn_blocking(move || child.wait_with_output().unwrap());
    let out = tokio::time::timeout(Duration::from_secs(120), out).await;
    signal(server.pid(), "-CONT");
    let out = out.expect("the check ends on its own deadlines").unwrap();
    eprintln!(
        "the check ended {:?} after the runtime hung",
        began.elapsed()
    );
    assert_eq!(out.status.code(), Some(1));
    let report: Value = serde_json::from_slice(&out.stdout).expect("the report, in JSON");
    let rows = report["scenarios"].as_array().unwrap();
    let results: Vec<(&str, &str, &str)> = rows
        .iter()
        .map(|r| {
            let res = &r["results"][&node.endpoint];
            (
                r["name"].as_str().unwrap(),
                res["status"].as_str().unwrap(),
                res["message"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(results[0].1, "pass", "{results:?}");
    for (name, status, message) in &results[1..] {
        assert_eq!(*status, "fail", "{name}: {message}");
        assert!(
            message.contains("did not answer") || message.contains("deadline"),
            "{name}: {message}"
        );
    }
    // The runtime answers again: what the run could not remove is found by its label.
    let run_id = report["run_id"].as_str().unwrap();
    let target = cri_check::connect(&node.endpoint, None, Duration::from_secs(20))
        .await
        .unwrap();
    // The calls the check gave up on while the runtime hung are served now (a RunPodSandbox
    // runs to its end, whoever waits for it): cleaned by label until nothing of the run is
    // left, listed or in the state dir. A sandbox half made would stay in the state dir.
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let errors = cri_check::cleanup(&target, run_id, None, Duration::from_secs(30)).await;
        assert!(errors.is_empty(), "{errors:?}");
        let (pods, containers) = held(&node.endpoint).await;
        let on_disk = common::state_entries(node.root.path(), "sandboxes");
        if pods.is_empty() && containers.is_empty() && on_disk.is_empty() {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "left: {pods:?} {containers:?} {on_disk:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    drop(server);
    node.assert_all_gone();
}

#[test]
fn usage_errors_exit_2_with_a_reason() {
    let sock = "unix:///nonexistent/cri.sock";
    let cases: [(&[&str], &str); 4] = [
        (&["--endpoint", sock], "--image"),
        (
            &["--endpoint", sock, "--image", "x", "--focus", "("],
            "regex",
        ),
        (
            &["--endpoint", sock, "--image-archive", "/nonexistent.tar"],
            "/nonexistent.tar",
        ),
        (&["--image", "x"], "--endpoint"),
    ];
    for (args, says) in cases {
        let out = check(args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(says), "{args:?}: {err}");
    }
    // The scenarios, listed without touching a runtime.
    let out = check(&[
        "--endpoint",
        sock,
        "--image",
        "x",
        "--list",
        "--skip",
        "network",
    ]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0));
    let listed: Vec<&str> = text.lines().filter_map(|l| l.split(' ').next()).collect();
    let want: Vec<&str> = cri_check::SCENARIOS
        .iter()
        .map(|s| s.name)
        .filter(|n| !n.contains("network"))
        .collect();
    assert_eq!(listed, want);
}
