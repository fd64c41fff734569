//! nodelet as the kubelet: the binary run through a link named `kubelet`, with upstream's
//! command line. `--version` prints the Kubernetes version (kubeadm's preflight parses it),
//! `--help` the flags, a flag upstream removed or nodelet does not know is refused naming it;
//! and a node started by `deploy/systemd/10-kubeadm.conf`'s line, with the flags a
//! `kubeadm-flags.env` and `/etc/default/kubelet` give and a `--config-dir` drop-in, joins the
//! test API server (HTTPS) from kubeadm's bootstrap kubeconfig alone, through TLS bootstrap,
//! with the labels, taints and provider ID it was given and runs a pod.

mod apiserver;
mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use apiserver::{ApiServer, CsrPolicy};
use common::api_node::{ApiNode, Backend, NS, Setup, busybox, wait_for};
use common::{KillOnDrop, nodelet_bin};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::Api;
use kube::api::PostParams;

/// A link named `kubelet` to the nodelet binary, in `dir`.
fn kubelet_link(dir: &Path) -> PathBuf {
    let link = dir.join("kubelet");
    std::os::unix::fs::symlink(nodelet_bin(), &link).expect("link kubelet -> nodelet");
    link
}

fn run(bin: &Path, args: &[&str]) -> (i32, String, String) {
    let out = Command::new(bin)
        .args(args)
        .output()
        .expect("run the binary");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn version_help_and_refused_flags() {
    let dir = tempfile::tempdir().unwrap();
    let kubelet = kubelet_link(dir.path());
    let (code, out, _) = run(&kubelet, &["--version"]);
    assert_eq!(code, 0);
    assert_eq!(out, "Kubernetes v1.37.0\n", "exactly what kubeadm parses");
    // nodelet's own version stays nodelet's.
    let (code, out, _) = run(&nodelet_bin(), &["--version"]);
    assert_eq!(code, 0);
    assert!(out.starts_with("nodelet "), "{out}");

    let (code, out, _) = run(&kubelet, &["--help"]);
    assert_eq!(code, 0);
    assert!(out.contains("--bootstrap-kubeconfig string"), "{out}");
    assert!(out.contains("--register-with-taints strings"), "{out}");

    for (args, want) in [
        (
            &["--no-such-flag=1"][..],
            "kubelet: unknown flag: --no-such-flag\n",
        ),
        (
            &["--config=/x", "--network-plugin", "cni"][..],
            "kubelet: flag --network-plugin was removed from the kubelet",
        ),
        (
            &["--feature-gates=KubeletTracing=true"][..],
            "kubelet: flag --feature-gates is not supported by nodelet",
        ),
        (
            &["--max-pods=lots"][..],
            "invalid argument \"lots\" for --max-pods",
        ),
    ] {
        let (code, out, err) = run(&kubelet, args);
        assert_eq!(code, 1, "{args:?}: {err}");
        assert!(out.is_empty(), "{args:?}: {out}");
        assert!(
            err.starts_with(want) || err.contains(want),
            "{args:?}: {err}"
        );
    }
    // Flags without a subcommand make nodelet the kubelet too.
    let (code, _, err) = run(&nodelet_bin(), &["--no-such-flag"]);
    assert_eq!(code, 1);
    assert!(err.contains("unknown flag: --no-such-flag"), "{err}");
    // A missing kubeconfig with a bootstrap kubeconfig that is not there either.
    let (code, _, err) = run(
        &kubelet,
        &[
            "--kubeconfig=/nonexistent/kubelet.conf",
            "--bootstrap-kubeconfig=/nonexistent/bootstrap.conf",
            "--root-dir",
            dir.path().to_str().unwrap(),
        ],
    );
    assert_eq!(code, 1);
    assert!(
        err.contains("bootstrap kubeconfig /nonexistent/bootstrap.conf"),
        "{err}"
    );
}

const NODE: &str = "kubeadm-node";

/// The tests' usual node configuration; the drop-in below adds to it.
/// kubeadm's KubeletConfiguration rotates the client certificate.
const SETUP: Setup = Setup {
    name: NODE,
    config: "rotateCertificates: true\n",
    cri_listen: false,
};

/// `deploy/systemd/10-kubeadm.conf` run as systemd would run it (its `Environment=` lines and
/// `EnvironmentFile=`s, then `ExecStart` with the variables split into words), its paths
/// under `base` instead of `/`.
fn kubeadm_command(base: &Path) -> Command {
    let unit = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/deploy/systemd/10-kubeadm.conf"
    ))
    .expect("the kubeadm drop-in");
    let at = |text: &str| {
        text.replace("/etc/", &format!("{}/etc/", base.display()))
            .replace("/var/lib/", &format!("{}/var/lib/", base.display()))
            .replace("/usr/bin/", &format!("{}/usr/bin/", base.display()))
    };
    let mut script = String::from("set -e\n");
    for line in unit.lines().map(at) {
        if let Some(env) = line.strip_prefix("Environment=") {
            script.push_str(&format!("export {env}\n"));
        } else if let Some(file) = line.strip_prefix("EnvironmentFile=-") {
            script.push_str(&format!(
                "if [ -f {file} ]; then set -a; . {file}; set +a; fi\n"
            ));
        } else if let Some(exec) = line.strip_prefix("ExecStart=").filter(|e| !e.is_empty()) {
            script.push_str(&format!("exec {exec}\n"));
        }
    }
    let mut cmd = Command::new("sh");
    cmd.arg("-c").arg(script);
    cmd
}

