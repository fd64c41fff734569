//! The server side of a SPDY connection: streams the client opens arrive as [`Incoming`]
//! (answered with SYN_REPLY at once), their data as chunks until the client's FIN; the
//! [`Sender`] writes data and FINs; pings are answered. The session ends when the client closes
//! the connection or sends GOAWAY, or when [`Session::close`] is called.

use std::collections::HashMap;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::mpsc;

use super::{Codec, FLAG_FIN, Frame, Headers};

/// A stream the client opened.
#[derive(Debug)]
pub struct Incoming {
    pub id: u32,
    pub headers: Headers,
    /// What the client sends on it; closed at its FIN (or reset, or the connection's end).
    pub data: mpsc::Receiver<Vec<u8>>,
}

enum Out {
    Frame(Frame),
    Close,
}

/// Writes on the session's streams. Cheap to clone.
#[derive(Clone)]
pub struct Sender {
    tx: mpsc::Sender<Out>,
}

impl Sender {
    /// Sends `data` on stream `id` (in frames of at most 32 KiB); false once the connection is
    /// gone.
    pub async fn data(&self, id: u32, data: &[u8]) -> bool {
        for chunk in data.chunks(32 * 1024) {
            let frame = Frame::Data {
                id,
                flags: 0,
                data: chunk.to_vec(),
            };
            if self.tx.send(Out::Frame(frame)).await.is_err() {
                return false;
            }
        }
        true
    }

    /// Ends stream `id` in the server's direction.
    pub async fn fin(&self, id: u32) -> bool {
        let frame = Frame::Data {
            id,
            flags: FLAG_FIN,
            data: Vec::new(),
        };
        self.tx.send(Out::Frame(frame)).await.is_ok()
    }
}

/// A running session.
pub struct Session {
    pub sender: Sender,
    pub incoming: mpsc::Receiver<Incoming>,
    reader: tokio::task::JoinHandle<()>,
    writer: tokio::task::JoinHandle<()>,
}

impl Session {
    /// Serves SPDY on `io` (an upgraded connection).
    pub fn start(io: impl AsyncRead + AsyncWrite + Send + 'static) -> Session {
        let (r, w) = tokio::io::split(io);
        let (tx, rx) = mpsc::channel::<Out>(64);
        let (in_tx, incoming) = mpsc::channel(16);
        let writer = tokio::spawn(write_loop(w, rx));
        let reader = tokio::spawn(read_loop(r, tx.clone(), in_tx));
        Session {
            sender: Sender { tx },
            incoming,
            reader,
            writer,
        }
    }

    /// Sends GOAWAY once everything queued is written, and closes the connection.
    pub async fn close(self) {
        let Session {
            sender,
            incoming,
            reader,
            writer,
        } = self;
        drop(incoming);
        let _ = sender
            .tx
            .send(Out::Frame(Frame::GoAway {
                last_good: 0,
                status: 0,
            }))
            .await;
        let _ = sender.tx.send(Out::Close).await;
        drop(sender);
        let _ = writer.await;
        reader.abort();
    }
}

async fn write_loop(mut w: impl AsyncWrite + Unpin, mut rx: mpsc::Receiver<Out>) {
    let mut codec = Codec::new();
    let mut buf = Vec::new();
    while let Some(out) = rx.recv().await {
        let frame = match out {
            Out::Frame(f) => f,
            Out::Close => break,
        };
        buf.clear();
        if let Err(e) = codec.encode(&frame, &mut buf) {
            tracing::debug!("spdy: encoding {frame:?}: {e}");
            break;
        }
        if w.write_all(&buf).await.is_err() {
            break;
        }
    }
    let _ = w.shutdown().await;
}

