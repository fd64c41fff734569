//! Container logs as `kubectl logs` gets them (upstream `kuberuntime/logs`): the records of
//! [`crate::crilog`] with `tailLines`, `limitBytes`, `sinceTime`/`sinceSeconds`, `timestamps`
//! and `follow`, partial lines joined.

use std::collections::VecDeque;
use std::io::{BufRead, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::time::Duration;

use k8s_openapi::jiff::Timestamp;

pub use crate::crilog::{Record, parse};

/// What the caller asked for.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Options {
    pub tail_lines: Option<u64>,
    pub limit_bytes: Option<u64>,
    pub since: Option<Timestamp>,
    pub timestamps: bool,
}

impl Options {
    /// From the query (`tailLines`, `limitBytes`, `sinceSeconds`, `sinceTime`, `timestamps`),
    /// refusing invalid values with a message.
    pub fn from_query(
        q: &std::collections::HashMap<String, String>,
        now: Timestamp,
    ) -> Result<Options, String> {
        let num = |k: &str| -> Result<Option<u64>, String> {
            q.get(k)
                .map(|v| {
                    v.parse::<i64>()
                        .ok()
                        .and_then(|n| u64::try_from(n).ok())
                        .ok_or_else(|| format!("{k}: {v:?} must be a non-negative integer"))
                })
                .transpose()
        };
        let flag = |k: &str| q.get(k).is_some_and(|v| v == "true" || v == "1");
        let mut since = None;
        if let Some(s) = num("sinceSeconds")? {
            if s == 0 {
                return Err("sinceSeconds: must be greater than 0".into());
            }
            let secs = i64::try_from(s).unwrap_or(i64::MAX);
            since = now
                .checked_sub(k8s_openapi::jiff::SignedDuration::from_secs(secs))
                .ok();
        }
        if let Some(t) = q.get("sinceTime") {
            if since.is_some() {
                return Err("at most one of sinceTime or sinceSeconds may be specified".into());
            }
            since = Some(
                t.parse()
                    .map_err(|e| format!("sinceTime: {t:?} is not an RFC 3339 time: {e}"))?,
            );
        }
        let limit = num("limitBytes")?;
        if limit == Some(0) {
            return Err("limitBytes: must be greater than 0".into());
        }
        Ok(Options {
            tail_lines: num("tailLines")?,
            limit_bytes: limit,
            since,
            timestamps: flag("timestamps"),
        })
    }
}

/// Turns records into output: content with a newline after each full line, the time before
/// each line with `timestamps`, records older than `since` skipped.
#[derive(Debug, Default)]
pub struct Writer {
    opts: Options,
    /// Whether the next content starts a line.
    at_line_start: bool,
    written: u64,
}

impl Writer {
    pub fn new(opts: Options) -> Self {
        Writer {
            opts,
            at_line_start: true,
            written: 0,
        }
    }

    /// Whether `limitBytes` is reached.
    pub fn full(&self) -> bool {
        self.opts.limit_bytes.is_some_and(|l| self.written >= l)
    }

    /// The bytes of `r` to send (cut at `limitBytes`).
    pub fn write(&mut self, r: &Record) -> Vec<u8> {
        if let (Some(since), Some(at)) = (self.opts.since, r.at()) {
            if at < since {
                return Vec::new();
            }
        }
        let mut out = Vec::new();
        if self.opts.timestamps && self.at_line_start {
            out.extend_from_slice(r.time.as_bytes());
            out.push(b' ');
        }
        out.extend_from_slice(&r.content);
        if !r.partial {
            out.push(b'\n');
        }
        self.at_line_start = !r.partial;
        if let Some(limit) = self.opts.limit_bytes {
            let left = limit.saturating_sub(self.written);
            out.truncate(usize::try_from(left).unwrap_or(usize::MAX));
        }
        self.written += out.len() as u64;
        out
    }
}

/// Reads the records of `path` from `offset`; returns them and the offset after the last
/// complete line.
pub fn read_from(path: &Path, offset: u64) -> std::io::Result<(Vec<Record>, u64)> {
    let mut f = std::fs::File::open(path)?;
    read_lines(&mut f, offset)
}

