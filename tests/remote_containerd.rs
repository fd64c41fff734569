//! The remote backend against a real containerd (Debian's `containerd` package, with `runc`): a
//! private containerd from `common::containerd` (own config, root, state and socket in a temp
//! dir; CRI plugin with `restrict_oom_score_adj`, cgroups on; images from a local
//! docker-registry; a CNI bridge on a private /24 when Debian's CNI plugins are installed) is
//! driven through `RemoteRuntime`: version negotiation, status, PullImage through the registry,
//! the sandbox image pulled by containerd itself, a pod running a container to its exit code
//! and an exec; and the pod network: pod IPs in the private range, a server in a pod reached
//! from the host by pod IP and through a hostPort on 127.0.0.1, and two pods reaching each
//! other. Needs root, containerd and docker-registry; skips loudly otherwise.

mod common;

use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::path::Path;
use std::time::{Duration, Instant};

use common::containerd::{self, Containerd, PAUSE};
use common::*;
use runtime::remote::{self, RemoteRuntime};
use runtime::{ImageService, RuntimeService, cri};

async fn wait_exited(rt: &RemoteRuntime, id: &str) -> cri::ContainerStatus {
    wait_exited_on(rt, id).await
}

async fn create_and_start(
    rt: &RemoteRuntime,
    sandbox: &(String, cri::PodSandboxConfig),
    name: &str,
    cmd: &[&str],
) -> String {
    start_container_on(rt, sandbox, container_config(name, cmd)).await
}

/// A private containerd and a `RemoteRuntime` connected to it, or `None` after a SKIP line.
async fn start(test: &str) -> Option<(Containerd, RemoteRuntime)> {
    if !root_or_skip(test) {
        return None;
    }
    let bin = match containerd::prerequisites() {
        Ok(bin) => bin,
        Err(why) => {
            skip(&why, test);
            return None;
        }
    };
    let ctd = Containerd::start(&bin, &busybox_archive()).await;
    let rt = remote::connect(&ctd.endpoint(), Duration::from_secs(20))
        .await
        .unwrap_or_else(|e| panic!("connect to containerd: {e}\n{}", ctd.log()));
    Some((ctd, rt))
}

