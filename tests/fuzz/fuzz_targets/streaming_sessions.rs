//! The CRI streaming protocols served on arbitrary client bytes, over an in-memory
//! connection, against a backend that echoes (exec and attach copy stdin to stdout,
//! port-forward connections echo):
//! - WebSocket (`remotecommand::upgrade`, `portforward::upgrade` behind an HTTP/1.1 upgrade
//!   served by hyper and axum): after a valid upgrade request, the fuzz bytes are the client's
//!   WebSocket frames (channel byte, resize JSON, v5 close);
//! - SPDY/3.1 (`spdy::remotecommand::serve`, `spdy::portforward::serve`): the fuzz bytes are
//!   the client's frames (SYN_STREAM with zlib header blocks, data, pings, resets, ...).
//!
//! The first byte picks the protocol and session. Checked: no panic, and every session ends
//! once the client has sent everything and closed its side.
#![no_main]

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use axum::Router;
use axum::extract::ws::WebSocketUpgrade;
use axum::routing::get;
use hyper_util::rt::TokioIo;
use hyper_util::service::TowerToHyperService;
use libfuzzer_sys::fuzz_target;
use runtime::streaming::remotecommand::{Session, Streams};
use runtime::streaming::{Backend, Duplex, StreamIo, portforward, remotecommand, spdy};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Exec and attach echo stdin to stdout (and take resizes); port-forward connections echo.
struct Echo;

#[async_trait::async_trait]
impl Backend for Echo {
    async fn exec(&self, _id: &str, cmd: Vec<String>, io: StreamIo) -> runtime::Result<i32> {
        echo(io).await;
        Ok(cmd.len() as i32)
    }

    async fn attach(&self, _id: &str, io: StreamIo) -> runtime::Result<()> {
        echo(io).await;
        Ok(())
    }

    async fn port_forward(&self, _sandbox: &str, port: u16) -> runtime::Result<Box<dyn Duplex>> {
        if port == 1 {
            return Err(runtime::Error::unavailable("nothing listens on port 1"));
        }
        let (ours, theirs) = tokio::io::duplex(64 * 1024);
        tokio::spawn(async move {
            let (mut r, mut w) = tokio::io::split(theirs);
            let _ = tokio::io::copy(&mut r, &mut w).await;
            let _ = w.shutdown().await;
        });
        Ok(Box::new(ours))
    }
}

async fn echo(mut io: StreamIo) {
    let resizes = async { while io.resize.recv().await.is_some() {} };
    let copy = async {
        if let (Some(stdin), Some(stdout)) = (io.stdin.as_mut(), io.stdout.as_mut()) {
            let _ = tokio::io::copy(stdin, stdout).await;
        }
        if let Some(stderr) = io.stderr.as_mut() {
            let _ = stderr.write_all(b"done\n").await;
        }
    };
    tokio::select! {
        () = copy => {}
        () = resizes => {}
    }
}

fn runtime() -> &'static tokio::runtime::Runtime {
    static RT: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RT.get_or_init(|| {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("tokio runtime")
    })
}

fn streams(stdin: bool, stdout: bool, stderr: bool, tty: bool) -> Streams {
    Streams {
        stdin,
        stdout,
        stderr,
        tty,
    }
}

fn exec(s: Streams) -> Session {
    Session::Exec {
        container_id: "c".into(),
        cmd: vec!["sh".into()],
        streams: s,
    }
}

/// Writes `client` (then closes the client's side) and reads everything the server sends.
async fn drive(client: tokio::io::DuplexStream, bytes: Vec<u8>) {
    let (mut r, mut w) = tokio::io::split(client);
    let writer = tokio::spawn(async move {
        let _ = w.write_all(&bytes).await;
        let _ = w.shutdown().await;
    });
    let mut sink = Vec::new();
    let _ = r.read_to_end(&mut sink).await;
    let _ = writer.await;
}

async fn websocket(mode: u8, frames: &[u8]) {
    let backend: Arc<dyn Backend> = Arc::new(Echo);
    let (path, protocol) = match mode {
        0 => ("/exec", remotecommand::V5_PROTOCOL),
        1 => ("/tty", remotecommand::V4_PROTOCOL),
        2 => ("/attach", remotecommand::V5_PROTOCOL),
        _ => ("/portforward", portforward::V4_PROTOCOL),
    };
    let (b1, b2, b3, b4) = (backend.clone(), backend.clone(), backend.clone(), backend);
    let app = Router::new()
        .route(
            "/exec",
            get(move |ws: WebSocketUpgrade| async move {
                remotecommand::upgrade(ws, exec(streams(true, true, true, false)), b1)
            }),
        )
        .route(
            "/tty",
            get(move |ws: WebSocketUpgrade| async move {
                remotecommand::upgrade(ws, exec(streams(true, true, false, true)), b2)
            }),
        )
        .route(
            "/attach",
            get(move |ws: WebSocketUpgrade| async move {
                let session = Session::Attach {
                    container_id: "c".into(),
                    streams: streams(true, true, false, true),
                };
                remotecommand::upgrade(ws, session, b3)
            }),
        )
        .route(
            "/portforward",
            get(move |ws: WebSocketUpgrade| async move {
                portforward::upgrade(ws, "pod".into(), vec![80, 1, 8080], b4)
            }),
        );
    let (client, server) = tokio::io::duplex(64 * 1024);
    let conn = tokio::spawn(
        hyper::server::conn::http1::Builder::new()
            .serve_connection(TokioIo::new(server), TowerToHyperService::new(app))
            .with_upgrades(),
    );
    let mut bytes = format!(
        "GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\
         Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\
         Sec-WebSocket-Protocol: {protocol}\r\n\r\n"
    )
    .into_bytes();
    bytes.extend_from_slice(frames);
    drive(client, bytes).await;
    let _ = conn.await;
}

async fn spdy_session(mode: u8, frames: &[u8]) {
    let backend: Arc<dyn Backend> = Arc::new(Echo);
    let (client, server) = tokio::io::duplex(64 * 1024);
    let session = match mode {
        4 => Some(exec(streams(true, true, true, false))),
        5 => Some(exec(streams(true, true, false, true))),
        6 => Some(Session::Attach {
            container_id: "c".into(),
            streams: streams(true, true, true, false),
        }),
        _ => None,
    };
    let served = match session {
        Some(s) => tokio::spawn(spdy::remotecommand::serve(server, s, backend)),
        None => tokio::spawn(spdy::portforward::serve(server, "pod".into(), backend)),
    };
    drive(client, frames.to_vec()).await;
    let _ = served.await;
}

/// libFuzzer's `main` is C's, so the Rust runtime never set SIGPIPE to ignored as it does for
/// the nodelet binary: a write to a closed socket would kill the fuzzer instead of failing.
fn ignore_sigpipe() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    // SAFETY: setting a signal's disposition to SIG_IGN, before any socket is used.
    ONCE.call_once(|| unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_IGN);
    });
}

fuzz_target!(|data: &[u8]| {
    ignore_sigpipe();
    let Some((&first, frames)) = data.split_first() else {
        return;
    };
    let _ = portforward::query_ports(&String::from_utf8_lossy(frames));
    let mode = first % 8;
    let run = async {
        if mode < 4 {
            websocket(mode, frames).await
        } else {
            spdy_session(mode, frames).await
        }
    };
    runtime().block_on(async {
        tokio::time::timeout(Duration::from_secs(10), run)
            .await
            .expect("a session did not end after its client closed the connection")
    });
});
