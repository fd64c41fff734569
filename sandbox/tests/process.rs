//! Real sandboxes and containers: this test binary re-executes itself as the sandbox process
//! (exactly as the nodelet binary does), builds a busybox root filesystem from the host's
//! dynamic busybox, and drives the sandbox through its async client. Needs root; skips loudly
//! otherwise.

use std::path::{Path, PathBuf};
use std::time::Duration;

use oci_spec::runtime::{
    LinuxMemoryBuilder, LinuxNamespaceBuilder, LinuxNamespaceType, LinuxResourcesBuilder,
    Spec as OciSpec,
};
use sandbox::{Client, ContainerSpec, ExecSpec, Kind, NamespaceMode, Spec, State};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("__sandbox") {
        let code = sandbox::process::main(Path::new(&args[2]));
        std::process::exit(code);
    }
    if !nix::unistd::geteuid().is_root() {
        let line =
            "SKIP (needs root): sandbox process tests create namespaces, cgroups and containers";
        // Under CI (`CI` set to `true` or `1`) a test that cannot run fails instead.
        if std::env::var("CI").is_ok_and(|v| v == "1" || v.eq_ignore_ascii_case("true")) {
            eprintln!("FAIL: {line}");
            std::process::exit(1);
        }
        eprintln!("{line}");
        println!("0 passed, 0 failed, 6 skipped");
        return;
    }
    if !Path::new("/bin/busybox").exists() {
        eprintln!("FAIL: /bin/busybox (Debian package busybox) is missing; run scripts/setup.sh");
        std::process::exit(1);
    }
    let filter = args.iter().skip(1).find(|a| !a.starts_with('-')).cloned();
    type Test = fn(&Env);
    let tests: Vec<(&str, Test)> = vec![
        ("exit_code_and_cri_logs", exit_code_and_cri_logs),
        ("pod_namespaces_are_shared", pod_namespaces_are_shared),
        ("stop_escalates_to_sigkill", stop_escalates_to_sigkill),
        ("exec_output_and_timeout", exec_output_and_timeout),
        (
            "oom_killed_with_small_memory_limit",
            oom_killed_with_small_memory_limit,
        ),
        ("bad_requests_change_nothing", bad_requests_change_nothing),
        ("shared_pid_namespace", shared_pid_namespace),
        (
            "shutdown_leaves_nothing_behind",
            shutdown_leaves_nothing_behind,
        ),
    ];
    let rt = tokio::runtime::Runtime::new().expect("tokio runtime");
    let (mut passed, mut failed) = (0, 0);
    for (name, test) in tests {
        if filter.as_deref().is_some_and(|f| !name.contains(f)) {
            continue;
        }
        let env = Env::new(&rt, name);
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| test(&env)));
        env.cleanup();
        match result {
            Ok(()) => {
                println!("test {name} ... ok");
                passed += 1;
            }
            Err(_) => {
                println!("test {name} ... FAILED");
                failed += 1;
            }
        }
    }
    println!("{passed} passed, {failed} failed");
    if failed > 0 {
        std::process::exit(1);
    }
}

struct Env<'a> {
    rt: &'a tokio::runtime::Runtime,
    dir: tempfile::TempDir,
    name: String,
}

impl<'a> Env<'a> {
    fn new(rt: &'a tokio::runtime::Runtime, name: &str) -> Self {
        let dir = tempfile::Builder::new()
            .prefix("sbx")
            .tempdir()
            .expect("tempdir");
        Env {
            rt,
            dir,
            name: name.replace('_', "-"),
        }
    }

    fn cgroup_parent(&self) -> String {
        format!("/nodelet-test/{}-{}", self.name, std::process::id())
    }

    fn spec(&self) -> Spec {
        Spec {
            id: "pod1".into(),
            hostname: "testpod".into(),
            cgroup_parent: self.cgroup_parent(),
            owns_cgroup_parent: true,
            ..Default::default()
        }
    }

    fn launch(&self, spec: &Spec) -> Client {
        let dir = self.dir.path().join("sb");
        let exe = std::env::current_exe().expect("current exe");
        self.rt
            .block_on(sandbox::launch(&exe, &["__sandbox"], &dir, spec))
            .expect("launch sandbox");
        Client::new(dir)
    }

    fn block<T>(&self, f: impl std::future::Future<Output = T>) -> T {
        self.rt.block_on(f)
    }

