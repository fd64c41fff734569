//! Network namespaces: the node's for hostNetwork pods, one of its own for each other pod, and
//! the pod network between pods, the node and hostPorts.

use std::net::{Ipv4Addr, SocketAddr};
use std::time::Duration;

use runtime::cri;

use crate::ctx::{Ctx, free_port};
use crate::outcome::{OrFail, Step, Stop, ensure, ensure_eq};

/// This process's network namespace, e.g. `net:[4026531840]`.
fn own_net_ns() -> Step<String> {
    std::fs::read_link("/proc/self/ns/net")
        .map(|p| p.to_string_lossy().into_owned())
        .map_err(|e| Stop::Skip(format!("cannot read this process's network namespace: {e}")))
}

pub async fn host_network_namespace(c: &Ctx<'_>) -> Step {
    let host = own_net_ns()?;
    let pod = c.run_pod(c.host_network_pod("hostnet")).await?;
    let a = c.run(&pod, "a", &["sleep", "600"]).await?;
    let r = c.exec(&a, &["readlink", "/proc/self/ns/net"]).await?;
    ensure_eq!(
        r.out.trim(),
        host,
        "a hostNetwork container's network namespace"
    );
    let r = c.exec(&a, &["hostname"]).await?;
    let node = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
    ensure_eq!(
        r.out.trim(),
        node.trim(),
        "a hostNetwork container's hostname"
    );
    Ok(())
}

pub async fn private_pod_network_namespace(c: &Ctx<'_>) -> Step {
    c.needs_pod_network()?;
    let host = own_net_ns()?;
    let pod = c.run_pod(c.own_network_pod("ownnet")).await?;
    let a = c.run(&pod, "a", &["sleep", "600"]).await?;
    let b = c.run(&pod, "b", &["sleep", "600"]).await?;
    let probe = "readlink /proc/self/ns/net; hostname";
    let ra = c.exec(&a, &["sh", "-c", probe]).await?;
    let rb = c.exec(&b, &["sh", "-c", probe]).await?;
    ensure_eq!(
        ra.out,
        rb.out,
        "one pod's two containers' network namespace and hostname"
    );
    let lines: Vec<&str> = ra.out.lines().collect();
    let ns = lines.first().copied().unwrap_or("");
    ensure!(ns.starts_with("net:["), "not a network namespace: {ra:?}");
    ensure!(
        ns != host,
        "the pod is in the node's network namespace {host}"
    );
    ensure_eq!(lines.get(1).copied(), Some("ownnet"), "the pod's hostname");
    Ok(())
}

/// The body of `GET /` (HTTP/1.0) from `addr`, retried for up to 20 s while the server
/// starts; the answer must be 200.
async fn http_get(addr: SocketAddr) -> Step<String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let attempt = async {
            let mut conn = tokio::net::TcpStream::connect(addr).await?;
            conn.write_all(b"GET / HTTP/1.0\r\n\r\n").await?;
            let mut reply = Vec::new();
            conn.read_to_end(&mut reply).await?;
            Ok::<_, std::io::Error>(String::from_utf8_lossy(&reply).into_owned())
        };
        let r = tokio::time::timeout(Duration::from_secs(5), attempt).await;
        match r {
            Ok(Ok(reply)) if reply.starts_with("HTTP/1.") => {
                ensure!(reply.contains(" 200 "), "GET http://{addr}/: {reply}");
                let body = reply.split_once("\r\n\r\n").map(|(_, b)| b.to_string());
                return Ok(body.unwrap_or_default());
            }
            other if tokio::time::Instant::now() >= deadline => {
                return Err(Stop::Fail(format!("GET http://{addr}/: {other:?}")));
            }
            _ => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
}

pub async fn pod_network(c: &Ctx<'_>) -> Step {
    c.needs_pod_network()?;
    let host_port = free_port()?;
    let mut pods = Vec::new();
    for name in ["web-a", "web-b"] {
        let mut cfg = c.own_network_pod(name);
        if name == "web-a" {
            cfg.port_mappings = vec![cri::PortMapping {
                protocol: cri::Protocol::Tcp as i32,
                container_port: 8080,
                host_port: i32::from(host_port),
                host_ip: String::new(),
            }];
        }
        let pod = c.run_pod(cfg).await?;
        let status = c.pod_status(&pod.0).await?;
        let ip = status.network.as_ref().map(|n| n.ip.as_str()).unwrap_or("");
        let ip: Ipv4Addr = ip.parse().ok().or_fail(format_args!(
            "{name}'s IPv4 address in PodSandboxStatus ({status:?})"
        ))?;
        let script = format!(
            "mkdir -p /www && echo hello-from-{name} > /www/index.html && \
             exec httpd -f -p 8080 -h /www"
        );
        let web = c.run(&pod, "web", &["sh", "-c", &script]).await?;
        pods.push((name, pod, ip, web));
    }
    ensure!(
        pods[0].2 != pods[1].2,
        "two pods, one address: {}",
        pods[0].2
    );
    for (name, _, ip, web) in &pods {
        let r = c
            .exec(web, &["ip", "-4", "-o", "addr", "show", "eth0"])
            .await?;
        ensure!(
            r.out.contains(&format!(" {ip}/")),
            "{name}'s eth0 does not have its address {ip}: {r:?}"
        );
        let body = http_get(SocketAddr::from((*ip, 8080))).await?;
        ensure_eq!(
            body,
            format!("hello-from-{name}\n"),
            "{name} at {ip}:8080 from the node"
        );
    }
    let node_port = SocketAddr::from(([127, 0, 0, 1], host_port));
    ensure_eq!(
        http_get(node_port).await?,
        "hello-from-web-a\n",
        "the hostPort {node_port}"
    );
    let (a, b) = (&pods[0], &pods[1]);
    for (from, to) in [(b, a), (a, b)] {
        let url = format!("http://{}:8080/", to.2);
        let r = c.exec(&from.3, &["wget", "-q", "-O", "-", &url]).await?;
        ensure_eq!(
            r.out,
            format!("hello-from-{}\n", to.0),
            "{} -> {} (stderr {:?})",
            from.0,
            to.0,
            r.err
        );
    }
    c.stop_pod(&a.1.0).await?.or_fail("StopPodSandbox")?;
    let closed = tokio::time::timeout(
        Duration::from_secs(2),
        tokio::net::TcpStream::connect(node_port),
    )
    .await;
    ensure!(
        !matches!(closed, Ok(Ok(_))),
        "the hostPort {node_port} still answers after StopPodSandbox"
    );
    Ok(())
}
