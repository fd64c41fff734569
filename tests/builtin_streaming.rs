//! The CRI streaming server of the built-in runtime end to end: Exec and PortForward return a
//! URL, and a WebSocket client (tokio-tungstenite) speaks the Kubernetes streaming protocols
//! there against real containers: v4 and v5 remotecommand (separate stdout and stderr, stdin,
//! exit codes in the error channel, a terminal with resize), single-use tokens, and
//! port-forward into a pod's own network namespace and into a hostNetwork pod. Needs root.

mod common;

use std::time::Duration;

use common::cri_serve::CriNode;
use common::*;
use futures::{SinkExt, StreamExt};
use runtime::{Code, RuntimeService, cri};
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::{self, Message};

type Ws =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

const V4: &str = "v4.channel.k8s.io";
const V5: &str = "v5.channel.k8s.io";

/// Opens a WebSocket on a streaming URL with `protocol`, or returns the HTTP refusal.
async fn open(url: &str, protocol: &str) -> Result<Ws, tungstenite::Error> {
    let mut req = url
        .replacen("http://", "ws://", 1)
        .into_client_request()
        .unwrap();
    req.headers_mut()
        .insert("Sec-WebSocket-Protocol", protocol.parse().unwrap());
    let (ws, resp) = tokio_tungstenite::connect_async(req).await?;
    assert_eq!(
        resp.headers()
            .get("sec-websocket-protocol")
            .map(|v| v.to_str().unwrap()),
        Some(protocol),
        "the server picked the offered subprotocol"
    );
    Ok(ws)
}

fn frame(channel: u8, data: &[u8]) -> Message {
    let mut v = vec![channel];
    v.extend_from_slice(data);
    Message::Binary(v.into())
}

/// What a remotecommand session wrote, by channel, until the server closed it.
#[derive(Debug, Default)]
struct Output {
    first_channel: Option<u8>,
    stdout: Vec<u8>,
    stderr: Vec<u8>,
    status: Option<serde_json::Value>,
}

impl Output {
    fn stdout(&self) -> String {
        String::from_utf8_lossy(&self.stdout).into_owned()
    }
    fn stderr(&self) -> String {
        String::from_utf8_lossy(&self.stderr).into_owned()
    }
    fn status(&self) -> &serde_json::Value {
        self.status.as_ref().expect("a status on the error channel")
    }
}