    /// Writes an OCI bundle running `args` in the pod's namespaces.
    fn bundle(
        &self,
        client: &Client,
        id: &str,
        args: &[&str],
        mutate: impl FnOnce(&mut OciSpec),
    ) -> ContainerSpec {
        let bundle = self.dir.path().join("bundles").join(id);
        let rootfs = bundle.join("rootfs");
        make_rootfs(&rootfs);
        let state = self.block(client.state()).expect("state");
        let mut spec = OciSpec::default();
        let mut process = spec.process().clone().expect("default process");
        process.set_terminal(Some(false));
        process.set_args(Some(args.iter().map(|s| s.to_string()).collect()));
        spec.set_process(Some(process));
        let mut root = spec.root().clone().expect("default root");
        root.set_path(rootfs.clone());
        root.set_readonly(Some(false));
        spec.set_root(Some(root));
        spec.set_hostname(None);
        let mut linux = spec.linux().clone().expect("default linux");
        let ns = |t: LinuxNamespaceType, path: Option<String>| {
            let mut b = LinuxNamespaceBuilder::default().typ(t);
            if let Some(p) = path {
                b = b.path(PathBuf::from(p));
            }
            b.build().expect("namespace")
        };
        let pid_ns = state.pid_ns_holder.map(|h| format!("/proc/{h}/ns/pid"));
        linux.set_namespaces(Some(vec![
            ns(LinuxNamespaceType::Pid, pid_ns),
            ns(
                LinuxNamespaceType::Network,
                Some(format!("/proc/{}/ns/net", state.pid)),
            ),
            ns(
                LinuxNamespaceType::Ipc,
                Some(format!("/proc/{}/ns/ipc", state.pid)),
            ),
            ns(
                LinuxNamespaceType::Uts,
                Some(format!("/proc/{}/ns/uts", state.pid)),
            ),
            ns(LinuxNamespaceType::Mount, None),
        ]));
        linux.set_cgroups_path(Some(PathBuf::from(format!(
            "{}/{id}",
            self.cgroup_parent()
        ))));
        spec.set_linux(Some(linux));
        mutate(&mut spec);
        spec.save(bundle.join("config.json")).expect("save spec");
        ContainerSpec {
            id: id.into(),
            bundle,
            log_path: Some(self.dir.path().join("logs").join(format!("{id}.log"))),
            stdin: false,
            stdin_once: false,
        }
    }

