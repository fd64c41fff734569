//! Older gRPC clients (grpc-go before Kubernetes changed its CRI client to send `localhost`,
//! grpc-java, some grpc-core versions) send a unix socket's path as the HTTP/2 `:authority`,
//! e.g. `/run/nodelet/cri.sock`. The HTTP/2 server under tonic (h2) rejects such a request as
//! malformed (`RST_STREAM PROTOCOL_ERROR`), so those clients could not use nodelet's CRI socket
//! at all. [`Rewriter`] sits between the socket and the HTTP/2 server, on the client-to-server
//! bytes: it follows the frames, decodes each header block (HPACK, with the client's dynamic
//! table) and, when an `:authority` is not a valid authority, replaces it with `localhost`.
//!
//! Header blocks pass through unchanged until one needs a change. From then on every block is
//! re-encoded as literals that never touch the HPACK dynamic table, so the server's decoder
//! (which saw the client's table changes up to that point, and none after) stays consistent
//! with what it receives. Other frames pass through as they are.

use std::collections::VecDeque;

/// The HTTP/2 client connection preface.
const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
const FRAME_HEADER: usize = 9;
const HEADERS: u8 = 0x1;
const CONTINUATION: u8 = 0x9;
const END_STREAM: u8 = 0x1;
const END_HEADERS: u8 = 0x4;
const PADDED: u8 = 0x8;
const PRIORITY: u8 = 0x20;
/// The frame size every HTTP/2 peer accepts (SETTINGS_MAX_FRAME_SIZE's floor).
const MAX_FRAME: usize = 16_384;
/// Larger frames are refused outright (h2's own limit is lower; this only bounds buffering).
const MAX_ACCEPTED_FRAME: usize = 16 * 1024 * 1024;
/// The largest dynamic table a client may ask for (h2 advertises 4096).
const MAX_TABLE: usize = 64 * 1024;

/// What the rewriter makes of the bytes it is fed.
pub(super) struct Rewriter {
    input: Vec<u8>,
    output: VecDeque<u8>,
    preface_seen: bool,
    decoder: loona_hpack::Decoder<'static>,
    /// Once a block has been re-encoded, all later ones are.
    reencoding: bool,
    /// A header block split over HEADERS + CONTINUATION frames, being collected.
    pending: Option<Pending>,
    /// The connection is not HTTP/2 as expected: pass the rest through untouched (the server
    /// will refuse it with a proper error).
    passthrough: bool,
}

struct Pending {
    stream: u32,
    flags: u8,
    priority: Option<[u8; 5]>,
    block: Vec<u8>,
    /// The raw frames so far, to forward unchanged if the block needs no change.
    raw: Vec<u8>,
}

/// The input broke the protocol (a malformed header block or frame): the connection is closed.
/// Its message says how.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct Broken(pub(super) String);

impl Default for Rewriter {
    fn default() -> Self {
        let mut decoder = loona_hpack::Decoder::new();
        decoder.set_max_allowed_table_size(MAX_TABLE);
        Rewriter {
            input: Vec::new(),
            output: VecDeque::new(),
            preface_seen: false,
            decoder,
            reencoding: false,
            pending: None,
            passthrough: false,
        }
    }
}

impl Rewriter {
    /// Takes bytes read from the client and turns every complete frame into output.
    pub(super) fn feed(&mut self, bytes: &[u8]) -> Result<(), Broken> {
        if self.passthrough {
            self.output.extend(bytes);
            return Ok(());
        }
        self.input.extend_from_slice(bytes);
        if !self.preface_seen {
            let n = self.input.len().min(PREFACE.len());
            if self.input[..n] != PREFACE[..n] {
                self.passthrough = true;
                self.output.extend(self.input.drain(..));
                return Ok(());
            }
            if n < PREFACE.len() {
                return Ok(());
            }
            self.output.extend(self.input.drain(..PREFACE.len()));
            self.preface_seen = true;
        }
        while self.input.len() >= FRAME_HEADER {
            let len = (usize::from(self.input[0]) << 16)
                | (usize::from(self.input[1]) << 8)
                | usize::from(self.input[2]);
            if len > MAX_ACCEPTED_FRAME {
                return Err(Broken(format!("a {len}-byte HTTP/2 frame")));
            }
            if self.input.len() < FRAME_HEADER + len {
                break;
            }
            let frame: Vec<u8> = self.input.drain(..FRAME_HEADER + len).collect();
            self.frame(&frame)?;
        }
        Ok(())
    }

