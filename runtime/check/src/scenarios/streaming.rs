//! Exec, Attach and PortForward through the runtime's streaming URLs, spoken to as kubectl
//! does through the kubelet: WebSocket with the `v4.channel.k8s.io` subprotocol (a channel
//! byte before each message: 0 stdin, 1 stdout, 2 stderr, 3 the status), and for port-forward
//! two channels per port (data, error), each first announcing the port.

use std::time::Duration;

use futures::{SinkExt, StreamExt};
use runtime::cri;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;

use crate::ctx::{Ctx, Pod, free_port};
use crate::outcome::{OrFail, Step, Stop, ensure, ensure_eq, fail};

type Ws =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

const V4: &str = "v4.channel.k8s.io";

/// Opens a WebSocket on the streaming URL `url` with the v4 subprotocol.
async fn open(url: &str) -> Step<Ws> {
    let ws_url = url
        .replacen("http://", "ws://", 1)
        .replacen("https://", "wss://", 1);
    let mut req = ws_url
        .as_str()
        .into_client_request()
        .map_err(|e| Stop::Fail(format!("the streaming URL {url:?}: {e}")))?;
    req.headers_mut().insert(
        "Sec-WebSocket-Protocol",
        axum::http::HeaderValue::from_static(V4),
    );
    let connect = tokio_tungstenite::connect_async(req);
    let (ws, resp) = tokio::time::timeout(Duration::from_secs(20), connect)
        .await
        .map_err(|_| Stop::Fail(format!("opening {url}: no answer in 20 s")))?
        .map_err(|e| Stop::Fail(format!("opening {url}: {e}")))?;
    let picked = resp.headers().get("sec-websocket-protocol");
    ensure!(
        picked.is_some_and(|p| p == V4),
        "the streaming server did not pick {V4}: {picked:?}"
    );
    Ok(ws)
}

fn frame(channel: u8, data: &[u8]) -> Message {
    let mut v = vec![channel];
    v.extend_from_slice(data);
    Message::Binary(v.into())
}

/// What a session wrote, by channel.
#[derive(Debug, Default)]
struct Output {
    channels: [Vec<u8>; 4],
}

impl Output {
    fn text(&self, channel: usize) -> String {
        String::from_utf8_lossy(&self.channels[channel]).into_owned()
    }

    /// The status on channel 3, as JSON.
    fn status(&self) -> Step<serde_json::Value> {
        serde_json::from_slice(&self.channels[3])
            .map_err(|e| Stop::Fail(format!("the status channel {:?}: {e}", self.text(3))))
    }
}

