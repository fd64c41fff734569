//! SPDY/3.1 as Kubernetes streaming uses it (the framing of `moby/spdystream`): the frames, the
//! zlib-compressed header blocks with the SPDY/3 dictionary, and a [`session`] multiplexer for
//! the server side. Exec and attach ([`remotecommand`]) and port-forward ([`portforward`]) run
//! on top after an HTTP/1.1 `Upgrade: SPDY/3.1`.

pub mod portforward;
pub mod remotecommand;
pub mod session;

use std::io;
use std::sync::OnceLock;

use flate2::{Compress, Compression, Decompress, FlushCompress, FlushDecompress, Status};

/// The `Upgrade` token.
pub const UPGRADE: &str = "SPDY/3.1";
/// The header carrying the subprotocols the client offers and the one the server picked.
pub const PROTOCOL_HEADER: &str = "X-Stream-Protocol-Version";

pub const VERSION: u16 = 3;
/// The last frame of its stream in this direction.
pub const FLAG_FIN: u8 = 0x01;

/// Header names and values, names lowercase.
pub type Headers = Vec<(String, String)>;

/// One SPDY frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Frame {
    SynStream {
        id: u32,
        associated: u32,
        priority: u8,
        flags: u8,
        headers: Headers,
    },
    SynReply {
        id: u32,
        flags: u8,
        headers: Headers,
    },
    RstStream {
        id: u32,
        status: u32,
    },
    Settings {
        flags: u8,
        /// (flags, id, value)
        entries: Vec<(u8, u32, u32)>,
    },
    Ping {
        id: u32,
    },
    GoAway {
        last_good: u32,
        status: u32,
    },
    Headers {
        id: u32,
        flags: u8,
        headers: Headers,
    },
    WindowUpdate {
        id: u32,
        delta: u32,
    },
    Data {
        id: u32,
        flags: u8,
        data: Vec<u8>,
    },
    /// A control frame of a type this code does not know (skipped).
    Unknown {
        kind: u16,
    },
}

/// The value of header `name` (case-insensitive).
pub fn header<'a>(headers: &'a Headers, name: &str) -> Option<&'a str> {
    headers
        .iter()
        .find(|(k, _)| k.eq_ignore_ascii_case(name))
        .map(|(_, v)| v.as_str())
}

/// Frames to and from bytes, with the header compression state of one direction each way (a
/// SPDY connection has one zlib stream per direction, spanning all its header blocks).
pub struct Codec {
    deflate: Compress,
    inflate: Decompress,
}

impl Default for Codec {
    fn default() -> Self {
        Self::new()
    }
}

/// Longest decompressed header block accepted.
const MAX_HEADER_BLOCK: usize = 1 << 20;

fn bad(msg: impl Into<String>) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg.into())
}

fn u32_at(b: &[u8], at: usize) -> io::Result<u32> {
    b.get(at..at + 4)
        .map(|s| u32::from_be_bytes([s[0], s[1], s[2], s[3]]))
        .ok_or_else(|| bad("truncated frame"))
}

impl Codec {
    pub fn new() -> Codec {
        let mut deflate = Compress::new(Compression::default(), true);
        // Setting a dictionary on a fresh stream cannot fail.
        let _ = deflate.set_dictionary(dictionary());
        Codec {
            deflate,
            inflate: Decompress::new(true),
        }
    }