    /// Moves up to `out.len()` bytes of output into `out`; returns how many.
    pub(super) fn drain_into(&mut self, out: &mut [u8]) -> usize {
        let n = out.len().min(self.output.len());
        for (slot, b) in out.iter_mut().zip(self.output.drain(..n)) {
            *slot = b;
        }
        n
    }

    pub(super) fn has_output(&self) -> bool {
        !self.output.is_empty()
    }

    fn frame(&mut self, frame: &[u8]) -> Result<(), Broken> {
        let (kind, flags) = (frame[3], frame[4]);
        let stream = u32::from_be_bytes([frame[5], frame[6], frame[7], frame[8]]) & 0x7fff_ffff;
        let payload = &frame[FRAME_HEADER..];
        match (kind, self.pending.as_mut()) {
            (HEADERS, None) => {
                let (priority, fragment) = headers_fragment(flags, payload)?;
                self.pending = Some(Pending {
                    stream,
                    flags,
                    priority,
                    block: fragment.to_vec(),
                    raw: frame.to_vec(),
                });
            }
            (CONTINUATION, Some(p)) if p.stream == stream => {
                p.block.extend_from_slice(payload);
                p.raw.extend_from_slice(frame);
                p.flags |= flags & END_HEADERS;
            }
            (_, Some(_)) => {
                return Err(Broken(
                    "a header block interrupted by another frame".to_string(),
                ));
            }
            (_, None) => {
                self.output.extend(frame);
                return Ok(());
            }
        }
        if self
            .pending
            .as_ref()
            .is_some_and(|p| p.flags & END_HEADERS != 0)
        {
            if let Some(p) = self.pending.take() {
                self.block(p)?;
            }
        }
        Ok(())
    }

    fn block(&mut self, p: Pending) -> Result<(), Broken> {
        let headers = self
            .decoder
            .decode(&p.block)
            .map_err(|e| Broken(format!("an undecodable header block: {e:?}")))?;
        let invalid = |name: &[u8], value: &[u8]| {
            name == b":authority" && http::uri::Authority::try_from(value).is_err()
        };
        let bad = headers.iter().any(|(n, v)| invalid(n, v));
        if !bad && !self.reencoding {
            self.output.extend(p.raw);
            return Ok(());
        }
        if bad && !self.reencoding {
            tracing::debug!(
                "CRI server: a client sends an invalid :authority (a socket path?); using localhost"
            );
        }
        self.reencoding = true;
        let mut block = Vec::new();
        for (name, value) in &headers {
            let value: &[u8] = if invalid(name, value) {
                b"localhost"
            } else {
                value
            };
            literal(&mut block, name, value);
        }
        self.emit_block(p.stream, p.flags & END_STREAM, p.priority, &block);
        Ok(())
    }

    /// Writes a header block as HEADERS (+ CONTINUATION) frames of at most [`MAX_FRAME`].
    fn emit_block(&mut self, stream: u32, end_stream: u8, priority: Option<[u8; 5]>, block: &[u8]) {
        let first_room = MAX_FRAME - if priority.is_some() { 5 } else { 0 };
        let (first, mut rest) = block.split_at(block.len().min(first_room));
        let mut flags = end_stream | if priority.is_some() { PRIORITY } else { 0 };
        if rest.is_empty() {
            flags |= END_HEADERS;
        }
        let mut payload = Vec::with_capacity(first.len() + 5);
        if let Some(p) = priority {
            payload.extend_from_slice(&p);
        }
        payload.extend_from_slice(first);
        self.emit_frame(HEADERS, flags, stream, &payload);
        while !rest.is_empty() {
            let (chunk, more) = rest.split_at(rest.len().min(MAX_FRAME));
            rest = more;
            let flags = if rest.is_empty() { END_HEADERS } else { 0 };
            self.emit_frame(CONTINUATION, flags, stream, chunk);
        }
    }

