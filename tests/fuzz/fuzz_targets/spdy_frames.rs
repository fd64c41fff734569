//! SPDY/3.1 frames as the streaming server reads them (runtime/streaming/src/spdy), from
//! arbitrary bytes: control and data frames, and header blocks in one zlib stream with the
//! SPDY/3 dictionary across frames. Checked: decoding never panics, hangs or allocates
//! without bound; every frame it returns encodes again and decodes (by a fresh pair of
//! codecs) to the same frame.
#![no_main]

use libfuzzer_sys::fuzz_target;
use runtime::streaming::spdy::Codec;

fuzz_target!(|data: &[u8]| {
    let mut codec = Codec::new();
    let mut writer = Codec::new();
    let mut reader = Codec::new();
    let mut buf = data;
    while let Ok(Some((frame, used))) = codec.decode(buf) {
        assert!(
            used > 0 && used <= buf.len(),
            "decode took {used} of {} bytes",
            buf.len()
        );
        buf = &buf[used..];
        let mut encoded = Vec::new();
        writer
            .encode(&frame, &mut encoded)
            .expect("a decoded frame encodes");
        match reader.decode(&encoded) {
            Ok(Some((again, n))) => {
                assert_eq!(n, encoded.len(), "a frame encoded to more than one");
                assert_eq!(again, frame, "a frame changed through encoding");
            }
            other => panic!("an encoded frame does not decode: {other:?}"),
        }
    }
});