    /// Appends the encoding of `frame` to `out`.
    pub fn encode(&mut self, frame: &Frame, out: &mut Vec<u8>) -> io::Result<()> {
        let mut body = Vec::new();
        let (kind, flags) = match frame {
            Frame::Data { id, flags, data } => {
                out.extend_from_slice(&(id & 0x7fff_ffff).to_be_bytes());
                push_len(out, *flags, data.len())?;
                out.extend_from_slice(data);
                return Ok(());
            }
            Frame::SynStream {
                id,
                associated,
                priority,
                flags,
                headers,
            } => {
                body.extend_from_slice(&(id & 0x7fff_ffff).to_be_bytes());
                body.extend_from_slice(&(associated & 0x7fff_ffff).to_be_bytes());
                body.push((priority & 0x7) << 5);
                body.push(0);
                self.compress(headers, &mut body)?;
                (1u16, *flags)
            }
            Frame::SynReply { id, flags, headers } => {
                body.extend_from_slice(&(id & 0x7fff_ffff).to_be_bytes());
                self.compress(headers, &mut body)?;
                (2, *flags)
            }
            Frame::RstStream { id, status } => {
                body.extend_from_slice(&(id & 0x7fff_ffff).to_be_bytes());
                body.extend_from_slice(&status.to_be_bytes());
                (3, 0)
            }
            Frame::Settings { flags, entries } => {
                let n = u32::try_from(entries.len()).map_err(|_| bad("too many settings"))?;
                body.extend_from_slice(&n.to_be_bytes());
                for (f, id, value) in entries {
                    body.push(*f);
                    body.extend_from_slice(&id.to_be_bytes()[1..]);
                    body.extend_from_slice(&value.to_be_bytes());
                }
                (4, *flags)
            }
            Frame::Ping { id } => {
                body.extend_from_slice(&id.to_be_bytes());
                (6, 0)
            }
            Frame::GoAway { last_good, status } => {
                body.extend_from_slice(&(last_good & 0x7fff_ffff).to_be_bytes());
                body.extend_from_slice(&status.to_be_bytes());
                (7, 0)
            }
            Frame::Headers { id, flags, headers } => {
                body.extend_from_slice(&(id & 0x7fff_ffff).to_be_bytes());
                self.compress(headers, &mut body)?;
                (8, *flags)
            }
            Frame::WindowUpdate { id, delta } => {
                body.extend_from_slice(&(id & 0x7fff_ffff).to_be_bytes());
                body.extend_from_slice(&(delta & 0x7fff_ffff).to_be_bytes());
                (9, 0)
            }
            Frame::Unknown { kind } => (*kind, 0),
        };
        out.extend_from_slice(&(0x8000 | VERSION).to_be_bytes());
        out.extend_from_slice(&kind.to_be_bytes());
        push_len(out, flags, body.len())?;
        out.extend_from_slice(&body);
        Ok(())
    }

    /// Decodes the frame at the front of `buf`: the frame and how many bytes it took, or
    /// `None` when `buf` does not hold a whole frame yet.
    pub fn decode(&mut self, buf: &[u8]) -> io::Result<Option<(Frame, usize)>> {
        if buf.len() < 8 {
            return Ok(None);
        }
        let flags = buf[4];
        let len = usize::from(buf[5]) << 16 | usize::from(buf[6]) << 8 | usize::from(buf[7]);
        let Some(body) = buf.get(8..8 + len) else {
            return Ok(None);
        };
        let total = 8 + len;
        if buf[0] & 0x80 == 0 {
            let id = u32_at(buf, 0)? & 0x7fff_ffff;
            let data = body.to_vec();
            return Ok(Some((Frame::Data { id, flags, data }, total)));
        }
        let version = u16::from_be_bytes([buf[0], buf[1]]) & 0x7fff;
        if version != VERSION {
            return Err(bad(format!("SPDY version {version} is not supported")));
        }
        let kind = u16::from_be_bytes([buf[2], buf[3]]);
        let id = || u32_at(body, 0).map(|v| v & 0x7fff_ffff);
        let frame = match kind {
            1 => {
                if body.len() < 10 {
                    return Err(bad("short SYN_STREAM"));
                }
                Frame::SynStream {
                    id: id()?,
                    associated: u32_at(body, 4)? & 0x7fff_ffff,
                    priority: body[8] >> 5,
                    flags,
                    headers: self.decompress(&body[10..])?,
                }
            }
            2 => Frame::SynReply {
                id: id()?,
                flags,
                headers: self.decompress(body.get(4..).unwrap_or_default())?,
            },
            3 => Frame::RstStream {
                id: id()?,
                status: u32_at(body, 4)?,
            },
            4 => {
                let n = u32_at(body, 0)? as usize;
                let mut entries = Vec::new();
                for i in 0..n {
                    let at = 4 + i * 8;
                    let e = body.get(at..at + 8).ok_or_else(|| bad("short SETTINGS"))?;
                    let id = u32::from_be_bytes([0, e[1], e[2], e[3]]);
                    entries.push((e[0], id, u32_at(e, 4)?));
                }
                Frame::Settings { flags, entries }
            }
            6 => Frame::Ping {
                id: u32_at(body, 0)?,
            },
            7 => Frame::GoAway {
                last_good: id()?,
                status: u32_at(body, 4).unwrap_or(0),
            },
            8 => Frame::Headers {
                id: id()?,
                flags,
                headers: self.decompress(body.get(4..).unwrap_or_default())?,
            },
            9 => Frame::WindowUpdate {
                id: id()?,
                delta: u32_at(body, 4)? & 0x7fff_ffff,
            },
            kind => Frame::Unknown { kind },
        };
        Ok(Some((frame, total)))
    }