/// The records of the complete lines of `f` from `offset`, and the offset after the last.
fn read_lines(f: &mut std::fs::File, offset: u64) -> std::io::Result<(Vec<Record>, u64)> {
    f.seek(SeekFrom::Start(offset))?;
    let mut reader = std::io::BufReader::new(f);
    let mut out = Vec::new();
    let mut pos = offset;
    let mut line = Vec::new();
    loop {
        line.clear();
        let n = reader.read_until(b'\n', &mut line)?;
        if n == 0 || line.last() != Some(&b'\n') {
            break; // the end, or a line still being written
        }
        pos += n as u64;
        line.pop();
        if let Some(r) = parse(&line) {
            out.push(r);
        }
    }
    Ok((out, pos))
}

/// A log followed across rotations: it reads the file it opened, and when the log's path names
/// another file (the kubelet renamed it and the runtime reopened the log) it finishes the old
/// one and goes on with the new one from its start.
pub struct Follower {
    path: PathBuf,
    file: Option<(std::fs::File, u64)>,
    offset: u64,
}

impl Follower {
    /// Follows `path` from `offset` (the end of what was read already).
    pub fn new(path: PathBuf, offset: u64) -> Self {
        Follower {
            path,
            file: None,
            offset,
        }
    }

    /// The records written since the last call (none when the log is not there yet).
    pub fn read_new(&mut self) -> std::io::Result<Vec<Record>> {
        use std::os::unix::fs::MetadataExt;
        if self.file.is_none() {
            match std::fs::File::open(&self.path) {
                Ok(f) => {
                    let ino = f.metadata()?.ino();
                    self.file = Some((f, ino));
                }
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
                Err(e) => return Err(e),
            }
        }
        let Some((f, ino)) = self.file.as_mut() else {
            return Ok(Vec::new());
        };
        let (mut records, next) = read_lines(f, self.offset)?;
        self.offset = next;
        let rotated = std::fs::metadata(&self.path).map_or(true, |m| m.ino() != *ino);
        if rotated {
            // What the old file got before the runtime reopened the log, then the new file.
            let (rest, _) = read_lines(f, self.offset)?;
            records.extend(rest);
            self.file = None;
            self.offset = 0;
            records.extend(self.read_new()?);
        }
        Ok(records)
    }
}

/// The records of the last `n` lines (a line being its partial records and the full one).
pub fn tail(records: Vec<Record>, n: u64) -> Vec<Record> {
    let mut lines: VecDeque<Vec<Record>> = VecDeque::new();
    let mut current: Vec<Record> = Vec::new();
    for r in records {
        let end = !r.partial;
        current.push(r);
        if end {
            lines.push_back(std::mem::take(&mut current));
            if lines.len() as u64 > n {
                lines.pop_front();
            }
        }
    }
    if !current.is_empty() {
        lines.push_back(current);
        if lines.len() as u64 > n {
            lines.pop_front();
        }
    }
    lines.into_iter().flatten().collect()
}

/// How often a followed log is checked for more.
pub const FOLLOW_POLL: Duration = Duration::from_millis(200);

