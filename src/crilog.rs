//! The CRI log format, parsed in this one place: each line of a container's log file is a
//! record `<RFC 3339 time> <stream> <tags> <content>`, the stream `stdout` or `stderr`, the tags
//! `:`-separated with `P` (a part of a line that goes on in the next record) or `F` first. The
//! kubelet API's `/containerLogs`, termination messages from logs and `nodelet run` read logs
//! through it.

use k8s_openapi::jiff::Timestamp;

/// One record of a CRI log file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    /// The time as written (RFC 3339 with nanoseconds).
    pub time: String,
    /// `stdout` or `stderr`.
    pub stream: String,
    /// `P`: a part of a line that goes on in the next record.
    pub partial: bool,
    /// The content, without the record's newline.
    pub content: Vec<u8>,
}

/// Parses one line of a CRI log file (without its newline); `None` when it is not one.
pub fn parse(line: &[u8]) -> Option<Record> {
    let mut parts = line.splitn(4, |b| *b == b' ');
    let time = std::str::from_utf8(parts.next()?).ok()?.to_string();
    let stream = std::str::from_utf8(parts.next()?).ok()?.to_string();
    if stream != "stdout" && stream != "stderr" {
        return None;
    }
    let tag = parts.next()?;
    // Tags are `:`-separated; the first says partial (`P`) or full (`F`).
    let partial = tag.split(|b| *b == b':').next() == Some(b"P");
    let content = parts.next().unwrap_or_default().to_vec();
    Some(Record {
        time,
        stream,
        partial,
        content,
    })
}

impl Record {
    /// The record's time, when it parses (only `sinceTime`/`sinceSeconds` need it).
    pub fn at(&self) -> Option<Timestamp> {
        self.time.parse().ok()
    }
}