    fn compress(&mut self, headers: &Headers, out: &mut Vec<u8>) -> io::Result<()> {
        let mut block = Vec::new();
        let n = u32::try_from(headers.len()).map_err(|_| bad("too many headers"))?;
        block.extend_from_slice(&n.to_be_bytes());
        for (k, v) in headers {
            for s in [k.to_ascii_lowercase().as_bytes(), v.as_bytes()] {
                let len = u32::try_from(s.len()).map_err(|_| bad("header too long"))?;
                block.extend_from_slice(&len.to_be_bytes());
                block.extend_from_slice(s);
            }
        }
        let mut input = &block[..];
        loop {
            out.reserve(input.len() + 64);
            let before = self.deflate.total_in();
            self.deflate
                .compress_vec(input, out, FlushCompress::Sync)
                .map_err(|e| bad(format!("compressing headers: {e}")))?;
            let used = usize::try_from(self.deflate.total_in() - before).unwrap_or(input.len());
            input = &input[used..];
            // Done once all input is in and the flush left room to spare.
            if input.is_empty() && out.len() < out.capacity() {
                return Ok(());
            }
        }
    }

    fn decompress(&mut self, mut input: &[u8]) -> io::Result<Headers> {
        let mut block: Vec<u8> = Vec::with_capacity(input.len() * 4 + 256);
        loop {
            if block.capacity() - block.len() < 256 {
                block.reserve(block.capacity().max(1024));
            }
            let before = self.inflate.total_in();
            let produced = block.len();
            let result = self
                .inflate
                .decompress_vec(input, &mut block, FlushDecompress::Sync);
            let used = usize::try_from(self.inflate.total_in() - before).unwrap_or(input.len());
            input = &input[used..];
            match result {
                Err(e) => {
                    if e.needs_dictionary().is_some() {
                        self.inflate
                            .set_dictionary(dictionary())
                            .map_err(|e| bad(format!("header dictionary: {e}")))?;
                        continue;
                    }
                    return Err(bad(format!("decompressing headers: {e}")));
                }
                // The connection's one compression stream must never end (SPDY clients
                // flush it, never finish it): nothing after its end can be decompressed.
                Ok(Status::StreamEnd) if !input.is_empty() => {
                    return Err(bad("header block after the end of the compression stream"));
                }
                // Room for output and input left, yet nothing moved: stuck, not slow.
                Ok(_) if used == 0 && block.len() == produced && !input.is_empty() => {
                    return Err(bad("header block does not decompress"));
                }
                Ok(_) => {}
            }
            if block.len() > MAX_HEADER_BLOCK {
                return Err(bad("header block too large"));
            }
            if input.is_empty() && block.len() < block.capacity() {
                break;
            }
        }
        parse_block(&block)
    }
}

fn push_len(out: &mut Vec<u8>, flags: u8, len: usize) -> io::Result<()> {
    if len >= 1 << 24 {
        return Err(bad("frame too long"));
    }
    out.push(flags);
    out.extend_from_slice(&(len as u32).to_be_bytes()[1..]);
    Ok(())
}

/// A decompressed header block: a count, then length-prefixed names and values (a value may
/// hold several, NUL-separated; each becomes its own pair).
fn parse_block(b: &[u8]) -> io::Result<Headers> {
    let n = u32_at(b, 0)? as usize;
    let mut at = 4;
    let take = |at: &mut usize| -> io::Result<String> {
        let len = u32_at(b, *at)? as usize;
        let s = b
            .get(*at + 4..*at + 4 + len)
            .ok_or_else(|| bad("truncated header block"))?;
        *at += 4 + len;
        Ok(String::from_utf8_lossy(s).into_owned())
    };
    let mut headers = Vec::new();
    for _ in 0..n {
        let k = take(&mut at)?.to_ascii_lowercase();
        let v = take(&mut at)?;
        for v in v.split('\0') {
            headers.push((k.clone(), v.to_string()));
        }
    }
    Ok(headers)
}

/// The SPDY/3 header compression dictionary (1423 bytes, Adler-32 0xe3c6a7c2).
pub fn dictionary() -> &'static [u8] {
    static DICT: OnceLock<Vec<u8>> = OnceLock::new();
    DICT.get_or_init(|| {
        let mut d = Vec::with_capacity(1423);
        for w in WORDS {
            d.extend_from_slice(&(w.len() as u32).to_be_bytes());
            d.extend_from_slice(w.as_bytes());
        }
        d.extend_from_slice(TAIL.as_bytes());
        d
    })
}