/// A container's log file by the kubelet's layout: `<podLogsDir>/<ns>_<pod>_<uid>/<container>/
/// <attempt>.log`, unless the runtime reports an absolute path.
pub fn log_path(
    reported: &str,
    pod_logs_dir: &Path,
    (ns, name, uid): (&str, &str, &str),
    container: &str,
    attempt: u32,
) -> PathBuf {
    if reported.starts_with('/') {
        return PathBuf::from(reported);
    }
    pod_logs_dir
        .join(format!("{ns}_{name}_{uid}"))
        .join(container)
        .join(format!("{attempt}.log"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(line: &str) -> Record {
        parse(line.as_bytes()).expect("a record")
    }

    #[test]
    fn a_followed_log_goes_on_across_a_rotation() {
        use std::io::Write;
        let dir = tempfile::tempdir().expect("tempdir");
        let log = dir.path().join("0.log");
        let line = |n: u32| format!("2026-12-02T00:00:0{n}Z stdout F line {n}\n");
        let text = |rs: Vec<Record>| -> Vec<String> {
            rs.into_iter()
                .map(|r| String::from_utf8_lossy(&r.content).into_owned())
                .collect()
        };
        let mut w = std::fs::File::create(&log).expect("create");
        w.write_all(line(1).as_bytes()).expect("write");
        let mut f = Follower::new(log.clone(), 0);
        assert_eq!(text(f.read_new().expect("read")), ["line 1"]);
        assert!(f.read_new().expect("read").is_empty());
        // Rotated: renamed, one more line reaches the old file before the runtime reopens
        // the log, then the new file gets its lines.
        std::fs::rename(&log, dir.path().join("0.log.20261202-000000")).expect("rename");
        w.write_all(line(2).as_bytes()).expect("write");
        let mut w = std::fs::File::create(&log).expect("create");
        w.write_all(line(3).as_bytes()).expect("write");
        assert_eq!(text(f.read_new().expect("read")), ["line 2", "line 3"]);
        w.write_all(line(4).as_bytes()).expect("write");
        assert_eq!(text(f.read_new().expect("read")), ["line 4"]);
        // Between the rename and the reopen there is no log: nothing, then the new one.
        std::fs::rename(&log, dir.path().join("0.log.20261202-000001")).expect("rename");
        assert!(f.read_new().expect("read").is_empty());
        let mut w = std::fs::File::create(&log).expect("create");
        w.write_all(line(5).as_bytes()).expect("write");
        assert_eq!(text(f.read_new().expect("read")), ["line 5"]);
    }

    #[test]
    fn records_parse_and_partial_lines_join() {
        let r = rec("2026-12-01T10:00:00.123456789Z stdout F hello world");
        assert_eq!(r.stream, "stdout");
        assert!(!r.partial);
        assert_eq!(r.content, b"hello world");
        assert!(r.at().is_some());
        assert!(parse(b"garbage").is_none());
        assert!(parse(b"2026-12-01T10:00:00Z stdin F x").is_none());
        let empty = rec("2026-12-01T10:00:00Z stderr F");
        assert!(empty.content.is_empty());

        let mut w = Writer::new(Options {
            timestamps: true,
            ..Default::default()
        });
        let mut out = w.write(&rec("2026-12-01T10:00:00Z stdout P abc"));
        out.extend(w.write(&rec("2026-12-01T10:00:01Z stdout F def")));
        out.extend(w.write(&rec("2026-12-01T10:00:02Z stderr F ghi")));
        assert_eq!(
            String::from_utf8(out).expect("utf-8"),
            "2026-12-01T10:00:00Z abcdef\n2026-12-01T10:00:02Z ghi\n"
        );
    }

    #[test]
    fn tail_since_and_limit() {
        let records: Vec<Record> = [
            "2026-12-01T10:00:00Z stdout F one",
            "2026-12-01T10:00:01Z stdout P tw",
            "2026-12-01T10:00:02Z stdout F o",
            "2026-12-01T10:00:03Z stdout F three",
        ]
        .iter()
        .map(|l| rec(l))
        .collect();
        let out = |records: Vec<Record>, opts: Options| {
            let mut w = Writer::new(opts);
            let mut v = Vec::new();
            for r in &records {
                v.extend(w.write(r));
            }
            String::from_utf8(v).expect("utf-8")
        };
        assert_eq!(
            out(tail(records.clone(), 2), Options::default()),
            "two\nthree\n"
        );
        assert_eq!(out(tail(records.clone(), 0), Options::default()), "");
        let since = Options {
            since: "2026-12-01T10:00:02Z".parse().ok(),
            ..Default::default()
        };
        assert_eq!(out(records.clone(), since), "o\nthree\n");
        let limit = Options {
            limit_bytes: Some(6),
            ..Default::default()
        };
        assert_eq!(out(records, limit), "one\ntw");
    }

    #[test]
    fn query_options_are_checked() {
        let now: Timestamp = "2026-12-01T10:00:00Z".parse().expect("time");
        let q = |pairs: &[(&str, &str)]| {
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect::<std::collections::HashMap<_, _>>()
        };
        let o = Options::from_query(&q(&[("tailLines", "5"), ("sinceSeconds", "60")]), now)
            .expect("options");
        assert_eq!(o.tail_lines, Some(5));
        assert_eq!(o.since, "2026-12-01T09:59:00Z".parse().ok());
        assert!(Options::from_query(&q(&[("tailLines", "-1")]), now).is_err());
        assert!(Options::from_query(&q(&[("limitBytes", "0")]), now).is_err());
        assert!(
            Options::from_query(&q(&[("sinceSeconds", "5"), ("sinceTime", "x")]), now).is_err()
        );
    }
}