async fn read_loop(
    mut r: impl AsyncRead + Unpin,
    out: mpsc::Sender<Out>,
    incoming: mpsc::Sender<Incoming>,
) {
    let mut codec = Codec::new();
    let mut buf: Vec<u8> = Vec::new();
    let mut streams: HashMap<u32, mpsc::Sender<Vec<u8>>> = HashMap::new();
    let mut chunk = vec![0u8; 64 * 1024];
    loop {
        let frame = match codec.decode(&buf) {
            Ok(Some((frame, used))) => {
                buf.drain(..used);
                frame
            }
            Ok(None) => match r.read(&mut chunk).await {
                Ok(0) | Err(_) => return,
                Ok(n) => {
                    buf.extend_from_slice(&chunk[..n]);
                    continue;
                }
            },
            Err(e) => {
                tracing::debug!("spdy: {e}");
                return;
            }
        };
        match frame {
            Frame::SynStream {
                id, flags, headers, ..
            } => {
                let reply = Frame::SynReply {
                    id,
                    flags: 0,
                    headers: Vec::new(),
                };
                if out.send(Out::Frame(reply)).await.is_err() {
                    return;
                }
                let (tx, data) = mpsc::channel(16);
                if flags & FLAG_FIN == 0 {
                    streams.insert(id, tx);
                }
                if incoming.send(Incoming { id, headers, data }).await.is_err() {
                    return;
                }
            }
            Frame::Data { id, flags, data } => {
                if let Some(tx) = streams.get(&id) {
                    if !data.is_empty() && tx.send(data).await.is_err() {
                        streams.remove(&id);
                    }
                }
                if flags & FLAG_FIN != 0 {
                    streams.remove(&id);
                }
            }
            Frame::RstStream { id, .. } => {
                streams.remove(&id);
            }
            // A ping is echoed (in the guard); the session ends if that fails.
            Frame::Ping { id } if out.send(Out::Frame(Frame::Ping { id })).await.is_err() => {
                return;
            }
            Frame::GoAway { .. } => return,
            // No flow control is enforced (spdystream has none either); settings, headers and
            // unknown frames change nothing here.
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The client's end of a session under test.
    struct Peer {
        io: tokio::io::DuplexStream,
        codec: Codec,
        buf: Vec<u8>,
    }

    impl Peer {
        async fn send(&mut self, f: Frame) {
            let mut out = Vec::new();
            self.codec.encode(&f, &mut out).unwrap();
            self.io.write_all(&out).await.unwrap();
        }

        async fn next(&mut self) -> Option<Frame> {
            loop {
                if let Some((f, used)) = self.codec.decode(&self.buf).unwrap() {
                    self.buf.drain(..used);
                    return Some(f);
                }
                let mut chunk = [0u8; 4096];
                let n = self.io.read(&mut chunk).await.unwrap();
                if n == 0 {
                    return None;
                }
                self.buf.extend_from_slice(&chunk[..n]);
            }
        }
    }

    fn start() -> (Session, Peer) {
        let (a, b) = tokio::io::duplex(1 << 16);
        let peer = Peer {
            io: b,
            codec: Codec::new(),
            buf: Vec::new(),
        };
        (Session::start(a), peer)
    }

    fn syn(id: u32, flags: u8, kind: &str) -> Frame {
        Frame::SynStream {
            id,
            associated: 0,
            priority: 0,
            flags,
            headers: vec![("streamtype".into(), kind.into())],
        }
    }

    #[tokio::test]
    async fn streams_are_replied_to_and_carry_data_until_fin() {
        let (mut s, mut peer) = start();
        peer.send(syn(1, 0, "stdin")).await;
        assert_eq!(
            peer.next().await,
            Some(Frame::SynReply {
                id: 1,
                flags: 0,
                headers: Vec::new()
            })
        );
        let mut stdin = s.incoming.recv().await.unwrap();
        assert_eq!((stdin.id, stdin.headers[0].1.as_str()), (1, "stdin"));
        for (flags, data) in [(0, &b"ab"[..]), (FLAG_FIN, &b"c"[..])] {
            peer.send(Frame::Data {
                id: 1,
                flags,
                data: data.to_vec(),
            })
            .await;
        }
        assert_eq!(stdin.data.recv().await.as_deref(), Some(&b"ab"[..]));
        assert_eq!(stdin.data.recv().await.as_deref(), Some(&b"c"[..]));
        assert_eq!(
            stdin.data.recv().await,
            None,
            "FIN closes the stream's input"
        );

        // A stream opened with FIN has no input at all; the server still writes on it.
        peer.send(syn(3, FLAG_FIN, "error")).await;
        let _reply = peer.next().await;
        let mut error = s.incoming.recv().await.unwrap();
        assert_eq!(error.data.recv().await, None);
        assert!(s.sender.data(3, b"status").await);
        assert!(s.sender.fin(3).await);
        assert_eq!(
            peer.next().await,
            Some(Frame::Data {
                id: 3,
                flags: 0,
                data: b"status".to_vec()
            })
        );
        assert_eq!(
            peer.next().await,
            Some(Frame::Data {
                id: 3,
                flags: FLAG_FIN,
                data: Vec::new()
            })
        );

        // Pings are echoed; close sends GOAWAY and ends the connection.
        peer.send(Frame::Ping { id: 5 }).await;
        assert_eq!(peer.next().await, Some(Frame::Ping { id: 5 }));
        s.close().await;
        assert!(matches!(peer.next().await, Some(Frame::GoAway { .. })));
        assert_eq!(peer.next().await, None);
    }

    #[tokio::test]
    async fn the_client_going_away_ends_the_incoming_streams() {
        let (mut s, mut peer) = start();
        peer.send(syn(1, 0, "stdout")).await;
        let mut stream = s.incoming.recv().await.unwrap();
        peer.send(Frame::GoAway {
            last_good: 1,
            status: 0,
        })
        .await;
        assert!(s.incoming.recv().await.is_none());
        assert_eq!(stream.data.recv().await, None);
        drop(peer);
    }
}
