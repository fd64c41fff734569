//! The sandbox wire protocol (sandbox/src/protocol.rs): JSON lines over the sandbox's unix
//! socket, and attach frames after an `Attached` answer.
//! - The sandbox's side: a request line read as the sandbox process reads it
//!   (`fdpass::recv_line`, then a `protocol::Request`); one it accepts must encode again into
//!   a line it accepts.
//! - The agent's side: `sandbox::Client` calls (state, start, stop, delete, exec, attach,
//!   subscribe) answered by a fake sandbox on a real socket with the fuzz bytes: whatever the
//!   sandbox sends, the client gives a result or an error, never a panic or an unbounded wait
//!   or allocation.
#![no_main]

use std::io::Write;
use std::path::PathBuf;
use std::sync::OnceLock;
use std::time::Duration;

use libfuzzer_sys::fuzz_target;
use sandbox::protocol::{MAX_MESSAGE, Request};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

struct Fixture {
    _dir: tempfile::TempDir,
    state_dir: PathBuf,
    rt: tokio::runtime::Runtime,
}

fn fixture() -> &'static Fixture {
    static FIXTURE: OnceLock<Fixture> = OnceLock::new();
    FIXTURE.get_or_init(|| {
        let dir = tempfile::tempdir().expect("temp dir");
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("tokio runtime");
        Fixture {
            state_dir: dir.path().to_path_buf(),
            _dir: dir,
            rt,
        }
    })
}

/// The sandbox process's reading of one request line.
fn sandbox_side(data: &[u8]) {
    let (a, b) = std::os::unix::net::UnixStream::pair().expect("socket pair");
    (&a).write_all(data).expect("writing the request");
    drop(a);
    let Ok((line, _fds)) = sandbox::fdpass::recv_line(&b, MAX_MESSAGE) else {
        return;
    };
    if let Ok(req) = serde_json::from_slice::<Request>(&line) {
        let again = serde_json::to_vec(&req).expect("a request encodes");
        assert!(!again.contains(&b'\n'), "an encoded request spans lines");
        serde_json::from_slice::<Request>(&again).expect("an encoded request decodes");
    }
}

/// One client call answered with `answer` by a fake sandbox.
async fn client_side(state_dir: PathBuf, op: u8, answer: Vec<u8>) {
    let client = sandbox::Client::new(&state_dir);
    let socket = client.layout().socket();
    let _ = std::fs::remove_file(&socket);
    let listener = tokio::net::UnixListener::bind(&socket).expect("binding the fake sandbox");
    let server = tokio::spawn(async move {
        let Ok((conn, _)) = listener.accept().await else {
            return;
        };
        let mut conn = BufReader::new(conn);
        let mut request = Vec::new();
        let _ = conn.read_until(b'\n', &mut request).await;
        let _ = conn.get_mut().write_all(&answer).await;
        let _ = conn.get_mut().shutdown().await;
    });
    let call = async {
        match op % 7 {
            0 => drop(client.state().await),
            1 => drop(client.start("c").await),
            2 => drop(client.stop("c", 15, Duration::from_secs(1)).await),
            3 => drop(client.delete("c").await),
            4 => {
                let spec = sandbox::ExecSpec {
                    container_id: "c".into(),
                    args: vec!["true".into()],
                    timeout_ms: 1000,
                };
                drop(client.exec(spec).await)
            }
            5 => {
                if let Ok(mut attach) = client.attach("c", false).await {
                    while let Ok(Some(_)) = attach.next().await {}
                }
            }
            _ => {
                if let Ok(mut events) = client.subscribe().await {
                    while events.recv().await.is_some() {}
                }
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(10), call)
        .await
        .expect("a client call hung on a closed connection");
    let _ = server.await;
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
    let Some((&op, rest)) = data.split_first() else {
        return;
    };
    sandbox_side(rest);
    let f = fixture();
    f.rt.block_on(client_side(f.state_dir.clone(), op, rest.to_vec()));
});