    fn wait_exited(&self, client: &Client, id: &str) -> sandbox::ContainerStatus {
        for _ in 0..200 {
            let st = self.block(client.state()).expect("state");
            if let Some(c) = st.containers.iter().find(|c| c.id == id) {
                if c.state == State::Exited {
                    return c.clone();
                }
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!("container {id} did not exit");
    }

    fn cleanup(&self) {
        let client = Client::new(self.dir.path().join("sb"));
        if !client.is_stopped() && client.layout().socket().exists() {
            let _ = self.block(client.shutdown());
        }
        let _ = sandbox::cgroup::remove("/nodelet-test");
    }
}

/// A root filesystem with the host's dynamic busybox, its libraries and hard-linked applets.
fn make_rootfs(rootfs: &Path) {
    for d in [
        "bin",
        "lib",
        "lib64",
        "lib/x86_64-linux-gnu",
        "proc",
        "sys",
        "dev",
        "tmp",
        "etc",
    ] {
        std::fs::create_dir_all(rootfs.join(d)).expect("mkdir");
    }
    let out = std::process::Command::new("ldd")
        .arg("/bin/busybox")
        .output()
        .expect("ldd");
    for word in String::from_utf8_lossy(&out.stdout).split_whitespace() {
        if word.starts_with('/') && Path::new(word).exists() {
            let dst = rootfs.join(word.trim_start_matches('/'));
            std::fs::create_dir_all(dst.parent().expect("parent")).expect("mkdir");
            std::fs::copy(word, &dst).expect("copy lib");
        }
    }
    let bb = rootfs.join("bin/busybox");
    std::fs::copy("/bin/busybox", &bb).expect("copy busybox");
    let list = std::process::Command::new("/bin/busybox")
        .arg("--list")
        .output()
        .expect("busybox --list");
    for applet in String::from_utf8_lossy(&list.stdout).lines() {
        let _ = std::fs::hard_link(&bb, rootfs.join("bin").join(applet));
    }
    std::fs::write(rootfs.join("etc/passwd"), "root:x:0:0:root:/root:/bin/sh\n").expect("passwd");
}

fn log_records(path: &Path) -> Vec<(String, String, String)> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(|l| {
            let mut it = l.splitn(4, ' ');
            let _ts = it.next();
            (
                it.next().unwrap_or("").to_string(),
                it.next().unwrap_or("").to_string(),
                it.next().unwrap_or("").to_string(),
            )
        })
        .collect()
}

fn exit_code_and_cri_logs(env: &Env) {
    let client = env.launch(&env.spec());
    let c = env.bundle(
        &client,
        "c1",
        &[
            "sh",
            "-c",
            "echo hello; echo oops >&2; echo -n tail; exit 3",
        ],
        |_| {},
    );
    let log = c.log_path.clone().expect("log path");
    let created = env.block(client.create(c)).expect("create");
    assert_eq!(created.state, State::Created);
    // Nothing is made before the start: libcontainer makes the container then.
    assert_eq!(created.pid, 0);
    let started = env.block(client.start("c1")).expect("start");
    assert_eq!(started.state, State::Running);
    assert!(started.pid > 0);
    assert_eq!(started.created_at, created.created_at);
    let st = env.wait_exited(&client, "c1");
    assert_eq!(st.exit_code, 3);
    assert_eq!(st.reason, "Error");
    assert!(st.finished_at >= st.started_at && st.started_at >= st.created_at);
    let recs = log_records(&log);
    assert!(
        recs.contains(&("stdout".into(), "F".into(), "hello".into())),
        "{recs:?}"
    );
    assert!(
        recs.contains(&("stderr".into(), "F".into(), "oops".into())),
        "{recs:?}"
    );
    assert!(
        recs.contains(&("stdout".into(), "F".into(), "tail".into())),
        "{recs:?}"
    );
    // The exit is persisted where a later agent can read it.
    let persisted = client.persisted();
    assert_eq!(
        persisted.iter().find(|s| s.id == "c1").map(|s| s.exit_code),
        Some(3)
    );
    // Starting again is refused: the container is not in the created state.
    let err = env
        .block(client.start("c1"))
        .expect_err("restart of an exited container");
    assert_eq!(err.kind(), Kind::FailedPrecondition);
}

fn pod_namespaces_are_shared(env: &Env) {
    let client = env.launch(&env.spec());
    for id in ["a", "b"] {
        let c = env.bundle(&client, id, &["sleep", "60"], |_| {});
        env.block(client.create(c)).expect("create");
        env.block(client.start(id)).expect("start");
    }
    let ns_of = |id: &str| {
        let r = env
            .block(client.exec(ExecSpec {
                container_id: id.into(),
                args: vec!["sh".into(), "-c".into(), "readlink /proc/self/ns/net; readlink /proc/self/ns/ipc; readlink /proc/self/ns/uts; hostname; ip link show lo 2>/dev/null | head -1; cat /proc/net/if_inet6 2>/dev/null | wc -l".into()],
                timeout_ms: 10_000,
            }))
            .expect("exec");
        assert_eq!(r.exit_code, 0, "{}", String::from_utf8_lossy(&r.stderr));
        String::from_utf8_lossy(&r.stdout).into_owned()
    };
    let (a, b) = (ns_of("a"), ns_of("b"));
    assert_eq!(a, b, "containers of one pod share net, ipc and uts");
    assert!(
        a.starts_with("net:[") && a.contains("\nipc:[") && a.contains("\nuts:["),
        "the probe read the namespaces: {a}"
    );
    assert!(a.contains("testpod"), "hostname is the pod's: {a}");
    assert!(
        a.contains("UP") || a.contains("LOOPBACK"),
        "loopback present: {a}"
    );
    let host_net = std::fs::read_link("/proc/self/ns/net").expect("host netns");
    assert!(
        !a.contains(&host_net.to_string_lossy().to_string()),
        "pod has its own network namespace"
    );
}

fn stop_escalates_to_sigkill(env: &Env) {
    let client = env.launch(&env.spec());
    // sleep as PID 1 of its namespace ignores SIGTERM, so only SIGKILL ends it.
    let c = env.bundle(&client, "s", &["sleep", "1000"], |_| {});
    env.block(client.create(c)).expect("create");
    env.block(client.start("s")).expect("start");
    let st = env
        .block(client.stop("s", libc::SIGTERM, Duration::from_millis(300)))
        .expect("stop");
    assert_eq!(st.state, State::Exited);
    assert_eq!(st.exit_code, 137);
    // Stopping again is fine and changes nothing.
    let again = env
        .block(client.stop("s", libc::SIGTERM, Duration::from_secs(1)))
        .expect("stop again");
    assert_eq!(again, st);
    // A process that handles SIGTERM exits with its own code within the grace period.
    let c = env.bundle(
        &client,
        "t",
        &[
            "sh",
            "-c",
            "trap 'exit 7' TERM; while true; do sleep 0.1; done",
        ],
        |_| {},
    );
    env.block(client.create(c)).expect("create");
    env.block(client.start("t")).expect("start");
    std::thread::sleep(Duration::from_millis(300));
    let st = env
        .block(client.stop("t", libc::SIGTERM, Duration::from_secs(20)))
        .expect("stop");
    assert_eq!(st.exit_code, 7);
}

fn exec_output_and_timeout(env: &Env) {
    let client = env.launch(&env.spec());
    let c = env.bundle(&client, "e", &["sleep", "60"], |_| {});
    env.block(client.create(c)).expect("create");
    env.block(client.start("e")).expect("start");
    let r = env
        .block(client.exec(ExecSpec {
            container_id: "e".into(),
            args: vec![
                "sh".into(),
                "-c".into(),
                "echo out; echo err >&2; exit 5".into(),
            ],
            timeout_ms: 10_000,
        }))
        .expect("exec");
    assert_eq!(
        (r.exit_code, r.stdout.as_slice(), r.stderr.as_slice()),
        (5, &b"out\n"[..], &b"err\n"[..])
    );
    let err = env
        .block(client.exec(ExecSpec {
            container_id: "e".into(),
            args: vec!["sleep".into(), "30".into()],
            timeout_ms: 300,
        }))
        .expect_err("timeout");
    assert_eq!(err.kind(), Kind::DeadlineExceeded);
    let err = env
        .block(client.exec(ExecSpec {
            container_id: "nope".into(),
            args: vec!["true".into()],
            timeout_ms: 0,
        }))
        .expect_err("unknown container");
    assert_eq!(err.kind(), Kind::NotFound);
    // A command the container lacks is the exec's error, in runc's words.
    let err = env
        .block(client.exec(ExecSpec {
            container_id: "e".into(),
            args: vec!["no-such-command".into()],
            timeout_ms: 10_000,
        }))
        .expect_err("missing command");
    assert_eq!(err.kind(), Kind::InvalidArgument, "{err}");
    assert!(
        err.to_string()
            .contains(r#"exec: "no-such-command": executable file not found in $PATH"#),
        "{err}"
    );
    // The exec joins every namespace and cgroup of the container's init, and its PID
    // namespace: it sees the init as PID 1 and itself under another PID.
    let r = env
        .block(client.exec(ExecSpec {
            container_id: "e".into(),
            args: vec![
                "sh".into(),
                "-c".into(),
                "for n in cgroup ipc mnt net pid uts; do \
                   [ \"$(readlink /proc/self/ns/$n)\" = \"$(readlink /proc/1/ns/$n)\" ] || echo ns $n differs; \
                 done; \
                 [ \"$(cat /proc/self/cgroup)\" = \"$(cat /proc/1/cgroup)\" ] || echo cgroups differ; \
                 echo pid $$; cat /proc/1/cmdline | tr '\\0' ' '"
                    .into(),
            ],
            timeout_ms: 10_000,
        }))
        .expect("exec");
    let out = String::from_utf8_lossy(&r.stdout);
    assert_eq!(
        r.exit_code,
        0,
        "{out}{}",
        String::from_utf8_lossy(&r.stderr)
    );
    assert!(!out.contains("differ"), "{out}");
    assert!(
        out.contains("sleep 60"),
        "PID 1 is the container's init: {out}"
    );
    let pid: u32 = out
        .lines()
        .find_map(|l| l.strip_prefix("pid "))
        .and_then(|p| p.trim().parse().ok())
        .expect("pid line");
    assert!(
        pid > 1 && pid < 100,
        "a PID of the container's namespace: {out}"
    );
    // The container is untouched by the failed execs.
    let st = env.block(client.state()).expect("state");
    assert_eq!(st.containers[0].state, State::Running);
}

fn oom_killed_with_small_memory_limit(env: &Env) {
    let client = env.launch(&env.spec());
    let c = env.bundle(
        &client,
        "oom",
        &["sh", "-c", "x=a; while true; do x=$x$x; done"],
        |spec| {
            let mut linux = spec.linux().clone().expect("linux");
            let mem = LinuxMemoryBuilder::default()
                .limit(16 * 1024 * 1024_i64)
                .build()
                .expect("mem");
            linux.set_resources(Some(
                LinuxResourcesBuilder::default()
                    .memory(mem)
                    .build()
                    .expect("res"),
            ));
            spec.set_linux(Some(linux));
        },
    );
    env.block(client.create(c)).expect("create");
    env.block(client.start("oom")).expect("start");
    let st = env.wait_exited(&client, "oom");
    assert_eq!(st.reason, "OOMKilled", "{st:?}");
    assert_eq!(st.exit_code, 137);
}

fn bad_requests_change_nothing(env: &Env) {
    let client = env.launch(&env.spec());
    let good = env.bundle(&client, "good", &["sleep", "60"], |_| {});
    env.block(client.create(good.clone())).expect("create");
    env.block(client.start("good")).expect("start");
    // Duplicate id.
    let err = env.block(client.create(good)).expect_err("duplicate");
    assert_eq!(err.kind(), Kind::AlreadyExists);
    // A bundle without config.json.
    let err = env
        .block(client.create(ContainerSpec {
            id: "nobundle".into(),
            bundle: "/nonexistent".into(),
            log_path: None,
            stdin: false,
            stdin_once: false,
        }))
        .expect_err("missing bundle");
    assert_eq!(err.kind(), Kind::InvalidArgument);
    // A binary that does not exist.
    let c = env.bundle(&client, "nobin", &["/no/such/binary"], |_| {});
    match env.block(client.create(c)) {
        Err(e) => assert_eq!(e.kind(), Kind::InvalidArgument, "{e}"),
        Ok(_) => {
            let r = env.block(client.start("nobin"));
            if r.is_ok() {
                let st = env.wait_exited(&client, "nobin");
                assert_ne!(st.exit_code, 0);
            }
        }
    }
    // Unknown ids.
    assert_eq!(
        env.block(client.start("ghost")).expect_err("ghost").kind(),
        Kind::NotFound
    );
    assert_eq!(
        env.block(client.stop("ghost", 15, Duration::from_secs(1)))
            .expect_err("ghost")
            .kind(),
        Kind::NotFound
    );
    env.block(client.delete("ghost"))
        .expect("deleting an unknown id succeeds");
    // Garbage on the socket.
    {
        use std::io::{BufRead, Write};
        let mut s =
            std::os::unix::net::UnixStream::connect(client.layout().socket()).expect("connect");
        s.write_all(b"{not json\n").expect("write");
        let mut line = String::new();
        std::io::BufReader::new(&s)
            .read_line(&mut line)
            .expect("read");
        assert!(line.contains("InvalidArgument"), "{line}");
    }
    let st = env.block(client.state()).expect("state");
    let good = st
        .containers
        .iter()
        .find(|c| c.id == "good")
        .expect("good container");
    assert_eq!(good.state, State::Running);
}

fn shared_pid_namespace(env: &Env) {
    let mut spec = env.spec();
    spec.namespaces.pid = NamespaceMode::Pod;
    let client = env.launch(&spec);
    for id in ["p1", "p2"] {
        let c = env.bundle(&client, id, &["sleep", "60"], |_| {});
        env.block(client.create(c)).expect("create");
        env.block(client.start(id)).expect("start");
    }
    let r = env
        .block(client.exec(ExecSpec {
            container_id: "p2".into(),
            args: vec!["ps".into()],
            timeout_ms: 10_000,
        }))
        .expect("exec ps");
    let ps = String::from_utf8_lossy(&r.stdout);
    assert_eq!(
        ps.matches("sleep 60").count(),
        2,
        "both containers' processes are visible: {ps}"
    );
}

fn shutdown_leaves_nothing_behind(env: &Env) {
    let client = env.launch(&env.spec());
    let sandbox_pid = env.block(client.state()).expect("state").pid;
    let mut pids = vec![sandbox_pid];
    for id in ["x", "y"] {
        let c = env.bundle(&client, id, &["sleep", "600"], |_| {});
        let st = env.block(client.create(c)).expect("create");
        pids.push(st.pid);
        env.block(client.start(id)).expect("start");
    }
    env.block(client.shutdown()).expect("shutdown");
    std::thread::sleep(Duration::from_millis(200));
    for pid in pids {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        assert!(
            stat.is_empty() || stat.contains(") Z "),
            "process {pid} still alive: {stat}"
        );
    }
    for ctrl in ["memory", "pids", "cpu"] {
        let p = format!("/sys/fs/cgroup/{ctrl}{}", env.cgroup_parent());
        assert!(!Path::new(&p).exists(), "cgroup {p} left behind");
    }
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").expect("mountinfo");
    assert!(
        !mounts.contains(&env.dir.path().to_string_lossy().to_string()),
        "mount left behind"
    );
    // Statuses survive the sandbox for the runtime to report.
    let persisted = client.persisted();
    assert_eq!(persisted.len(), 2);
    assert!(
        persisted
            .iter()
            .all(|s| s.state == State::Exited && s.exit_code == 137)
    );
    assert!(client.is_stopped());
    assert_eq!(
        env.block(client.state()).expect_err("gone").kind(),
        Kind::Unavailable
    );
}
