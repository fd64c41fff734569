//! The CRI server's HTTP/2 `:authority` rewriter (runtime/src/server/authority.rs) on
//! arbitrary client bytes. Checked: it never panics; feeding the bytes at once or in chunks
//! gives the same outcome and output; and what it passes on to the HTTP/2 server is a frame
//! stream whose header blocks an HPACK decoder (the server's) decodes, with no invalid
//! `:authority` left.
#![no_main]

use libfuzzer_sys::fuzz_target;
use runtime::server::fuzzing::{AuthorityRewriter, Broken};

const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
const HEADERS: u8 = 0x1;
const CONTINUATION: u8 = 0x9;
const END_HEADERS: u8 = 0x4;
const PADDED: u8 = 0x8;
const PRIORITY: u8 = 0x20;

fn run(data: &[u8], chunk: usize) -> (Result<(), Broken>, Vec<u8>) {
    let mut r = AuthorityRewriter::default();
    let mut out = Vec::new();
    for piece in data.chunks(chunk) {
        let fed = r.feed(piece);
        out.extend(r.take_output());
        if let Err(e) = fed {
            return (Err(e), out);
        }
    }
    (Ok(()), out)
}

/// Decodes every header block of the rewriter's output as the server would.
fn check_output(out: &[u8]) {
    let Some(mut rest) = out.strip_prefix(PREFACE) else {
        return;
    };
    let mut decoder = loona_hpack::Decoder::new();
    decoder.set_max_allowed_table_size(64 * 1024);
    let mut block: Option<Vec<u8>> = None;
    while rest.len() >= 9 {
        let len = (usize::from(rest[0]) << 16) | (usize::from(rest[1]) << 8) | usize::from(rest[2]);
        let (kind, flags) = (rest[3], rest[4]);
        let Some(payload) = rest.get(9..9 + len) else {
            panic!("the rewriter passed on a partial frame");
        };
        rest = &rest[9 + len..];
        let fragment = match (kind, block.is_some()) {
            (HEADERS, false) => {
                let mut body = payload;
                let mut pad = 0;
                if flags & PADDED != 0 {
                    pad = usize::from(body[0]);
                    body = &body[1..];
                }
                if flags & PRIORITY != 0 {
                    body = &body[5..];
                }
                block = Some(Vec::new());
                &body[..body.len() - pad]
            }
            (CONTINUATION, true) => payload,
            (_, true) => panic!("the rewriter passed on an interrupted header block"),
            (_, false) => continue,
        };
        let Some(b) = block.as_mut() else { continue };
        b.extend_from_slice(fragment);
        if flags & END_HEADERS != 0 {
            let b = block.take().unwrap_or_default();
            let headers = decoder
                .decode(&b)
                .expect("the server cannot decode a header block the rewriter passed on");
            for (name, value) in headers {
                if name == b":authority" {
                    assert!(
                        http::uri::Authority::try_from(value.as_slice()).is_ok(),
                        "an invalid :authority was passed on: {value:?}"
                    );
                }
            }
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&first, data)) = data.split_first() else {
        return;
    };
    let (whole, out_whole) = run(data, data.len().max(1));
    let (chunked, out_chunked) = run(data, usize::from(first % 32) + 1);
    assert_eq!(
        whole.is_ok(),
        chunked.is_ok(),
        "chunking changed the outcome: {whole:?} / {chunked:?}"
    );
    if whole.is_ok() {
        assert_eq!(out_whole, out_chunked, "chunking changed the output");
        check_output(&out_whole);
    }
});