    fn emit_frame(&mut self, kind: u8, flags: u8, stream: u32, payload: &[u8]) {
        let len = payload.len();
        self.output
            .extend([(len >> 16) as u8, (len >> 8) as u8, len as u8, kind, flags]);
        self.output.extend(stream.to_be_bytes());
        self.output.extend(payload);
    }
}

/// The header block fragment of a HEADERS frame's payload, without padding, and its priority
/// fields when present.
fn headers_fragment(flags: u8, payload: &[u8]) -> Result<(Option<[u8; 5]>, &[u8]), Broken> {
    let short = || Broken("a HEADERS frame shorter than its padding and priority".to_string());
    let mut body = payload;
    let mut pad = 0;
    if flags & PADDED != 0 {
        let (&n, after) = body.split_first().ok_or_else(short)?;
        pad = usize::from(n);
        body = after;
    }
    let mut priority = None;
    if flags & PRIORITY != 0 {
        let p: [u8; 5] = body
            .get(..5)
            .and_then(|b| b.try_into().ok())
            .ok_or_else(short)?;
        priority = Some(p);
        body = &body[5..];
    }
    let end = body.len().checked_sub(pad).ok_or_else(short)?;
    Ok((priority, &body[..end]))
}

/// An HPACK "literal header field without indexing — new name", without Huffman coding: the
/// one representation that needs no table on either side.
fn literal(out: &mut Vec<u8>, name: &[u8], value: &[u8]) {
    out.push(0x00);
    for s in [name, value] {
        out.extend(loona_hpack::encoder::encode_integer(s.len(), 7));
        out.extend_from_slice(s);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
        let len = payload.len();
        let mut f = vec![(len >> 16) as u8, (len >> 8) as u8, len as u8, kind, flags];
        f.extend(stream.to_be_bytes());
        f.extend(payload);
        f
    }

    /// Splits output bytes into frames (after the preface).
    fn frames(mut bytes: &[u8]) -> Vec<(u8, u8, u32, Vec<u8>)> {
        assert!(bytes.starts_with(PREFACE));
        bytes = &bytes[PREFACE.len()..];
        let mut out = Vec::new();
        while !bytes.is_empty() {
            let len = (usize::from(bytes[0]) << 16)
                | (usize::from(bytes[1]) << 8)
                | usize::from(bytes[2]);
            let stream = u32::from_be_bytes([bytes[5], bytes[6], bytes[7], bytes[8]]);
            out.push((bytes[3], bytes[4], stream, bytes[9..9 + len].to_vec()));
            bytes = &bytes[9 + len..];
        }
        out
    }

    fn run(input: &[u8], chunk: usize) -> Vec<u8> {
        let mut r = Rewriter::default();
        let mut out = Vec::new();
        for piece in input.chunks(chunk) {
            r.feed(piece).expect("feed");
            let mut buf = [0u8; 7];
            loop {
                let n = r.drain_into(&mut buf);
                if n == 0 {
                    break;
                }
                out.extend_from_slice(&buf[..n]);
            }
        }
        out
    }

    fn headers(block: &[u8]) -> Vec<(Vec<u8>, Vec<u8>)> {
        loona_hpack::Decoder::new().decode(block).unwrap()
    }

    fn grpc_headers(authority: &str) -> Vec<(&'static [u8], Vec<u8>)> {
        vec![
            (b":method", b"POST".to_vec()),
            (b":scheme", b"http".to_vec()),
            (b":path", b"/runtime.v1.RuntimeService/Version".to_vec()),
            (b":authority", authority.as_bytes().to_vec()),
            (b"content-type", b"application/grpc".to_vec()),
            (b"te", b"trailers".to_vec()),
        ]
    }

    #[test]
    fn a_socket_path_authority_becomes_localhost_and_the_rest_is_kept() {
        // The client indexes its headers (as grpc-go does), so its second request refers to
        // its dynamic table; both must reach the server decodable and intact.
        let mut enc = loona_hpack::Encoder::new();
        let h = grpc_headers("/run/nodelet/cri.sock");
        let first = enc.encode(h.iter().map(|(n, v)| (&n[..], &v[..])));
        let second = enc.encode(h.iter().map(|(n, v)| (&n[..], &v[..])));
        let settings = frame(0x4, 0, 0, &[]);
        let data = frame(0x0, END_STREAM, 1, &[0, 0, 0, 0, 0]);
        let mut input = PREFACE.to_vec();
        input.extend(&settings);
        // The first block split over HEADERS (padded, with priority) and CONTINUATION.
        let (a, b) = first.split_at(first.len() / 2);
        let mut headers_payload = vec![3u8];
        headers_payload.extend([0, 0, 0, 0, 15]);
        headers_payload.extend(a);
        headers_payload.extend([0, 0, 0]);
        input.extend(frame(HEADERS, PADDED | PRIORITY, 1, &headers_payload));
        input.extend(frame(CONTINUATION, END_HEADERS, 1, b));
        input.extend(&data);
        input.extend(frame(HEADERS, END_HEADERS | END_STREAM, 3, &second));
        for chunk in [1, 5, 4096] {
            let out = frames(&run(&input, chunk));
            assert_eq!(out.len(), 4, "chunk {chunk}: {out:?}");
            assert_eq!((out[0].0, out[0].3.as_slice()), (0x4, &[][..]));
            let (kind, flags, stream, payload) = &out[1];
            assert_eq!((*kind, *stream), (HEADERS, 1));
            assert_eq!(*flags, PRIORITY | END_HEADERS);
            assert_eq!(&payload[..5], &[0, 0, 0, 0, 15]);
            let got = headers(&payload[5..]);
            let want: Vec<(Vec<u8>, Vec<u8>)> = grpc_headers("localhost")
                .into_iter()
                .map(|(n, v)| (n.to_vec(), v))
                .collect();
            assert_eq!(got, want);
            assert_eq!(out[2], (0x0, END_STREAM, 1, vec![0, 0, 0, 0, 0]));
            assert_eq!(
                (out[3].0, out[3].1, out[3].2),
                (HEADERS, END_HEADERS | END_STREAM, 3)
            );
            assert_eq!(
                headers(&out[3].3),
                want,
                "the second request, from the table"
            );
        }
    }

    #[test]
    fn valid_authorities_pass_through_byte_for_byte() {
        let mut enc = loona_hpack::Encoder::new();
        let h = grpc_headers("localhost");
        let block = enc.encode(h.iter().map(|(n, v)| (&n[..], &v[..])));
        let mut input = PREFACE.to_vec();
        input.extend(frame(HEADERS, END_HEADERS, 1, &block));
        input.extend(frame(0x0, END_STREAM, 1, b"hello"));
        assert_eq!(run(&input, 3), input);
        // Not HTTP/2 at all: untouched, for the server to refuse.
        assert_eq!(run(b"GET / HTTP/1.1\r\n\r\n", 2), b"GET / HTTP/1.1\r\n\r\n");
    }

    #[test]
    fn broken_input_is_refused() {
        let mut r = Rewriter::default();
        let mut input = PREFACE.to_vec();
        input.extend(frame(HEADERS, END_HEADERS, 1, &[0xff, 0xff, 0xff, 0xff]));
        assert!(r.feed(&input).is_err());
        let mut r = Rewriter::default();
        let mut input = PREFACE.to_vec();
        input.extend(frame(HEADERS, 0, 1, &[0x82]));
        input.extend(frame(0x0, 0, 1, b"x"));
        assert!(r.feed(&input).is_err(), "a block interrupted by DATA");
        let mut r = Rewriter::default();
        let mut input = PREFACE.to_vec();
        input.extend(frame(HEADERS, PADDED | END_HEADERS, 1, &[9, 0x82]));
        assert!(r.feed(&input).is_err(), "padding longer than the frame");
    }
}
