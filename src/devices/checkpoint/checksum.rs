//! Upstream's checkpoint checksum, so that a checkpoint written by the upstream kubelet is
//! read here and one written here is read there: FNV-32a over the text Go's `spew` package
//! prints for the checkpoint's data with `%#v` (sorted keys, no methods), the data as Go holds
//! it after decoding the file's JSON. That text is written here from the JSON value, following
//! Go's decoding: `null` (or a missing member) is a nil slice or map (`<nil>`), `[]` and `{}`
//! are empty ones, a missing string is empty, `AllocResp` is base64 for bytes printed as
//! decimal numbers, `DeviceIDs` keys are NUMA node numbers sorted as numbers, other map keys
//! sorted as bytes.

use base64::Engine;
use serde_json::Value;

/// The checksum of the checkpoint's `Data` member, or `None` when Go could not decode it.
pub fn checksum(data: &Value) -> Option<u64> {
    spew(data).map(|text| u64::from(fnv32a(text.as_bytes())))
}

fn fnv32a(bytes: &[u8]) -> u32 {
    let mut h: u32 = 0x811c_9dc5;
    for b in bytes {
        h ^= u32::from(*b);
        h = h.wrapping_mul(0x0100_0193);
    }
    h
}

/// What `spew.Sprintf("%#v", data)` prints for the checkpoint's data.
fn spew(data: &Value) -> Option<String> {
    let mut s =
        String::from("(checkpoint.checkpointData){PodDeviceEntries:([]checkpoint.PodDevicesEntry)");
    match data.get("PodDeviceEntries") {
        None | Some(Value::Null) => s.push_str("<nil>"),
        Some(Value::Array(entries)) => {
            let parts: Option<Vec<String>> = entries.iter().map(entry).collect();
            s.push_str(&format!("[{}]", parts?.join(" ")));
        }
        Some(_) => return None,
    }
    s.push_str(" RegisteredDevices:(map[string][]string)");
    match data.get("RegisteredDevices") {
        None | Some(Value::Null) => s.push_str("<nil>"),
        Some(Value::Object(m)) => {
            let mut keys: Vec<&String> = m.keys().collect();
            keys.sort();
            let parts: Option<Vec<String>> = keys
                .into_iter()
                .map(|k| Some(format!("{k}:{}", strings(&m[k])?)))
                .collect();
            s.push_str(&format!("map[{}]", parts?.join(" ")));
        }
        Some(_) => return None,
    }
    s.push('}');
    Some(s)
}

/// A `[]string`: `[a b]`, `[]`, or `<nil>`.
fn strings(v: &Value) -> Option<String> {
    match v {
        Value::Null => Some("<nil>".into()),
        Value::Array(items) => {
            let parts: Option<Vec<&str>> = items.iter().map(Value::as_str).collect();
            Some(format!("[{}]", parts?.join(" ")))
        }
        _ => None,
    }
}

/// One `PodDevicesEntry`.
fn entry(e: &Value) -> Option<String> {
    let text = |k: &str| match e.get(k) {
        None | Some(Value::Null) => Some(String::new()),
        Some(Value::String(s)) => Some(s.clone()),
        Some(_) => None,
    };
    let numa = match e.get("DeviceIDs") {
        None | Some(Value::Null) => "<nil>".to_string(),
        Some(Value::Object(m)) => {
            let mut keyed: Vec<(i64, &Value)> = m
                .iter()
                .map(|(k, v)| k.parse::<i64>().ok().map(|n| (n, v)))
                .collect::<Option<_>>()?;
            keyed.sort_by_key(|(n, _)| *n);
            let parts: Option<Vec<String>> = keyed
                .into_iter()
                .map(|(n, v)| Some(format!("{n}:{}", strings(v)?)))
                .collect();
            format!("map[{}]", parts?.join(" "))
        }
        Some(_) => return None,
    };
    let bytes = match e.get("AllocResp") {
        None | Some(Value::Null) => "<nil>".to_string(),
        Some(Value::String(b)) => {
            let raw = base64::engine::general_purpose::STANDARD
                .decode(b.as_bytes())
                .ok()?;
            let nums: Vec<String> = raw.iter().map(u8::to_string).collect();
            format!("[{}]", nums.join(" "))
        }
        Some(_) => return None,
    };
    Some(format!(
        "{{PodUID:(string){} ContainerName:(string){} ResourceName:(string){} DeviceIDs:(checkpoint.DevicesPerNUMA){numa} AllocResp:([]uint8){bytes}}}",
        text("PodUID")?,
        text("ContainerName")?,
        text("ResourceName")?,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The checksums the upstream kubelet computes for these data (measured with Go's spew
    /// 1.1.1, as upstream vendors it, and its `hash/fnv`).
    #[test]
    fn upstreams_checksums() {
        let cases = [
            (
                r#"{"PodDeviceEntries":[{"PodUID":"uid-1","ContainerName":"main","ResourceName":"example.com/dev","DeviceIDs":{"-1":["a","b"]},"AllocResp":"CgMIAf8="}],"RegisteredDevices":{"example.com/dev":["a","b","c"]}}"#,
                3_188_866_903,
            ),
            (
                r#"{"PodDeviceEntries":null,"RegisteredDevices":{}}"#,
                3_467_439_661,
            ),
            (
                r#"{"PodDeviceEntries":[{"PodUID":"u","ContainerName":"c","ResourceName":"r","DeviceIDs":{"0":["x"],"-1":["z"],"10":["y"],"2":[]},"AllocResp":""}],"RegisteredDevices":{"r":null,"b":["x","y"]}}"#,
                2_694_248_870,
            ),
        ];
        for (json, want) in cases {
            let v: Value = serde_json::from_str(json).unwrap();
            assert_eq!(checksum(&v), Some(want), "{json}");
        }
        let bad: Value =
            serde_json::from_str(r#"{"PodDeviceEntries":[{"DeviceIDs":{"x":[]}}]}"#).unwrap();
        assert_eq!(checksum(&bad), None);
    }
}