/// The words of the SPDY/3 header compression dictionary: each is written with its length as a
/// big-endian u32 in front.
const WORDS: &[&str] = &[
    "options",
    "head",
    "post",
    "put",
    "delete",
    "trace",
    "accept",
    "accept-charset",
    "accept-encoding",
    "accept-language",
    "accept-ranges",
    "age",
    "allow",
    "authorization",
    "cache-control",
    "connection",
    "content-base",
    "content-encoding",
    "content-language",
    "content-length",
    "content-location",
    "content-md5",
    "content-range",
    "content-type",
    "date",
    "etag",
    "expect",
    "expires",
    "from",
    "host",
    "if-match",
    "if-modified-since",
    "if-none-match",
    "if-range",
    "if-unmodified-since",
    "last-modified",
    "location",
    "max-forwards",
    "pragma",
    "proxy-authenticate",
    "proxy-authorization",
    "range",
    "referer",
    "retry-after",
    "server",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "user-agent",
    "vary",
    "via",
    "warning",
    "www-authenticate",
    "method",
    "get",
    "status",
    "200 OK",
    "version",
    "HTTP/1.1",
    "url",
    "public",
    "set-cookie",
    "keep-alive",
    "origin",
];

/// The rest of the dictionary, as it is.
const TAIL: &str = concat!(
    "10010120120220520630030230330430530630740240540640740840941041141241341441541641",
    "7502504505203 Non-Authoritative Information204 No Content301 Moved Permanently40",
    "0 Bad Request401 Unauthorized403 Forbidden404 Not Found500 Internal Server Error",
    "501 Not Implemented503 Service UnavailableJan Feb Mar Apr May Jun Jul Aug Sept O",
    "ct Nov Dec 00:00:00 Mon, Tue, Wed, Thu, Fri, Sat, Sun, GMTchunked,text/html,imag",
    "e/png,image/jpg,image/gif,application/xml,application/xhtml+xml,text/plain,text/",
    "javascript,publicprivatemax-age=gzip,deflate,sdchcharset=utf-8charset=iso-8859-1",
    ",utf-,*,enq=0.",
);

#[cfg(test)]
mod tests {
    use super::*;

    fn adler32(data: &[u8]) -> u32 {
        let (mut a, mut b) = (1u32, 0u32);
        for &x in data {
            a = (a + u32::from(x)) % 65521;
            b = (b + a) % 65521;
        }
        b << 16 | a
    }

    /// Found by fuzzing (tests/fuzz, spdy_frames): a header block whose zlib stream ends
    /// before the frame does made decompression loop forever, hanging the session's task.
    #[test]
    fn data_after_the_end_of_the_header_stream_is_an_error() {
        let mut frame = vec![0x80, 0x03, 0x00, 0x01, 0x00, 0x00, 0x00, 0x1e];
        frame.extend_from_slice(&[0, 0, 0, 1, 0, 0, 0, 0, 0, 0]);
        // zlib.compress(b"\0\0\0\0"): a finished stream, then trailing bytes.
        frame.extend_from_slice(&[0x78, 0x9c, 0x63, 0x60, 0x60, 0x60, 0x00, 0x00, 0x00, 0x04]);
        frame.extend_from_slice(&[0x00, 0x01]);
        frame.extend_from_slice(b"trailing");
        let err = Codec::new().decode(&frame).unwrap_err();
        assert!(
            err.to_string().contains("end of the compression stream"),
            "{err}"
        );

        // A stream that ended exactly with its block decodes; the next block cannot.
        let mut codec = Codec::new();
        let mut ended = vec![0x80, 0x03, 0x00, 0x01, 0x00, 0x00, 0x00, 0x16];
        ended.extend_from_slice(&[0, 0, 0, 1, 0, 0, 0, 0, 0, 0]);
        ended.extend_from_slice(&[0x78, 0x9c, 0x63, 0x60, 0x60, 0x60, 0x00, 0x00, 0x00, 0x04]);
        ended.extend_from_slice(&[0x00, 0x01]);
        assert!(matches!(
            codec.decode(&ended),
            Ok(Some((Frame::SynStream { id: 1, .. }, 30)))
        ));
        let mut next = ended.clone();
        next[11] = 3;
        assert!(codec.decode(&next).is_err());
    }

    #[test]
    fn the_dictionary_is_the_spdy3_one() {
        let d = dictionary();
        assert_eq!(d.len(), 1423);
        assert_eq!(adler32(d), 0xe3c6_a7c2);
        assert!(d.starts_with(b"\0\0\0\x07options\0\0\0\x04head"));
        assert!(d.ends_with(b",*,enq=0."));
    }

