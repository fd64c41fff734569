//! A KubeletConfiguration file (YAML or JSON) through `nodelet::config::parse`, the function
//! `run-node --config` reads its file with: any text gives a configuration or an error, never
//! a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let _ = nodelet::config::parse(text);
});