/// Reads messages until the server closes the socket (or 60 s pass).
async fn read_all(ws: &mut Ws, out: &mut Output) {
    let work = async {
        while let Some(msg) = ws.next().await {
            let data = match msg {
                Ok(Message::Binary(d)) => d,
                Ok(Message::Close(_)) | Err(_) => break,
                Ok(_) => continue,
            };
            let (ch, payload) = data.split_first().expect("a channel byte");
            out.first_channel.get_or_insert(*ch);
            match ch {
                1 => out.stdout.extend_from_slice(payload),
                2 => out.stderr.extend_from_slice(payload),
                3 if !payload.is_empty() => {
                    out.status = Some(serde_json::from_slice(payload).expect("status JSON"))
                }
                _ => {}
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(60), work)
        .await
        .expect("the session ended within a minute");
}

/// Reads until stdout contains `needle` (keeping stderr too).
async fn read_until(ws: &mut Ws, out: &mut Output, needle: &str) {
    let work = async {
        while !out.stdout().contains(needle) {
            match ws.next().await {
                Some(Ok(Message::Binary(d))) => match d.split_first() {
                    Some((1, payload)) => out.stdout.extend_from_slice(payload),
                    Some((2, payload)) => out.stderr.extend_from_slice(payload),
                    _ => {}
                },
                Some(Ok(_)) => {}
                other => panic!(
                    "socket ended before {needle:?}: {other:?}; got {}",
                    out.stdout()
                ),
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(30), work)
        .await
        .unwrap_or_else(|_| panic!("no {needle:?} in {:?}", out.stdout()));
}

fn exec_req(
    id: &str,
    cmd: &[&str],
    stdin: bool,
    stdout: bool,
    stderr: bool,
    tty: bool,
) -> cri::ExecRequest {
    cri::ExecRequest {
        container_id: id.into(),
        cmd: cmd.iter().map(|s| s.to_string()).collect(),
        tty,
        stdin,
        stdout,
        stderr,
    }
}

async fn exec_url(node: &Node, req: cri::ExecRequest) -> String {
    let url = node.rt.exec(req).await.expect("Exec").url;
    assert!(url.starts_with("http://127.0.0.1:"), "{url}");
    assert!(url.contains("/exec/"), "{url}");
    url
}

fn exit_code_of(status: &serde_json::Value) -> Option<String> {
    status["details"]["causes"][0]["message"]
        .as_str()
        .map(str::to_string)
}

#[tokio::test(flavor = "multi_thread")]
async fn exec_over_websocket() {
    if !root_or_skip("exec_over_websocket") {
        return;
    }
    let node = Node::new("wsexec").await;
    let sb = node.sandbox("wsexec").await;
    let id = node.container(&sb, "c", &["sleep", "600"]).await;

    // v4: stdout and stderr apart, a non-zero exit code in the error channel.
    let url = exec_url(
        &node,
        exec_req(
            &id,
            &["sh", "-c", "echo out; echo err >&2; exit 3"],
            false,
            true,
            true,
            false,
        ),
    )
    .await;
    let mut ws = open(&url, V4).await.expect("open v4");
    let mut out = Output::default();
    read_all(&mut ws, &mut out).await;
    assert_eq!(out.first_channel, Some(1), "ready message on stdout first");
    assert_eq!(
        (out.stdout().as_str(), out.stderr().as_str()),
        ("out\n", "err\n")
    );
    assert_eq!(out.status()["status"], "Failure");
    assert_eq!(out.status()["reason"], "NonZeroExitCode");
    assert_eq!(out.status()["details"]["causes"][0]["reason"], "ExitCode");
    assert_eq!(exit_code_of(out.status()).as_deref(), Some("3"));

    // A token works once.
    let again = open(&url, V4).await.expect_err("a used token");
    match again {
        tungstenite::Error::Http(resp) => assert_eq!(resp.status(), 404),
        e => panic!("expected 404, got {e}"),
    }
    let bogus = url.rsplit_once('/').unwrap().0.to_string() + "/00000000";
    match open(&bogus, V4).await.expect_err("an unknown token") {
        tungstenite::Error::Http(resp) => assert_eq!(resp.status(), 404),
        e => panic!("expected 404, got {e}"),
    }

    // v5: stdin echoed back through cat; closing stdin (channel 255) ends it with success.
    let url = exec_url(&node, exec_req(&id, &["cat"], true, true, false, false)).await;
    let mut ws = open(&url, V5).await.expect("open v5");
    ws.send(frame(0, b"hello ")).await.unwrap();
    ws.send(frame(0, b"through cat\n")).await.unwrap();
    let mut out = Output::default();
    read_until(&mut ws, &mut out, "hello through cat\n").await;
    ws.send(frame(255, &[0])).await.unwrap();
    read_all(&mut ws, &mut out).await;
    assert_eq!(out.stdout(), "hello through cat\n");
    assert_eq!(out.status()["status"], "Success");

    // v4 stdin: the process reads one line and exits.
    let url = exec_url(
        &node,
        exec_req(
            &id,
            &["sh", "-c", "read l; echo got:$l; exit 0"],
            true,
            true,
            true,
            false,
        ),
    )
    .await;
    let mut ws = open(&url, V4).await.expect("open v4");
    ws.send(frame(0, b"a line\n")).await.unwrap();
    let mut out = Output::default();
    read_all(&mut ws, &mut out).await;
    assert_eq!(out.stdout(), "got:a line\n");
    assert_eq!(out.status()["status"], "Success");

    // Only stderr asked for: stdout is dropped, the ready message comes on stderr.
    let url = exec_url(
        &node,
        exec_req(
            &id,
            &["sh", "-c", "echo hidden; echo shown >&2"],
            false,
            false,
            true,
            false,
        ),
    )
    .await;
    let mut ws = open(&url, V5).await.unwrap();
    let mut out = Output::default();
    read_all(&mut ws, &mut out).await;
    assert_eq!(out.first_channel, Some(2));
    assert_eq!(
        (out.stdout().as_str(), out.stderr().as_str()),
        ("", "shown\n")
    );

    // A terminal: tty names a pts, a resize reaches it, stderr goes to the terminal too.
    let url = exec_url(&node, exec_req(&id, &["sh"], true, true, false, true)).await;
    let mut ws = open(&url, V5).await.expect("open tty");
    ws.send(frame(4, br#"{"Width":123,"Height":45}"#))
        .await
        .unwrap();
    let mut out = Output::default();
    ws.send(frame(0, b"tty; stty size; echo to-stderr >&2; exit 5\n"))
        .await
        .unwrap();
    read_all(&mut ws, &mut out).await;
    let text = out.stdout();
    assert!(text.contains("/dev/pts/"), "tty names a terminal: {text:?}");
    assert!(text.contains("45 123"), "stty sees the resize: {text:?}");
    assert!(
        text.contains("to-stderr"),
        "stderr is the terminal: {text:?}"
    );
    assert!(out.stderr.is_empty());
    assert_eq!(exit_code_of(out.status()).as_deref(), Some("5"));

    // ExecSync still works beside it.
    let r = node.exec(&id, &["sh", "-c", "echo sync; exit 4"]).await;
    assert_eq!((r.stdout.as_slice(), r.exit_code), (&b"sync\n"[..], 4));

    // Bad requests are refused by the RPC.
    let code = |r: runtime::Result<cri::ExecResponse>| r.map(|_| ()).unwrap_err().code();
    assert_eq!(
        code(
            node.rt
                .exec(exec_req("nope", &["true"], false, true, false, false))
                .await
        ),
        Code::NotFound
    );
    assert_eq!(
        code(
            node.rt
                .exec(exec_req(&id, &[], false, true, false, false))
                .await
        ),
        Code::InvalidArgument
    );
    assert_eq!(
        code(
            node.rt
                .exec(exec_req(&id, &["true"], false, false, false, false))
                .await
        ),
        Code::InvalidArgument
    );
    assert_eq!(
        code(
            node.rt
                .exec(exec_req(&id, &["true"], false, true, true, true))
                .await
        ),
        Code::InvalidArgument
    );
    // A command that cannot start ends with an internal error status, not a hang.
    let url = exec_url(
        &node,
        exec_req(&id, &["/no/such/binary"], false, true, true, false),
    )
    .await;
    let mut ws = open(&url, V4).await.unwrap();
    let mut out = Output::default();
    read_all(&mut ws, &mut out).await;
    assert_eq!(out.status()["status"], "Failure", "{:?}", out.status());
    node.teardown().await;
}

/// Forwards `port` of the pod over a WebSocket and sends an HTTP request through it; returns
/// the reply (data channel) and whatever came on the error channel.
async fn http_through_port_forward(node: &Node, sandbox_id: &str, port: u16) -> (String, String) {
    let url = node
        .rt
        .port_forward(cri::PortForwardRequest {
            pod_sandbox_id: sandbox_id.into(),
            port: vec![i32::from(port)],
        })
        .await
        .expect("PortForward")
        .url;
    assert!(url.contains("/portforward/"), "{url}");
    let mut ws = open(&format!("{url}?port={port}"), V4).await.expect("open");
    let mut first = Vec::new();
    for _ in 0..2 {
        match ws.next().await {
            Some(Ok(Message::Binary(d))) => first.push(d.to_vec()),
            other => panic!("expected the port announcements, got {other:?}"),
        }
    }
    let le = port.to_le_bytes();
    assert_eq!(first, vec![vec![0, le[0], le[1]], vec![1, le[0], le[1]]]);
    ws.send(frame(0, b"GET /index.html HTTP/1.0\r\n\r\n"))
        .await
        .unwrap();
    let (mut data, mut error) = (Vec::new(), Vec::new());
    let work = async {
        while let Some(Ok(msg)) = ws.next().await {
            if let Message::Binary(d) = msg {
                match d.split_first() {
                    Some((0, p)) => data.extend_from_slice(p),
                    Some((1, p)) => error.extend_from_slice(p),
                    _ => {}
                }
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(30), work)
        .await
        .expect("the forward ended");
    (
        String::from_utf8_lossy(&data).into_owned(),
        String::from_utf8_lossy(&error).into_owned(),
    )
}

/// A container serving `text` as /index.html on `port` with busybox httpd.
fn httpd(name: &str, port: u16, text: &str) -> cri::ContainerConfig {
    let script = format!(
        "mkdir -p /tmp/www && echo {text} > /tmp/www/index.html && exec httpd -f -p 127.0.0.1:{port} -h /tmp/www"
    );
    container_config(name, &["sh", "-c", &script])
}

async fn wait_serving(node: &Node, id: &str, port: u16) {
    for _ in 0..100 {
        let r = node
            .exec(
                id,
                &["sh", "-c", &format!("netstat -ltn | grep -q ':{port} '")],
            )
            .await;
        if r.exit_code == 0 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("httpd did not listen on {port}");
}

#[tokio::test(flavor = "multi_thread")]
async fn port_forward_over_websocket() {
    if !root_or_skip("port_forward_over_websocket") {
        return;
    }
    let node = Node::new("wspf").await;

    // A pod with its own network namespace: its loopback is not the host's.
    let port = 18000 + (std::process::id() % 1000) as u16;
    let sb = node.sandbox("pfpod").await;
    let id = node
        .container_with(&sb, httpd("web", port, "from-the-pod"))
        .await;
    wait_serving(&node, &id, port).await;
    assert!(
        std::net::TcpStream::connect(("127.0.0.1", port)).is_err(),
        "the pod's port is not on the host's loopback"
    );
    let (reply, error) = http_through_port_forward(&node, &sb.0, port).await;
    assert!(reply.starts_with("HTTP/1."), "{reply:?}");
    assert!(reply.contains("from-the-pod"), "{reply:?}");
    assert!(error.is_empty(), "{error:?}");

    // Nobody listens: the error channel says so.
    let (reply, error) = http_through_port_forward(&node, &sb.0, port + 1).await;
    assert!(reply.is_empty(), "{reply:?}");
    assert!(error.contains("error forwarding port"), "{error:?}");

    // A hostNetwork pod.
    let host_port = port + 2;
    let hsb = node
        .sandbox_with("pfhost", |cfg| {
            cfg.linux
                .get_or_insert_with(Default::default)
                .security_context
                .get_or_insert_with(Default::default)
                .namespace_options = Some(cri::NamespaceOption {
                network: cri::NamespaceMode::Node as i32,
                pid: cri::NamespaceMode::Container as i32,
                ipc: cri::NamespaceMode::Pod as i32,
                ..Default::default()
            });
        })
        .await;
    let hid = node
        .container_with(&hsb, httpd("hweb", host_port, "from-the-host-pod"))
        .await;
    wait_serving(&node, &hid, host_port).await;
    let (reply, _) = http_through_port_forward(&node, &hsb.0, host_port).await;
    assert!(reply.contains("from-the-host-pod"), "{reply:?}");

    // Unknown pod: NotFound from the RPC.
    let err = node
        .rt
        .port_forward(cri::PortForwardRequest {
            pod_sandbox_id: "nope".into(),
            port: vec![80],
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::NotFound);
    node.teardown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn exec_url_from_cri_serve_works() {
    if !root_or_skip("exec_url_from_cri_serve_works") {
        return;
    }
    let node = CriNode::new("crist");
    let server = node
        .serve("serve.log", &["--streaming-addr", "127.0.0.1:0"])
        .await;
    let rt = node.connect().await;
    let (sandbox_id, cfg) = run_sandbox_on(&rt, "crist", node.logs.path()).await;
    let id = rt
        .create_container(cri::CreateContainerRequest {
            pod_sandbox_id: sandbox_id.clone(),
            config: Some(container_config("c", &["sleep", "600"])),
            sandbox_config: Some(cfg),
        })
        .await
        .expect("CreateContainer")
        .container_id;
    rt.start_container(cri::StartContainerRequest {
        container_id: id.clone(),
    })
    .await
    .expect("StartContainer");

    let url = rt
        .exec(exec_req(
            &id,
            &["sh", "-c", "echo via-cri; exit 7"],
            false,
            true,
            true,
            false,
        ))
        .await
        .expect("Exec over gRPC")
        .url;
    let mut ws = open(&url, V5)
        .await
        .expect("open the URL from the gRPC answer");
    let mut out = Output::default();
    read_all(&mut ws, &mut out).await;
    assert_eq!(out.stdout(), "via-cri\n");
    assert_eq!(exit_code_of(out.status()).as_deref(), Some("7"));
    let err = rt
        .exec(exec_req("nope", &["true"], false, true, false, false))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::NotFound);

    rt.remove_pod_sandbox(cri::RemovePodSandboxRequest {
        pod_sandbox_id: sandbox_id,
    })
    .await
    .expect("RemovePodSandbox");
    drop(server);
    node.assert_all_gone();
}

#[tokio::test(flavor = "multi_thread")]
async fn attach_over_websocket() {
    if !root_or_skip("attach_over_websocket") {
        return;
    }
    let node = Node::new("wsattach").await;
    let sb = node.sandbox("wsattach").await;
    let mut cfg = container_config(
        "c",
        &[
            "sh",
            "-c",
            "while read l; do echo out:$l; echo err:$l >&2; done; echo bye; exit 0",
        ],
    );
    cfg.stdin = true;
    cfg.stdin_once = true;
    let id = node.container_with(&sb, cfg).await;
    let attach = |stdin: bool| cri::AttachRequest {
        container_id: id.clone(),
        stdin,
        tty: false,
        stdout: true,
        stderr: true,
    };

    // A follower without stdin sees the output another follower's input causes.
    let watch_url = node.rt.attach(attach(false)).await.expect("Attach").url;
    assert!(watch_url.contains("/attach/"), "{watch_url}");
    let mut watcher = open(&watch_url, V4).await.expect("open watcher");
    let url = node.rt.attach(attach(true)).await.expect("Attach").url;
    let mut ws = open(&url, V5).await.expect("open");
    let mut out = Output::default();
    let mut watched = Output::default();
    // The first message of each is the ready message on stdout.
    ws.send(frame(0, b"one\n")).await.unwrap();
    read_until(&mut ws, &mut out, "out:one\n").await;
    read_until(&mut watcher, &mut watched, "out:one\n").await;
    // Closing stdin ends the container's input (stdin_once): it says bye and exits, and both
    // sessions end with success.
    ws.send(frame(255, &[0])).await.unwrap();
    read_all(&mut ws, &mut out).await;
    read_all(&mut watcher, &mut watched).await;
    assert_eq!(out.stdout(), "out:one\nbye\n");
    assert_eq!(out.stderr(), "err:one\n");
    assert_eq!(out.status()["status"], "Success");
    assert!(watched.stdout().ends_with("bye\n"), "{}", watched.stdout());
    let s = node.wait_exited(&id).await;
    assert_eq!(s.exit_code, 0);

    // Unknown container, and a container that is not running.
    let err = node
        .rt
        .attach(cri::AttachRequest {
            container_id: "nope".into(),
            stdout: true,
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::NotFound);
    let err = node.rt.attach(attach(false)).await.unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition);
    let err = node
        .rt
        .exec(exec_req(&id, &["true"], false, true, false, false))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition);
    node.teardown().await;
}

/// A minimal SPDY/3.1 client over the runtime's frame codec, as kubectl's spdystream drives a
/// streaming server: an HTTP/1.1 upgrade, then streams opened with SYN_STREAM.
mod spdy_client {
    use runtime::streaming::spdy::{Codec, FLAG_FIN, Frame};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpStream;

    pub struct Client {
        io: TcpStream,
        codec: Codec,
        buf: Vec<u8>,
        next_id: u32,
    }

    /// Upgrades `url` to SPDY offering `protocol`: the client, or the refusal's HTTP status.
    pub async fn connect(url: &str, protocol: &str) -> Result<Client, u16> {
        let rest = url.strip_prefix("http://").unwrap();
        let (host, path) = rest.split_once('/').unwrap();
        let mut io = TcpStream::connect(host).await.unwrap();
        let req = format!(
            "POST /{path} HTTP/1.1\r\nHost: {host}\r\nConnection: Upgrade\r\nUpgrade: SPDY/3.1\r\nX-Stream-Protocol-Version: {protocol}\r\nContent-Length: 0\r\n\r\n"
        );
        io.write_all(req.as_bytes()).await.unwrap();
        let mut buf = Vec::new();
        let end = loop {
            if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                break i + 4;
            }
            let mut chunk = [0u8; 1024];
            let n = io.read(&mut chunk).await.unwrap();
            assert!(n > 0, "connection closed during the upgrade");
            buf.extend_from_slice(&chunk[..n]);
        };
        let head = String::from_utf8_lossy(&buf[..end]).to_ascii_lowercase();
        let status: u16 = head.split_whitespace().nth(1).unwrap().parse().unwrap();
        if status != 101 {
            return Err(status);
        }
        assert!(head.contains("upgrade: spdy/3.1"), "{head}");
        assert!(
            head.contains(&format!("x-stream-protocol-version: {protocol}")),
            "{head}"
        );
        Ok(Client {
            io,
            codec: Codec::new(),
            buf: buf.split_off(end),
            next_id: 1,
        })
    }

    impl Client {
        pub async fn send(&mut self, frame: Frame) {
            let mut out = Vec::new();
            self.codec.encode(&frame, &mut out).unwrap();
            self.io.write_all(&out).await.unwrap();
        }

        /// Opens a stream with `headers`; its id.
        pub async fn open(&mut self, headers: &[(&str, &str)]) -> u32 {
            let id = self.next_id;
            self.next_id += 2;
            let headers = headers
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect();
            self.send(Frame::SynStream {
                id,
                associated: 0,
                priority: 0,
                flags: 0,
                headers,
            })
            .await;
            id
        }

        pub async fn data(&mut self, id: u32, data: &[u8]) {
            self.send(Frame::Data {
                id,
                flags: 0,
                data: data.to_vec(),
            })
            .await;
        }

        pub async fn fin(&mut self, id: u32) {
            self.send(Frame::Data {
                id,
                flags: FLAG_FIN,
                data: Vec::new(),
            })
            .await;
        }

        /// The next frame; `None` once the server closed the connection.
        pub async fn next(&mut self) -> Option<Frame> {
            loop {
                if let Some((f, used)) = self.codec.decode(&self.buf).unwrap() {
                    self.buf.drain(..used);
                    return Some(f);
                }
                let mut chunk = [0u8; 16 * 1024];
                let n = self.io.read(&mut chunk).await.unwrap_or(0);
                if n == 0 {
                    return None;
                }
                self.buf.extend_from_slice(&chunk[..n]);
            }
        }
    }
}

fn text_of(got: &std::collections::HashMap<u32, Vec<u8>>, id: u32) -> String {
    String::from_utf8_lossy(got.get(&id).map(Vec::as_slice).unwrap_or_default()).into_owned()
}

/// Data received per stream until the server closes the connection (or every stream in
/// `until_fin` has ended); also checks each opened stream got its SYN_REPLY.
async fn spdy_collect(
    c: &mut spdy_client::Client,
    opened: &[u32],
    until_fin: &[u32],
) -> std::collections::HashMap<u32, Vec<u8>> {
    use runtime::streaming::spdy::{FLAG_FIN, Frame};
    let mut data: std::collections::HashMap<u32, Vec<u8>> = Default::default();
    let mut replied = Vec::new();
    let mut finished = Vec::new();
    let work = async {
        while let Some(f) = c.next().await {
            match f {
                Frame::SynReply { id, .. } => replied.push(id),
                Frame::Data { id, flags, data: d } => {
                    data.entry(id).or_default().extend_from_slice(&d);
                    if flags & FLAG_FIN != 0 {
                        finished.push(id);
                        if !until_fin.is_empty() && until_fin.iter().all(|i| finished.contains(i)) {
                            break;
                        }
                    }
                }
                Frame::GoAway { .. } => break,
                _ => {}
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(60), work)
        .await
        .expect("the SPDY session ended");
    for id in opened {
        assert!(replied.contains(id), "stream {id} got a SYN_REPLY");
    }
    data
}

#[tokio::test(flavor = "multi_thread")]
async fn exec_and_port_forward_over_spdy() {
    if !root_or_skip("exec_and_port_forward_over_spdy") {
        return;
    }
    let node = Node::new("spdy").await;
    let sb = node.sandbox("spdypod").await;
    let port = 19000 + (std::process::id() % 1000) as u16;
    let id = node
        .container_with(&sb, httpd("web", port, "spdy-forwarded"))
        .await;
    wait_serving(&node, &id, port).await;

    // Exec: stdin through cat to stdout, stderr apart, the exit code on the error stream.
    let url = exec_url(
        &node,
        exec_req(
            &id,
            &["sh", "-c", "cat; echo err >&2; exit 2"],
            true,
            true,
            true,
            false,
        ),
    )
    .await;
    let mut c = spdy_client::connect(&url, "v4.channel.k8s.io")
        .await
        .expect("upgrade");
    let error = c.open(&[("streamType", "error")]).await;
    let stdin = c.open(&[("streamType", "stdin")]).await;
    let stdout = c.open(&[("streamType", "stdout")]).await;
    let stderr = c.open(&[("streamType", "stderr")]).await;
    c.data(stdin, b"hello over spdy\n").await;
    c.fin(stdin).await;
    let got = spdy_collect(&mut c, &[error, stdin, stdout, stderr], &[]).await;
    let text = |id| {
        String::from_utf8_lossy(got.get(&id).map(Vec::as_slice).unwrap_or_default()).into_owned()
    };
    assert_eq!(text(stdout), "hello over spdy\n");
    assert_eq!(text(stderr), "err\n");
    let status: serde_json::Value = serde_json::from_str(&text(error)).expect("status JSON");
    assert_eq!(status["reason"], "NonZeroExitCode");
    assert_eq!(exit_code_of(&status).as_deref(), Some("2"));

    // A terminal with a resize stream.
    let url = exec_url(&node, exec_req(&id, &["sh"], true, true, false, true)).await;
    let mut c = spdy_client::connect(&url, "v4.channel.k8s.io")
        .await
        .unwrap();
    let error = c.open(&[("streamType", "error")]).await;
    let stdin = c.open(&[("streamType", "stdin")]).await;
    let stdout = c.open(&[("streamType", "stdout")]).await;
    let resize = c.open(&[("streamType", "resize")]).await;
    c.data(resize, br#"{"Width":90,"Height":33}"#).await;
    c.data(stdin, b"stty size; exit 0\n").await;
    let got = spdy_collect(&mut c, &[error, stdin, stdout, resize], &[]).await;
    let out = String::from_utf8_lossy(&got[&stdout]).into_owned();
    assert!(out.contains("33 90"), "{out:?}");
    let status: serde_json::Value = serde_json::from_slice(&got[&error]).unwrap();
    assert_eq!(status["status"], "Success");

    // Attach: the container reads a line from the attached stdin, answers and exits, which
    // ends the session with success.
    let mut cfg = container_config("reader", &["sh", "-c", "read l; echo got:$l; echo bye >&2"]);
    cfg.stdin = true;
    cfg.stdin_once = true;
    let reader = node.container_with(&sb, cfg).await;
    let url = node
        .rt
        .attach(cri::AttachRequest {
            container_id: reader.clone(),
            stdin: true,
            tty: false,
            stdout: true,
            stderr: true,
        })
        .await
        .expect("Attach")
        .url;
    let mut c = spdy_client::connect(&url, "v4.channel.k8s.io")
        .await
        .unwrap();
    let error = c.open(&[("streamType", "error")]).await;
    let stdin = c.open(&[("streamType", "stdin")]).await;
    let stdout = c.open(&[("streamType", "stdout")]).await;
    let stderr = c.open(&[("streamType", "stderr")]).await;
    c.data(stdin, b"x\n").await;
    let got = spdy_collect(&mut c, &[error, stdin, stdout, stderr], &[]).await;
    assert_eq!(text_of(&got, stdout), "got:x\n");
    assert_eq!(text_of(&got, stderr), "bye\n");
    let status: serde_json::Value = serde_json::from_slice(&got[&error]).unwrap();
    assert_eq!(status["status"], "Success");
    assert_eq!(node.wait_exited(&reader).await.exit_code, 0);

    // A client offering only an older subprotocol is refused.
    let url = exec_url(&node, exec_req(&id, &["true"], false, true, false, false)).await;
    assert_eq!(
        spdy_client::connect(&url, "v3.channel.k8s.io").await.err(),
        Some(403)
    );

    // Port-forward: one connection per request id, both on one session.
    let url = node
        .rt
        .port_forward(cri::PortForwardRequest {
            pod_sandbox_id: sb.0.clone(),
            port: vec![i32::from(port)],
        })
        .await
        .unwrap()
        .url;
    let mut c = spdy_client::connect(&url, "portforward.k8s.io")
        .await
        .unwrap();
    let p = port.to_string();
    let error = c
        .open(&[("streamType", "error"), ("port", &p), ("requestID", "0")])
        .await;
    let data = c
        .open(&[("streamType", "data"), ("port", &p), ("requestID", "0")])
        .await;
    c.data(data, b"GET /index.html HTTP/1.0\r\n\r\n").await;
    let got = spdy_collect(&mut c, &[error, data], &[data]).await;
    let reply = String::from_utf8_lossy(&got[&data]).into_owned();
    assert!(reply.starts_with("HTTP/1."), "{reply:?}");
    assert!(reply.contains("spdy-forwarded"), "{reply:?}");
    let closed = (port + 1).to_string();
    let error = c
        .open(&[
            ("streamType", "error"),
            ("port", &closed),
            ("requestID", "1"),
        ])
        .await;
    let data = c
        .open(&[
            ("streamType", "data"),
            ("port", &closed),
            ("requestID", "1"),
        ])
        .await;
    let got = spdy_collect(&mut c, &[error, data], &[error, data]).await;
    let msg = String::from_utf8_lossy(&got[&error]).into_owned();
    assert!(msg.contains("error forwarding port"), "{msg:?}");
    drop(c);
    node.teardown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn attach_to_a_terminal_container() {
    if !root_or_skip("attach_to_a_terminal_container") {
        return;
    }
    let node = Node::new("ttyattach").await;
    let sb = node.sandbox("ttyattach").await;
    let mut cfg = container_config("t", &["sh"]);
    cfg.tty = true;
    cfg.stdin = true;
    let id = node.container_with(&sb, cfg).await;
    let url = node
        .rt
        .attach(cri::AttachRequest {
            container_id: id.clone(),
            stdin: true,
            tty: true,
            stdout: true,
            stderr: false,
        })
        .await
        .expect("Attach")
        .url;
    let mut ws = open(&url, V5).await.expect("open");
    ws.send(frame(4, br#"{"Width":77,"Height":22}"#))
        .await
        .unwrap();
    ws.send(frame(0, b"tty; stty size; exit 3\n"))
        .await
        .unwrap();
    let mut out = Output::default();
    read_all(&mut ws, &mut out).await;
    let text = out.stdout();
    assert!(text.contains("/dev/pts/"), "{text:?}");
    assert!(text.contains("22 77"), "{text:?}");
    assert_eq!(out.status()["status"], "Success");
    let s = node.wait_exited(&id).await;
    assert_eq!(s.exit_code, 3);
    // The terminal's output is the container's stdout in its log.
    let (log_out, log_err) = log_output(std::path::Path::new(&s.log_path));
    assert!(log_out.contains("22 77"), "{log_out:?}");
    assert!(log_err.is_empty(), "{log_err:?}");
    node.teardown().await;
}