    fn headers(pairs: &[(&str, &str)]) -> Headers {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn frames_round_trip_through_one_compression_context() {
        let mut client = Codec::new();
        let mut server = Codec::new();
        let frames = vec![
            Frame::SynStream {
                id: 1,
                associated: 0,
                priority: 0,
                flags: 0,
                headers: headers(&[("streamtype", "error")]),
            },
            Frame::SynStream {
                id: 3,
                associated: 0,
                priority: 0,
                flags: FLAG_FIN,
                headers: headers(&[("streamtype", "stdout"), ("port", "80")]),
            },
            Frame::Data {
                id: 3,
                flags: 0,
                data: b"hello".to_vec(),
            },
            Frame::Data {
                id: 3,
                flags: FLAG_FIN,
                data: Vec::new(),
            },
            Frame::Ping { id: 7 },
            Frame::WindowUpdate { id: 3, delta: 4096 },
            Frame::RstStream { id: 5, status: 5 },
            Frame::Settings {
                flags: 0,
                entries: vec![(0, 7, 65536)],
            },
            Frame::GoAway {
                last_good: 3,
                status: 0,
            },
        ];
        let mut wire = Vec::new();
        for f in &frames {
            client.encode(f, &mut wire).unwrap();
        }
        // Fed a byte at a time, a frame is only decoded once whole.
        let mut decoded = Vec::new();
        let mut buf = Vec::new();
        for b in wire {
            buf.push(b);
            if let Some((f, used)) = server.decode(&buf).unwrap() {
                assert_eq!(used, buf.len());
                decoded.push(f);
                buf.clear();
            }
        }
        assert_eq!(decoded, frames);
    }

    #[test]
    fn data_frame_layout() {
        let mut c = Codec::new();
        let mut out = Vec::new();
        c.encode(
            &Frame::Data {
                id: 5,
                flags: FLAG_FIN,
                data: b"ab".to_vec(),
            },
            &mut out,
        )
        .unwrap();
        assert_eq!(out, [0, 0, 0, 5, 1, 0, 0, 2, b'a', b'b']);
        let mut out = Vec::new();
        c.encode(&Frame::Ping { id: 1 }, &mut out).unwrap();
        assert_eq!(out, [0x80, 3, 0, 6, 0, 0, 0, 4, 0, 0, 0, 1]);
    }

    /// Two header blocks compressed by C zlib (Python's `zlib.compressobj(zdict=...)` with a
    /// sync flush each), as spdystream's Go zlib writes them: one stream across both blocks.
    #[test]
    fn decodes_header_blocks_compressed_by_c_zlib() {
        const A: &[u8] = &[
            120, 187, 227, 198, 167, 194, 2, 37, 58, 112, 58, 43, 41, 74, 77, 204, 133, 22, 37,
            172, 169, 160, 128, 134, 20, 203, 69, 224, 28, 96, 97, 96, 97, 0, 164, 57, 139, 32,
            209, 152, 9, 74, 222, 140, 6, 0, 0, 0, 0, 255, 255,
        ];
        const B: &[u8] = &[194, 170, 25, 84, 14, 37, 18, 214, 11, 0, 0, 0, 255, 255];
        let syn = |id: u8, block: &[u8]| {
            let mut f = vec![0x80, 3, 0, 1, 0, 0, 0, (10 + block.len()) as u8];
            f.extend_from_slice(&[0, 0, 0, id, 0, 0, 0, 0, 0, 0]);
            f.extend_from_slice(block);
            f
        };
        let mut c = Codec::new();
        let (a, _) = c.decode(&syn(1, A)).unwrap().unwrap();
        let (b, _) = c.decode(&syn(3, B)).unwrap().unwrap();
        let want = |id, kind| Frame::SynStream {
            id,
            associated: 0,
            priority: 0,
            flags: 0,
            headers: headers(&[("streamtype", kind), ("port", "8080"), ("requestid", "0")]),
        };
        assert_eq!(a, want(1, "error"));
        assert_eq!(b, want(3, "data"));
    }

    #[test]
    fn header_values_split_on_nul() {
        let mut block = Vec::new();
        block.extend_from_slice(&1u32.to_be_bytes());
        block.extend_from_slice(&4u32.to_be_bytes());
        block.extend_from_slice(b"Port");
        block.extend_from_slice(&5u32.to_be_bytes());
        block.extend_from_slice(b"80\x0090");
        assert_eq!(
            parse_block(&block).unwrap(),
            headers(&[("port", "80"), ("port", "90")])
        );
        assert!(parse_block(&block[..10]).is_err());
    }
}