#[tokio::test(flavor = "multi_thread")]
async fn a_kubeadm_style_node_joins_and_runs_a_pod() {
    let test = "a_kubeadm_style_node_joins_and_runs_a_pod";
    // As `kubeadm join` leaves a node: a bootstrap kubeconfig with a bootstrap token, no
    // kubelet.conf; the cluster approves the node's CSR (as kubeadm's RBAC for auto-approval).
    let api = ApiServer::start_tls().await;
    api.add_bootstrap_token("abcdef", "0123456789abcdef");
    api.set_csr_policy(CsrPolicy::Approve);
    let Some(node) = ApiNode::prepare(&SETUP, Backend::Builtin, test, |dir| {
        api.write_bootstrap_kubeconfig(dir, "abcdef.0123456789abcdef")
    })
    .await
    else {
        return;
    };
    // kubeadm's files, where the drop-in expects them (under a base dir).
    let base = node.root.with_extension("base");
    for d in [
        "etc/kubernetes",
        "etc/default",
        "var/lib/kubelet",
        "usr/bin",
        "conf.d",
    ] {
        std::fs::create_dir_all(base.join(d)).unwrap();
    }
    kubelet_link(&base.join("usr/bin"));
    std::fs::copy(
        &node.kubeconfig,
        base.join("etc/kubernetes/bootstrap-kubelet.conf"),
    )
    .unwrap();
    std::fs::copy(&node.config, base.join("var/lib/kubelet/config.yaml")).unwrap();
    std::fs::write(
        base.join("var/lib/kubelet/kubeadm-flags.env"),
        format!(
            "KUBELET_KUBEADM_ARGS=\"--container-runtime-endpoint=nodelet \
             --pod-infra-container-image=registry.k8s.io/pause:3.10 --node-ip=127.0.0.1 \
             --hostname-override={NODE}\"\n"
        ),
    )
    .unwrap();
    std::fs::write(
        base.join("etc/default/kubelet"),
        format!(
            "KUBELET_EXTRA_ARGS=\"--root-dir={} --config-dir={} --node-labels=pool=edge \
             --register-with-taints=dedicated=edge:NoSchedule --provider-id=edge://site-7/{NODE} \
             --v=2\"\n",
            node.root.display(),
            base.join("conf.d").display()
        ),
    )
    .unwrap();
    // A drop-in over config.yaml: 42 pods at most instead of the default 110.
    std::fs::write(
        base.join("conf.d/50-pods.conf"),
        "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\nmaxPods: 42\n",
    )
    .unwrap();
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(node.root.with_extension("log"))
        .unwrap();
    // As under kubelet.service with Type=notify: READY=1 once the Node is registered.
    let notify = std::os::unix::net::UnixDatagram::bind(base.join("notify.sock")).unwrap();
    notify
        .set_read_timeout(Some(std::time::Duration::from_secs(60)))
        .unwrap();
    let _agent = KillOnDrop(
        kubeadm_command(&base)
            .env("NOTIFY_SOCKET", base.join("notify.sock"))
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start the kubelet"),
    );

    let nodes: Api<Node> = Api::all(api.client());
    let registered = wait_for("the Node registered", 60, async || {
        nodes.get_opt(NODE).await.ok().flatten()
    })
    .await;
    let ready = tokio::task::spawn_blocking(move || {
        let mut buf = [0u8; 1024];
        loop {
            let n = notify.recv(&mut buf).expect("READY=1 within 60 s");
            let msg = String::from_utf8_lossy(&buf[..n]).into_owned();
            if msg.contains("READY=1") {
                return msg;
            }
        }
    })
    .await
    .unwrap();
    assert!(ready.contains(&format!("node {NODE} ready")), "{ready}");
    assert!(
        nodes.get_opt(NODE).await.unwrap().is_some(),
        "READY=1 after the Node was registered"
    );
    // TLS bootstrap wrote kubelet.conf, naming the certificate a CSR got.
    let kubelet_conf = std::fs::read_to_string(base.join("etc/kubernetes/kubelet.conf"))
        .expect("kubelet.conf written by TLS bootstrap");
    assert!(
        kubelet_conf.contains("kubelet-client-current.pem"),
        "{kubelet_conf}"
    );
    assert_eq!(api.csrs().len(), 1);
    let labels = registered.metadata.labels.clone().unwrap_or_default();
    assert_eq!(labels.get("pool").map(String::as_str), Some("edge"));
    let spec = registered.spec.clone().unwrap_or_default();
    assert_eq!(
        spec.provider_id.as_deref(),
        Some("edge://site-7/kubeadm-node")
    );
    let taints = spec.taints.unwrap_or_default();
    assert!(
        taints.iter().any(|t| t.key == "dedicated"
            && t.value.as_deref() == Some("edge")
            && t.effect == "NoSchedule"),
        "{taints:?}"
    );
    let capacity = registered
        .status
        .as_ref()
        .and_then(|s| s.capacity.clone())
        .unwrap_or_default();
    assert_eq!(capacity.get("pods").map(|q| q.0.as_str()), Some("42"));
    let addresses = registered
        .status
        .and_then(|s| s.addresses)
        .unwrap_or_default();
    assert!(
        addresses
            .iter()
            .any(|a| a.type_ == "InternalIP" && a.address == "127.0.0.1"),
        "{addresses:?}"
    );

    let pods: Api<Pod> = Api::namespaced(api.client(), NS);
    let spec = format!(
        "  terminationGracePeriodSeconds: 1\n  containers:\n{}",
        busybox("app", "exec sleep 3600")
    );
    pods.create(&PostParams::default(), &node.pod("joined", &spec))
        .await
        .expect("create the pod");
    wait_for("the pod Running", 60, async || {
        let p = pods.get("joined").await.ok()?;
        (p.status?.phase.as_deref() == Some("Running")).then_some(())
    })
    .await;
}
