//! Container logs as `kubectl logs` gets them (upstream `kuberuntime/logs` and the kubelet
//! server's `getContainerLogs`): `/containerLogs/{ns}/{pod}/{container}` answers with the
//! records of [`crate::crilog`] with `tailLines`, `limitBytes`, `sinceTime`/`sinceSeconds`,
//! `timestamps`, `previous` and `follow`, partial lines joined.

use std::collections::{HashMap, VecDeque};
use std::io::{BufRead, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::{Path as UrlPath, Query, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use k8s_openapi::jiff::Timestamp;
use runtime::{RuntimeService, cri};
use tokio::sync::mpsc;

use super::{Ctx, find_pod, instances_of, text};

pub use crate::crilog::{Record, parse};

/// A query value a log request may not have; answered 400 with the message.
#[derive(Debug, thiserror::Error)]
pub enum QueryError {
    #[error("{key}: {value:?} must be a non-negative integer")]
    NotANumber { key: &'static str, value: String },
    #[error("sinceSeconds: must be greater than 0")]
    SinceSecondsZero,
    #[error("at most one of sinceTime or sinceSeconds may be specified")]
    BothSinces,
    #[error("sinceTime: {value:?} is not an RFC 3339 time: {source}")]
    SinceTime {
        value: String,
        #[source]
        source: k8s_openapi::jiff::Error,
    },
    #[error("limitBytes: must be greater than 0")]
    LimitBytesZero,
}

/// Why a log request gets no log; the message is the answer's body.
#[derive(Debug, thiserror::Error)]
pub enum LogError {
    #[error(transparent)]
    Query(#[from] QueryError),
    #[error("pod \"{ns}/{name}\" does not exist")]
    NoPod { ns: String, name: String },
    #[error("container \"{container}\" not found in pod \"{ns}/{name}\"")]
    NoContainer {
        ns: String,
        name: String,
        container: String,
    },
    #[error("previous terminated container \"{container}\" in pod \"{name}\" not found")]
    NoPrevious { name: String, container: String },
    #[error("container \"{container}\" in pod \"{name}\" is waiting to start: ContainerCreating")]
    Waiting { name: String, container: String },
    /// The runtime could not list the container's instances.
    #[error(transparent)]
    Runtime(#[from] runtime::Error),
    #[error("reading {}: {source}", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The blocking read's task failed.
    #[error(transparent)]
    Task(#[from] tokio::task::JoinError),
}

impl LogError {
    /// The answer's status, as upstream's.
    fn status(&self) -> StatusCode {
        match self {
            LogError::Query(_) | LogError::NoPrevious { .. } | LogError::Waiting { .. } => {
                StatusCode::BAD_REQUEST
            }
            LogError::NoPod { .. } | LogError::NoContainer { .. } => StatusCode::NOT_FOUND,
            LogError::Runtime(_) | LogError::Read { .. } | LogError::Task(_) => {
                StatusCode::INTERNAL_SERVER_ERROR
            }
        }
    }
}

/// `/containerLogs/{ns}/{pod}/{container}`.
pub(super) async fn container_logs_handler(
    State(ctx): State<Arc<Ctx>>,
    UrlPath((ns, name, container)): UrlPath<(String, String, String)>,
    Query(q): Query<HashMap<String, String>>,
) -> Response {
    match container_logs(&ctx, (&ns, &name, &container), &q).await {
        Ok(r) => r,
        Err(e) => text(e.status(), e.to_string()),
    }
}

/// The log of the container `(ns, pod, container)` as the query asks: what is there, then
/// with `follow` (and the container running) what it writes next.
async fn container_logs(
    ctx: &Ctx,
    (ns, name, container): (&str, &str, &str),
    q: &HashMap<String, String>,
) -> Result<Response, LogError> {
    let opts = Options::from_query(q, Timestamp::now())?;
    let flag = |k: &str| q.get(k).is_some_and(|v| v == "true" || v == "1");
    let (follow, previous) = (flag("follow"), flag("previous"));
    let uid = pod_uid(ctx, ns, name, container)?;
    let chosen = instance(ctx.deps.rt.as_ref(), &uid, name, container, previous).await?;
    let attempt = chosen.metadata.as_ref().map_or(0, |m| m.attempt);
    let path = log_path(
        &chosen.log_path,
        &ctx.deps.pod_logs_dir,
        (ns, name, &uid),
        container,
        attempt,
    );
    let (records, offset) = read_log(path.clone()).await?;
    let records = match opts.tail_lines {
        Some(n) => tail(records, n),
        None => records,
    };
    let mut writer = Writer::new(opts);
    let first = write_records(&mut writer, &records);
    let running = chosen.state == cri::ContainerState::ContainerRunning as i32;
    if !follow || !running || writer.full() {
        return Ok(plain_text(first));
    }
    let follower = Follower::new(path, offset);
    let rx = follow_log(ctx.deps.rt.clone(), chosen.id, follower, writer, first);
    let stream = tokio_stream::wrappers::ReceiverStream::new(rx);
    Ok(plain_text(Body::from_stream(stream)))
}

/// A 200 answer of plain text.
fn plain_text(body: impl IntoResponse) -> Response {
    (StatusCode::OK, [(header::CONTENT_TYPE, "text/plain")], body).into_response()
}

/// The UID of the pod `ns/name`, which must have a container or init container `container`.
fn pod_uid(ctx: &Ctx, ns: &str, name: &str, container: &str) -> Result<String, LogError> {
    let Some(pod) = find_pod(ctx, ns, name) else {
        return Err(LogError::NoPod {
            ns: ns.to_string(),
            name: name.to_string(),
        });
    };
    let known = pod.spec.as_ref().is_some_and(|s| {
        s.containers
            .iter()
            .chain(s.init_containers.iter().flatten())
            .any(|c| c.name == container)
    });
    if !known {
        return Err(LogError::NoContainer {
            ns: ns.to_string(),
            name: name.to_string(),
            container: container.to_string(),
        });
    }
    Ok(pod.metadata.uid.unwrap_or_default())
}

/// The instance of `container` (of the pod `name`, UID `uid`) whose log is asked for: the
/// newest, or with `previous` the one before it.
async fn instance(
    rt: &dyn RuntimeService,
    uid: &str,
    name: &str,
    container: &str,
    previous: bool,
) -> Result<cri::ContainerStatus, LogError> {
    let mut instances = instances_of(rt, uid, container).await?;
    if previous {
        if instances.len() < 2 {
            return Err(LogError::NoPrevious {
                name: name.to_string(),
                container: container.to_string(),
            });
        }
        return Ok(instances.swap_remove(1));
    }
    instances
        .into_iter()
        .next()
        .ok_or_else(|| LogError::Waiting {
            name: name.to_string(),
            container: container.to_string(),
        })
}

/// The records of the log at `path` (none when it is not there yet) and the offset after
/// the last complete line.
async fn read_log(path: PathBuf) -> Result<(Vec<Record>, u64), LogError> {
    let read = tokio::task::spawn_blocking({
        let path = path.clone();
        move || read_from(&path, 0)
    })
    .await?;
    match read {
        Ok(r) => Ok(r),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok((Vec::new(), 0)),
        Err(source) => Err(LogError::Read { path, source }),
    }
}

/// The output of `records`, up to `limitBytes`.
fn write_records(writer: &mut Writer, records: &[Record]) -> Vec<u8> {
    let mut out = Vec::new();
    for r in records {
        out.extend(writer.write(r));
        if writer.full() {
            break;
        }
    }
    out
}

/// Follows the log of the container `id` in a task: sends `first`, then what the container
/// writes, until it stops (then what it wrote last), `limitBytes` is reached or the client
/// goes. Returns what the task sends.
fn follow_log(
    rt: Arc<dyn RuntimeService>,
    id: String,
    mut follower: Follower,
    mut writer: Writer,
    first: Vec<u8>,
) -> mpsc::Receiver<std::io::Result<Vec<u8>>> {
    let (tx, rx) = mpsc::channel(16);
    tokio::spawn(async move {
        if tx.send(Ok(first)).await.is_err() {
            return;
        }
        loop {
            tokio::time::sleep(FOLLOW_POLL).await;
            let Some((f, read)) = read_new(follower).await else {
                return;
            };
            follower = f;
            let records = read.unwrap_or_default();
            let out = write_records(&mut writer, &records);
            if !out.is_empty() && tx.send(Ok(out)).await.is_err() {
                return;
            }
            if writer.full() || tx.is_closed() {
                return;
            }
            if records.is_empty() && !is_running(rt.as_ref(), &id).await {
                // One more read for what it wrote last.
                if let Some((_, Ok(records))) = read_new(follower).await {
                    let _ = tx.send(Ok(write_records(&mut writer, &records))).await;
                }
                return;
            }
        }
    });
    rx
}

/// What `f` reads next, off the async threads; `None` when its task failed.
async fn read_new(mut f: Follower) -> Option<(Follower, std::io::Result<Vec<Record>>)> {
    tokio::task::spawn_blocking(move || {
        let read = f.read_new();
        (f, read)
    })
    .await
    .ok()
}

/// Whether the runtime says the container `id` is running.
async fn is_running(rt: &dyn RuntimeService, id: &str) -> bool {
    rt.container_status(cri::ContainerStatusRequest {
        container_id: id.to_string(),
        verbose: false,
    })
    .await
    .ok()
    .and_then(|s| s.status)
    .is_some_and(|s| s.state == cri::ContainerState::ContainerRunning as i32)
}

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
    pub fn from_query(q: &HashMap<String, String>, now: Timestamp) -> Result<Options, QueryError> {
        let num = |key: &'static str| -> Result<Option<u64>, QueryError> {
            q.get(key)
                .map(|v| {
                    v.parse::<i64>()
                        .ok()
                        .and_then(|n| u64::try_from(n).ok())
                        .ok_or_else(|| QueryError::NotANumber {
                            key,
                            value: v.clone(),
                        })
                })
                .transpose()
        };
        let flag = |k: &str| q.get(k).is_some_and(|v| v == "true" || v == "1");
        let mut since = None;
        if let Some(s) = num("sinceSeconds")? {
            if s == 0 {
                return Err(QueryError::SinceSecondsZero);
            }
            let secs = i64::try_from(s).unwrap_or(i64::MAX);
            since = now
                .checked_sub(k8s_openapi::jiff::SignedDuration::from_secs(secs))
                .ok();
        }
        if let Some(t) = q.get("sinceTime") {
            if since.is_some() {
                return Err(QueryError::BothSinces);
            }
            since = Some(t.parse().map_err(|source| QueryError::SinceTime {
                value: t.clone(),
                source,
            })?);
        }
        let limit = num("limitBytes")?;
        if limit == Some(0) {
            return Err(QueryError::LimitBytesZero);
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