/// Stops and removes the pods, checks nothing is listed, then drops containerd and checks it
/// left no mount or process under its dir and no bridge.
async fn remove_all(rt: &RemoteRuntime, ctd: Containerd, pods: &[&str]) {
    for id in pods {
        let stop = cri::StopPodSandboxRequest {
            pod_sandbox_id: id.to_string(),
        };
        rt.stop_pod_sandbox(stop).await.expect("StopPodSandbox");
        let remove = cri::RemovePodSandboxRequest {
            pod_sandbox_id: id.to_string(),
        };
        rt.remove_pod_sandbox(remove)
            .await
            .expect("RemovePodSandbox");
    }
    let left = rt
        .list_containers(Default::default())
        .await
        .unwrap()
        .containers;
    assert!(left.is_empty(), "{left:?}");
    assert!(
        rt.list_pod_sandbox(Default::default())
            .await
            .unwrap()
            .items
            .is_empty()
    );
    // containerd, its shims, its mounts and its bridge go with it.
    let dir = ctd.dir().to_path_buf();
    let bridge = ctd.pod_network().map(|n| n.bridge.clone());
    drop(ctd);
    assert_nothing_under(&dir);
    if let Some(bridge) = bridge {
        let link = Path::new("/sys/class/net").join(&bridge);
        assert!(!link.exists(), "bridge {bridge} left behind");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn remote_runtime_drives_a_real_containerd() {
    let Some((ctd, rt)) = start("remote_runtime_drives_a_real_containerd").await else {
        return;
    };
    let began = Instant::now();
    let v = rt.version_info().clone();
    eprintln!("containerd: {v:?}");
    assert_eq!(
        (v.runtime_name.as_str(), v.runtime_api_version.as_str()),
        ("containerd", "v1")
    );
    let conditions = rt
        .status(Default::default())
        .await
        .unwrap()
        .status
        .unwrap()
        .conditions;
    let ready = |t: &str| conditions.iter().any(|c| c.r#type == t && c.status);
    assert!(ready("RuntimeReady"), "{conditions:?}");
    // The network is ready with the CNI config; without one, it is not (and only hostNetwork
    // pods run).
    assert_eq!(
        ready("NetworkReady"),
        ctd.has_pod_network(),
        "{conditions:?}"
    );
    if !ctd.has_pod_network() {
        eprintln!("NOTE: no pod network here (see common::containerd): hostNetwork pod only");
    }
    // Optional RPCs: answered, or Unimplemented by an older containerd (1.6 has neither).
    match rt.runtime_config(Default::default()).await {
        Ok(rc) => eprintln!("RuntimeConfig: {rc:?}"),
        Err(e) => assert_eq!(e.code(), runtime::Code::Unimplemented, "{e}"),
    }
    match rt.get_container_events(Default::default()).await {
        Ok(_) => eprintln!("GetContainerEvents: streaming"),
        Err(e) => assert_eq!(e.code(), runtime::Code::Unimplemented, "{e}"),
    }

    // Images: busybox pulled through CRI from the local registry (docker.io's hosts.toml).
    assert!(
        rt.list_images(Default::default())
            .await
            .unwrap()
            .images
            .is_empty()
    );
    let image_ref = ctd.pull(&rt, BUSYBOX).await;
    assert!(image_ref.starts_with("sha256:"), "{image_ref}");
    let images = rt.list_images(Default::default()).await.unwrap().images;
    assert_eq!(images.len(), 1, "{images:?}");
    assert_eq!(images[0].id, image_ref);
    assert_eq!(images[0].repo_tags, [BUSYBOX]);
    // The repo digest names the upstream registry, not the mirror it came from.
    assert!(
        images[0]
            .repo_digests
            .iter()
            .any(|d| d.starts_with("docker.io/library/busybox@sha256:")),
        "{images:?}"
    );
    let spec = |image: &str| cri::ImageSpec {
        image: image.into(),
        ..Default::default()
    };
    let st = rt
        .image_status(cri::ImageStatusRequest {
            image: Some(spec(BUSYBOX)),
            verbose: false,
        })
        .await
        .unwrap();
    assert!(st.image.is_some());
    let fs = rt.image_fs_info(Default::default()).await.unwrap();
    assert!(!fs.image_filesystems.is_empty());
    // A name the registry does not have fails (and is looked for nowhere else).
    let missing = cri::PullImageRequest {
        image: Some(spec("docker.io/library/no-such-image:1")),
        ..Default::default()
    };
    let err = rt.pull_image(missing).await.unwrap_err();
    assert!(err.to_string().contains("not found"), "{err}");
    // A registry name without a hosts dir of its own goes to the local registry too (the
    // `_default` dir): nothing listens on 127.0.0.1:1.
    let elsewhere = "127.0.0.1:1/library/busybox:latest";
    assert_eq!(ctd.pull(&rt, elsewhere).await, image_ref);

    // A pod (its own network when there is one, else the host's): containerd pulls its sandbox
    // image itself; a container runs to its exit code, another takes an exec.
    let work = tempfile::tempdir().unwrap();
    let logs = work.path().join("logs");
    let mut cfg = sandbox_config("ctd", &logs);
    if !ctd.has_pod_network() {
        // A hostNetwork pod shares the node's UTS namespace: no hostname of its own (as the
        // kubelet sends it; runc refuses to set one).
        cfg.hostname = String::new();
        cfg.linux = Some(cri::LinuxPodSandboxConfig {
            security_context: Some(cri::LinuxSandboxSecurityContext {
                namespace_options: Some(cri::NamespaceOption {
                    network: cri::NamespaceMode::Node as i32,
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        });
    }
    let run = cri::RunPodSandboxRequest {
        config: Some(cfg.clone()),
        runtime_handler: String::new(),
    };
    let sb_id = match rt.run_pod_sandbox(run).await {
        Ok(r) => r.pod_sandbox_id,
        Err(e) => panic!("RunPodSandbox: {e}\n{}", ctd.log()),
    };
    let images = rt.list_images(Default::default()).await.unwrap().images;
    assert!(
        images
            .iter()
            .any(|i| i.repo_tags.iter().any(|t| t == PAUSE)),
        "the sandbox image was pulled: {images:?}"
    );
    let sb = (sb_id.clone(), cfg);
    let exiter = create_and_start(&rt, &sb, "exiter", &["sh", "-c", "echo hi; exit 3"]).await;
    let s = wait_exited(&rt, &exiter).await;
    assert_eq!(s.exit_code, 3);
    assert_eq!(log_output(Path::new(&s.log_path)).0, "hi\n");
    let sleeper = create_and_start(&rt, &sb, "sleeper", &["sleep", "3600"]).await;
    let r = rt
        .exec_sync(cri::ExecSyncRequest {
            container_id: sleeper.clone(),
            cmd: vec!["sh".into(), "-c".into(), "echo hello; exit 4".into()],
            timeout: 10,
        })
        .await
        .expect("ExecSync");
    assert_eq!((r.stdout.as_slice(), r.exit_code), (&b"hello\n"[..], 4));
    let unknown = cri::ContainerStatusRequest {
        container_id: "does-not-exist".into(),
        verbose: false,
    };
    let err = rt.container_status(unknown).await.unwrap_err();
    assert_eq!(err.code(), runtime::Code::NotFound, "{err}");

    remove_all(&rt, ctd, &[&sb_id]).await;
    eprintln!("containerd test took {:?}", began.elapsed());
}

/// The pod network containerd sets up through CNI (bridge + host-local + portmap): each pod's
/// IP in PodSandboxStatus is in the instance's private /24 and is the address of the pod's
/// eth0; a server in a pod answers the host at podIP:8080 and at 127.0.0.1:hostPort through
/// its port mapping; two pods reach each other by IP. Removing the pods releases their IPs and
/// their hostPort rules.
#[tokio::test(flavor = "multi_thread")]
async fn containerd_pod_network() {
    let test = "containerd_pod_network";
    let Some((ctd, rt)) = start(test).await else {
        return;
    };
    let Some(net) = ctd.pod_network().cloned() else {
        skip(
            &format!(
                "needs the CNI plugins bridge, host-local, portmap and loopback in {}: \
                 Debian's containernetworking-plugins, scripts/setup.sh",
                containerd::CNI_BIN_DIR
            ),
            test,
        );
        return;
    };
    ctd.pull_all(&rt).await;
    let work = tempfile::tempdir().unwrap();
    let logs = work.path().join("logs");
    let host_port = i32::from(free_port());

    // Two pods, each serving its own name over HTTP on 8080; `a` maps a hostPort to it.
    let mut pods = Vec::new();
    for name in ["a", "b"] {
        let mut cfg = sandbox_config(&format!("net-{name}"), &logs);
        if name == "a" {
            cfg.port_mappings = vec![cri::PortMapping {
                protocol: cri::Protocol::Tcp as i32,
                container_port: 8080,
                host_port,
                host_ip: String::new(),
            }];
        }
        let run = cri::RunPodSandboxRequest {
            config: Some(cfg.clone()),
            runtime_handler: String::new(),
        };
        let id = match rt.run_pod_sandbox(run).await {
            Ok(r) => r.pod_sandbox_id,
            Err(e) => panic!("RunPodSandbox {name}: {e}\n{}", ctd.log()),
        };
        let status = rt
            .pod_sandbox_status(cri::PodSandboxStatusRequest {
                pod_sandbox_id: id.clone(),
                verbose: false,
            })
            .await
            .expect("PodSandboxStatus")
            .status
            .expect("status");
        let network = status.network.expect("status.network");
        let ip: Ipv4Addr = network
            .ip
            .parse()
            .unwrap_or_else(|e| panic!("pod {name} IP {:?}: {e}", network.ip));
        assert!(
            net.contains(ip) && ip != net.gateway,
            "pod {name}: {ip} not a pod address in {}/24",
            net.subnet
        );
        let sb = (id, cfg);
        let script = format!(
            "mkdir -p /www && echo hello-from-{name} > /www/index.html && \
             exec httpd -f -p 8080 -h /www"
        );
        let server = create_and_start(&rt, &sb, "server", &["sh", "-c", &script]).await;
        pods.push((name, sb, ip, server));
    }
    let (a_ip, b_ip) = (pods[0].2, pods[1].2);
    assert_ne!(a_ip, b_ip);

    // The IP containerd reports is the pod's eth0 address.
    for (name, _, ip, server) in &pods {
        let r = exec(&rt, server, "ip -4 -o addr show eth0").await;
        assert!(
            r.contains(&format!(" {ip}/24 ")),
            "pod {name}'s eth0 has {ip}: {r}"
        );
    }

    // The host reaches each pod by its IP, and `a` through its hostPort on loopback.
    for (name, _, ip, _) in &pods {
        let body = http_get(SocketAddr::from((*ip, 8080))).await;
        assert_eq!(body, format!("hello-from-{name}\n"), "{name} at {ip}:8080");
    }
    let loopback = SocketAddr::from((Ipv4Addr::LOCALHOST, host_port as u16));
    assert_eq!(
        http_get(loopback).await,
        "hello-from-a\n",
        "hostPort {loopback}"
    );

    // The pods reach each other by IP. (No `wget -T`: Debian's busybox 1.35 wget segfaults
    // with it; ExecSync's timeout bounds the call.)
    let r = exec(
        &rt,
        &pods[1].3,
        &format!("wget -q -O - http://{a_ip}:8080/"),
    )
    .await;
    assert_eq!(r, "hello-from-a\n", "b -> a");
    let r = exec(
        &rt,
        &pods[0].3,
        &format!("wget -q -O - http://{b_ip}:8080/"),
    )
    .await;
    assert_eq!(r, "hello-from-b\n", "a -> b");

    // Removing the pods releases their addresses (host-local's files) and the hostPort.
    let ids: Vec<String> = pods.iter().map(|p| p.1.0.clone()).collect();
    let ipam = ctd.dir().join("cni/ipam").join(&net.name);
    for ip in [a_ip, b_ip] {
        assert!(ipam.join(ip.to_string()).exists(), "{ip} held in {ipam:?}");
    }
    let dir = ctd.dir().to_path_buf();
    for id in &ids {
        let stop = cri::StopPodSandboxRequest {
            pod_sandbox_id: id.clone(),
        };
        rt.stop_pod_sandbox(stop).await.expect("StopPodSandbox");
    }
    for ip in [a_ip, b_ip] {
        assert!(!ipam.join(ip.to_string()).exists(), "{ip} released");
    }
    let nat = std::process::Command::new("iptables-save")
        .args(["-t", "nat"])
        .output()
        .expect("iptables-save");
    let nat = String::from_utf8_lossy(&nat.stdout);
    assert!(
        !nat.contains(&format!("\\\"{}\\\"", net.name)),
        "portmap rules of {} left: {nat}",
        net.name
    );
    assert!(
        TcpStream::connect_timeout(&loopback, Duration::from_secs(2)).is_err(),
        "nothing answers {loopback} any more"
    );
    let ids: Vec<&str> = ids.iter().map(String::as_str).collect();
    remove_all(&rt, ctd, &ids).await;
    assert!(!dir.exists(), "{dir:?} removed");
}

/// `sh -c script` in a container through ExecSync; its stdout (asserting exit code 0).
async fn exec(rt: &RemoteRuntime, id: &str, script: &str) -> String {
    let r = rt
        .exec_sync(cri::ExecSyncRequest {
            container_id: id.into(),
            cmd: vec!["sh".into(), "-c".into(), script.into()],
            timeout: 20,
        })
        .await
        .expect("ExecSync");
    let err = String::from_utf8_lossy(&r.stderr);
    assert_eq!(r.exit_code, 0, "{script}: {err}");
    String::from_utf8_lossy(&r.stdout).into_owned()
}

/// `ctr` (Debian's containerd package) against the test's containerd, in the CRI namespace.
fn ctr(ctd: &Containerd, args: &[&str]) -> String {
    let out =
        std::process::Command::new(containerd::find("ctr").expect("ctr (containerd package)"))
            .arg("--address")
            .arg(ctd.socket())
            .args(["--namespace", runtime::remote::containerd::NAMESPACE])
            .args(args)
            .output()
            .unwrap();
    assert!(
        out.status.success(),
        "ctr {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Runs containerd's garbage collector now: deleting a lease with `--sync` collects every
/// unreferenced blob and snapshot before it returns.
fn collect_garbage(ctd: &Containerd) {
    let id = format!("nodelet-test-gc-{}", std::process::id());
    ctr(ctd, &["leases", "create", "--id", &id]);
    ctr(ctd, &["leases", "delete", "--sync", &id]);
}

async fn status_of(images: &dyn ImageService, reference: &str) -> Option<cri::Image> {
    images
        .image_status(cri::ImageStatusRequest {
            image: Some(cri::ImageSpec {
                image: reference.into(),
                ..Default::default()
            }),
            verbose: false,
        })
        .await
        .unwrap()
        .image
}

/// The preload dir on a node whose runtime is containerd: an archive (zstd, an image no
/// registry has) imported through containerd's own API into the CRI namespace, pinned there
/// (the label, and `pinned` as the kubelet sees it even on a containerd before 1.7), kept by
/// containerd's garbage collector, and run as a container; a `*.txt` list pulled through CRI
/// and pinned; a broken file refused by name
/// while the other is imported; nothing imported again once unchanged, also after a
/// restart; the image unpinned once its file is gone.
#[tokio::test(flavor = "multi_thread")]
async fn the_preload_dir_imports_into_containerd() {
    use runtime::preload::{PinnedImages, Preload};
    use runtime::remote::containerd::Containerd as Api;
    let test = "the_preload_dir_imports_into_containerd";
    let Some((ctd, rt)) = start(test).await else {
        return;
    };
    const APP: &str = "preload.local/site/app:v1";
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("images-preload");
    std::fs::create_dir_all(&dir).unwrap();
    let tar = root.path().join("app.tar");
    containerd::retagged_archive(
        &busybox_archive(),
        &tar,
        APP,
        &["sh", "-c", "echo preloaded; exit 7"],
    );
    let zst = zstd::stream::encode_all(&std::fs::read(&tar).unwrap()[..], 3).unwrap();
    let settled = |name: &str, data: &[u8]| {
        let path = dir.join(name);
        std::fs::write(&path, data).unwrap();
        let f = std::fs::File::options().write(true).open(&path).unwrap();
        f.set_modified(std::time::SystemTime::now() - Duration::from_secs(10))
            .unwrap();
    };
    settled("app.tar.zst", &zst);
    settled("broken.tar", b"not an image archive");
    settled(
        "images.txt",
        format!("# from the registry\n{}\n", containerd::BUSYBOX).as_bytes(),
    );

    let api = Api::connect(&ctd.endpoint(), Duration::from_secs(20))
        .await
        .unwrap_or_else(|e| panic!("containerd's API: {e}\n{}", ctd.log()));
    eprintln!("containerd {}", api.version());
    let mut preload = Preload::containerd(api.clone(), rt.clone(), root.path(), &dir);
    let scan = preload.scan_files().await;
    assert_eq!(
        scan.imported,
        [("app.tar.zst".to_string(), vec![APP.to_string()])],
        "{scan:?}\n{}",
        ctd.log()
    );
    let [(file, why)] = &scan.failed[..] else {
        panic!("one failure expected: {scan:?}");
    };
    assert_eq!(file, "broken.tar");
    assert!(why.contains("broken.tar"), "{why}");

    // In the CRI namespace with the pinned label; the kubelet sees it pinned.
    assert_eq!(api.is_pinned(APP).await.unwrap(), Some(true));
    let pinned = PinnedImages::new(std::sync::Arc::new(rt.clone()), preload.pins());
    let img = status_of(&pinned, APP).await.expect("listed by CRI");
    assert!(img.pinned, "{img:?}");
    assert_eq!(img.repo_tags, [APP]);
    let listed = pinned.list_images(Default::default()).await.unwrap().images;
    assert!(
        listed.iter().any(|i| i.id == img.id && i.pinned),
        "{listed:?}"
    );

    // containerd's collector keeps every blob (the labels link them), so the image still
    // unpacks and runs after it.
    collect_garbage(&ctd);
    let content = ctr(&ctd, &["content", "ls", "-q"]);
    assert!(content.lines().count() >= 3, "{content}");
    let work = tempfile::tempdir().unwrap();
    let mut cfg = sandbox_config("preloaded", &work.path().join("logs"));
    cfg.hostname = String::new();
    cfg.linux = Some(cri::LinuxPodSandboxConfig {
        security_context: Some(cri::LinuxSandboxSecurityContext {
            namespace_options: Some(cri::NamespaceOption {
                network: cri::NamespaceMode::Node as i32,
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    });
    let run = cri::RunPodSandboxRequest {
        config: Some(cfg.clone()),
        runtime_handler: String::new(),
    };
    let sb_id = match rt.run_pod_sandbox(run).await {
        Ok(r) => r.pod_sandbox_id,
        Err(e) => panic!("RunPodSandbox: {e}\n{}", ctd.log()),
    };
    let mut app = container_config("app", &[]);
    app.image = Some(cri::ImageSpec {
        image: APP.into(),
        ..Default::default()
    });
    let id = start_container_on(&rt, &(sb_id.clone(), cfg), app).await;
    let s = wait_exited(&rt, &id).await;
    assert_eq!(s.exit_code, 7, "{s:?}");
    assert_eq!(log_output(Path::new(&s.log_path)).0, "preloaded\n");

    // The list, left for the scans after start: pulled through CRI, pinned.
    let listed = preload.scan().await;
    assert_eq!(
        listed.imported,
        [(
            "images.txt".to_string(),
            vec![containerd::BUSYBOX.to_string()]
        )],
        "{listed:?}"
    );
    assert_eq!(
        api.is_pinned(containerd::BUSYBOX).await.unwrap(),
        Some(true)
    );

    // Unchanged: nothing imported again, now or after a restart.
    let again = preload.scan().await;
    assert!(again.imported.is_empty(), "{again:?}");
    assert_eq!(again.unchanged, ["app.tar.zst", "images.txt"], "{again:?}");
    drop(preload);
    let mut preload = Preload::containerd(api.clone(), rt.clone(), root.path(), &dir);
    let restarted = preload.scan().await;
    assert!(restarted.imported.is_empty(), "{restarted:?}");
    assert_eq!(
        restarted.unchanged,
        ["app.tar.zst", "images.txt"],
        "{restarted:?}"
    );
    let pinned = PinnedImages::new(std::sync::Arc::new(rt.clone()), preload.pins());
    assert!(status_of(&pinned, APP).await.unwrap().pinned);

    // The file goes: the image stays but is no longer pinned.
    std::fs::remove_file(dir.join("app.tar.zst")).unwrap();
    let gone = preload.scan().await;
    assert_eq!(gone.removed, ["app.tar.zst"], "{gone:?}");
    assert_eq!(api.is_pinned(APP).await.unwrap(), Some(false));
    assert!(!status_of(&pinned, APP).await.unwrap().pinned);

    remove_all(&rt, ctd, &[&sb_id]).await;
}