/// Reads until the server closes the session, or until `until` holds on the output; 30 s at
/// most.
async fn read(ws: &mut Ws, out: &mut Output, until: impl Fn(&Output) -> bool) -> Step {
    let work = async {
        while !until(out) {
            match ws.next().await {
                Some(Ok(Message::Binary(d))) => {
                    if let Some((ch, payload)) = d.split_first()
                        && let Some(buf) = out.channels.get_mut(usize::from(*ch))
                    {
                        buf.extend_from_slice(payload);
                    }
                }
                Some(Ok(Message::Close(_))) | Some(Err(_)) | None => return,
                Some(Ok(_)) => {}
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(30), work)
        .await
        .map_err(|_| Stop::Fail(format!("the session did not end in 30 s: {out:?}")))
}

pub async fn exec_stream(c: &Ctx<'_>) -> Step {
    let pod = c.pod("exec").await?;
    let id = c.run(&pod, "c", &["sleep", "600"]).await?;
    let exec = |cmd: &[&str], stdin: bool| cri::ExecRequest {
        container_id: id.clone(),
        cmd: cmd.iter().map(|s| s.to_string()).collect(),
        tty: false,
        stdin,
        stdout: true,
        stderr: true,
    };
    let url = c
        .call(
            "Exec",
            Duration::ZERO,
            c.rt()
                .exec(exec(&["sh", "-c", "echo out; echo err >&2; exit 3"], false)),
        )
        .await?
        .or_fail("Exec")?
        .url;
    let mut ws = open(&url).await?;
    let mut out = Output::default();
    read(&mut ws, &mut out, |_| false).await?;
    ensure_eq!(
        (out.text(1), out.text(2)),
        ("out\n".to_string(), "err\n".to_string()),
        "an exec's stdout and stderr"
    );
    let status = out.status()?;
    ensure_eq!(
        (
            status["status"].as_str(),
            status["reason"].as_str(),
            status["details"]["causes"][0]["message"].as_str()
        ),
        (Some("Failure"), Some("NonZeroExitCode"), Some("3")),
        "the status of `exit 3`: {status}"
    );

    // Input: a line in, the line out, then success.
    let url = c
        .call(
            "Exec",
            Duration::ZERO,
            c.rt().exec(exec(&["head", "-n1"], true)),
        )
        .await?
        .or_fail("Exec")?
        .url;
    let mut ws = open(&url).await?;
    ws.send(frame(0, b"hello\n"))
        .await
        .map_err(|e| Stop::Fail(format!("sending stdin: {e}")))?;
    let mut out = Output::default();
    read(&mut ws, &mut out, |_| false).await?;
    ensure_eq!(out.text(1), "hello\n", "an exec's stdout of its stdin");
    let status = out.status()?;
    ensure_eq!(
        status["status"].as_str(),
        Some("Success"),
        "the status of a successful exec"
    );
    // A URL is good for one session.
    ensure!(
        open(&url).await.is_err(),
        "a streaming URL opened a second session"
    );
    Ok(())
}

pub async fn attach_stream(c: &Ctx<'_>) -> Step {
    let pod = c.pod("attach").await?;
    let mut cfg = c.container_config("c", &["sh", "-c", "read l; echo got:$l; echo bye >&2"]);
    cfg.stdin = true;
    cfg.stdin_once = true;
    let id = c.run_with(&pod, cfg).await?;
    let req = cri::AttachRequest {
        container_id: id.clone(),
        stdin: true,
        tty: false,
        stdout: true,
        stderr: true,
    };
    let url = c
        .call("Attach", Duration::ZERO, c.rt().attach(req))
        .await?
        .or_fail("Attach")?
        .url;
    let mut ws = open(&url).await?;
    ws.send(frame(0, b"one\n"))
        .await
        .map_err(|e| Stop::Fail(format!("sending stdin: {e}")))?;
    let mut out = Output::default();
    read(&mut ws, &mut out, |o| {
        o.text(1).contains("got:one\n") && o.text(2).contains("bye\n")
    })
    .await?;
    ensure_eq!(
        (out.text(1), out.text(2)),
        ("got:one\n".to_string(), "bye\n".to_string()),
        "the attached container's stdout and stderr"
    );
    let s = c.wait_exited(&id).await?;
    ensure_eq!(s.exit_code, 0, "the attached container's exit code");
    Ok(())
}

/// An HTTP/1.0 GET of `/` through a port-forward session to `port` of `pod`: the data and
/// error channels' bytes.
async fn forward_get(c: &Ctx<'_>, pod: &Pod, port: u16) -> Step<(String, String)> {
    let req = cri::PortForwardRequest {
        pod_sandbox_id: pod.0.clone(),
        port: vec![i32::from(port)],
    };
    let url = c
        .call("PortForward", Duration::ZERO, c.rt().port_forward(req))
        .await?
        .or_fail("PortForward")?
        .url;
    let mut ws = open(&format!("{url}?port={port}")).await?;
    let le = port.to_le_bytes();
    for ch in [0u8, 1] {
        match tokio::time::timeout(Duration::from_secs(20), ws.next()).await {
            Ok(Some(Ok(Message::Binary(d)))) if d[..] == [ch, le[0], le[1]] => {}
            other => fail!("channel {ch}'s port announcement: got {other:?}"),
        }
    }
    ws.send(frame(0, b"GET / HTTP/1.0\r\n\r\n"))
        .await
        .map_err(|e| Stop::Fail(format!("sending the request: {e}")))?;
    let mut out = Output::default();
    read(&mut ws, &mut out, |_| false).await?;
    Ok((out.text(0), out.text(1)))
}

pub async fn port_forward_stream(c: &Ctx<'_>) -> Step {
    let port = free_port()?;
    let pod = c.pod("forward").await?;
    let script = format!(
        "mkdir -p /tmp/www && echo forwarded > /tmp/www/index.html && \
         exec httpd -f -p 127.0.0.1:{port} -h /tmp/www"
    );
    let id = c.run(&pod, "web", &["sh", "-c", &script]).await?;
    let listening = format!("netstat -ltn | grep -q '127.0.0.1:{port} '");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while c.exec(&id, &["sh", "-c", &listening]).await?.code != 0 {
        ensure!(
            tokio::time::Instant::now() < deadline,
            "httpd did not listen on {port} in 20 s"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (data, error) = forward_get(c, &pod, port).await?;
    ensure!(
        data.starts_with("HTTP/1.") && data.contains("forwarded"),
        "the reply through the forward: {data:?} (error channel {error:?})"
    );
    ensure_eq!(error, "", "the error channel of a good forward");
    Ok(())
}
