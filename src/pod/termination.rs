//! Termination messages (upstream's `terminationMessagePath` and `terminationMessagePolicy`).
//!
//! Before a container is created, [`prepare_mount`] makes an empty file, mode 0666, at
//! `<pods dir>/<uid>/containers/<name>/<restart count>-<random>` and a CRI mount of it at the
//! container's `terminationMessagePath` (`/dev/termination-log` unless the spec says, none when
//! it is empty). Once the container exited, [`fill_messages`] reads the file back for the status
//! `message` (upstream `getTerminationMessage`): the mount is found in the CRI `ContainerStatus`
//! `mounts` by the path in the [`ANNOTATION_TERMINATION_MESSAGE_PATH`] annotation, and at most
//! the file's last [`MAX_CONTAINER_MESSAGE`] bytes are taken. Under
//! `terminationMessagePolicy: FallbackToLogsOnError` a container that failed and left the file
//! empty gets the tail of its log instead ([`log_tail`]: the last [`MAX_LOG_LINES`] lines, at
//! most [`MAX_LOG_MESSAGE`] bytes). [`truncate_to_pod_budget`] then shares
//! [`MAX_POD_MESSAGES`] evenly between the pod's containers, as upstream's status manager does.

use std::fs::{File, OpenOptions};
use std::io::{self, Read, Seek, SeekFrom};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Component, Path};

use k8s_openapi::api::core::v1::{Container, ContainerState, PodStatus};
use runtime::cri;
use runtime::{Error, Result};

use super::ANNOTATION_TERMINATION_MESSAGE_PATH;

/// Annotation carrying the container's termination message policy (upstream's name).
pub const ANNOTATION_TERMINATION_MESSAGE_POLICY: &str =
    "io.kubernetes.container.terminationMessagePolicy";
/// The API default of `terminationMessagePath`.
pub const DEFAULT_PATH: &str = "/dev/termination-log";
/// The policy that falls back to the log tail (the default is `File`).
pub const FALLBACK_TO_LOGS_ON_ERROR: &str = "FallbackToLogsOnError";
/// At most this much of a termination message file is read (upstream
/// `MaxContainerTerminationMessageLength`).
pub const MAX_CONTAINER_MESSAGE: usize = 4 * 1024;
/// All termination messages of a pod's status together (upstream
/// `MaxPodTerminationMessageLogLength`), shared evenly between its containers.
pub const MAX_POD_MESSAGES: usize = 12 * 1024;
/// At most this much of a log tail becomes the message (upstream
/// `MaxContainerTerminationMessageLogLength`).
pub const MAX_LOG_MESSAGE: usize = 2 * 1024;
/// At most this many log lines become the message (upstream
/// `MaxContainerTerminationMessageLogLines`).
pub const MAX_LOG_LINES: usize = 80;
/// The runtime's reason for a container that could not even start: it has no log to fall back
/// to (as upstream).
const CANNOT_RUN: &str = "ContainerCannotRun";
/// The longest log tail read from the end of the file looking for the lines wanted.
const MAX_LOG_READ: u64 = 1 << 20;

/// The container's termination message path: the API default when unset, `None` when empty.
pub fn message_path(c: &Container) -> Option<&str> {
    match c.termination_message_path.as_deref() {
        None => Some(DEFAULT_PATH),
        Some("") => None,
        Some(p) => Some(p),
    }
}

/// `name` as a single path component (no `/`, `.` or `..`), or why not.
fn component<'a>(what: &str, name: &'a str) -> Result<&'a str> {
    let mut parts = Path::new(name).components();
    match (parts.next(), parts.next()) {
        (Some(Component::Normal(_)), None) if !name.contains('/') => Ok(name),
        _ => Err(Error::invalid_argument(format!(
            "{what} {name:?} cannot name a directory"
        ))),
    }
}

/// Eight hex digits from the kernel's random source, else from the clock and the process.
fn short_random() -> String {
    let mut b = [0u8; 4];
    if File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut b))
        .is_err()
    {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        b = (nanos ^ std::process::id().rotate_left(16)).to_be_bytes();
    }
    hex::encode(b)
}

/// Makes the empty host file (mode 0666) behind the container's termination message path under
/// `<pods_dir>/<uid>/containers/<name>/` and returns the read-write mount of it; `None` when
/// the container has no termination message path.
pub fn prepare_mount(
    pods_dir: &Path,
    uid: &str,
    c: &Container,
    restart_count: u32,
) -> Result<Option<cri::Mount>> {
    let Some(container_path) = message_path(c) else {
        return Ok(None);
    };
    let field = format!("spec.containers[{}].terminationMessagePath", c.name);
    if !container_path.starts_with('/') {
        return Err(Error::invalid_argument(format!(
            "{field}: {container_path:?} must be absolute"
        )));
    }
    let dir = pods_dir
        .join(component("pod UID", uid)?)
        .join("containers")
        .join(component("container name", &c.name)?);
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o750)
        .create(&dir)
        .map_err(|e| {
            Error::internal(format!(
                "{field}: creating the termination log directory {}: {e}",
                dir.display()
            ))
        })?;
    let mut last = None;
    for _ in 0..4 {
        let path = dir.join(format!("{restart_count}-{}", short_random()));
        match OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o666)
            .open(&path)
        {
            Ok(f) => {
                // The umask took bits off the mode: every user in the container may write.
                f.set_permissions(std::fs::Permissions::from_mode(0o666))
                    .map_err(|e| {
                        Error::internal(format!(
                            "{field}: making the termination log {} writable: {e}",
                            path.display()
                        ))
                    })?;
                return Ok(Some(cri::Mount {
                    container_path: container_path.to_string(),
                    host_path: path.to_string_lossy().into_owned(),
                    readonly: false,
                    selinux_relabel: false,
                    propagation: cri::MountPropagation::PropagationPrivate as i32,
                    ..Default::default()
                }));
            }
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => last = Some((path, e)),
            Err(e) => {
                return Err(Error::internal(format!(
                    "{field}: creating the termination log {}: {e}",
                    path.display()
                )));
            }
        }
    }
    let (path, e) = last.unwrap_or_else(|| (dir.clone(), io::ErrorKind::AlreadyExists.into()));
    Err(Error::internal(format!(
        "{field}: creating the termination log {}: {e}",
        path.display()
    )))
}

/// Drops the UTF-8 continuation bytes a cut left at the start of `b`.
fn from_cut(b: &[u8]) -> &[u8] {
    let skip = b.iter().take(3).take_while(|&&x| x & 0xC0 == 0x80).count();
    &b[skip..]
}

/// The last `max` bytes of the file (upstream `tail.ReadAtMost`), a character cut in two at
/// the start dropped.
pub fn read_at_most(path: &Path, max: usize) -> io::Result<String> {
    let mut f = File::open(path)?;
    let len = f.metadata()?.len();
    let max64 = u64::try_from(max).unwrap_or(u64::MAX);
    let cut = len > max64;
    if cut {
        f.seek(SeekFrom::Start(len - max64))?;
    }
    let mut b = Vec::with_capacity(max.min(usize::try_from(len).unwrap_or(max)));
    f.take(max64).read_to_end(&mut b)?;
    let b = if cut { from_cut(&b) } else { &b[..] };
    Ok(String::from_utf8_lossy(b).into_owned())
}

/// The text of CRI log records (`<time> <stream> <tag> <content>`, one a line) in file order:
/// a full (`F`) record ends its line, partial (`P`) ones are joined to what follows. Malformed
/// records are skipped.
fn records_text(data: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    for rec in data.split(|&b| b == b'\n').filter_map(crate::crilog::parse) {
        out.extend_from_slice(&rec.content);
        if !rec.partial {
            out.push(b'\n');
        }
    }
    out
}

/// The last `max_lines` lines of `text`, then at most its last `max_bytes` bytes.
fn tail_of(text: &[u8], max_lines: usize, max_bytes: usize) -> &[u8] {
    let body = text.strip_suffix(b"\n").unwrap_or(text);
    let mut start = 0;
    if max_lines == 0 {
        start = text.len();
    } else if let Some(i) = body
        .iter()
        .enumerate()
        .rev()
        .filter(|(_, b)| **b == b'\n')
        .nth(max_lines - 1)
        .map(|(i, _)| i)
    {
        start = i + 1;
    }
    let lines = &text[start..];
    let from = lines.len().saturating_sub(max_bytes);
    if from > 0 {
        from_cut(&lines[from..])
    } else {
        lines
    }
}

/// Whether the tail of `text` is settled although `text` may lack its beginning: enough whole
/// lines after the first (possibly cut) one, or enough bytes after it.
fn settled(text: &[u8], max_lines: usize, max_bytes: usize) -> bool {
    let Some(first_end) = text.iter().position(|&b| b == b'\n') else {
        return false;
    };
    let whole = &text[first_end + 1..];
    let lines = whole.iter().filter(|&&b| b == b'\n').count()
        + usize::from(!whole.is_empty() && !whole.ends_with(b"\n"));
    lines >= max_lines || whole.len() >= max_bytes
}

/// The tail of a container's CRI log file as upstream's `readLastStringFromContainerLogs`
/// gives it: the text of its last `max_lines` lines (partial records joined), at most the last
/// `max_bytes` bytes of it. Reads from the end, at most 1 MiB.
pub fn log_tail(path: &Path, max_lines: usize, max_bytes: usize) -> io::Result<String> {
    let mut f = File::open(path)?;
    let len = f.metadata()?.len();
    let mut window: u64 = 16 * 1024;
    loop {
        let w = window.min(len);
        f.seek(SeekFrom::Start(len - w))?;
        let mut data = Vec::with_capacity(usize::try_from(w).unwrap_or(0));
        (&mut f).take(w).read_to_end(&mut data)?;
        let whole_file = w == len;
        // Not from the start: the first record is cut, drop it.
        let records = if whole_file {
            &data[..]
        } else {
            let first_end = data.iter().position(|&b| b == b'\n').map_or(0, |i| i + 1);
            &data[first_end..]
        };
        let text = records_text(records);
        if whole_file || w >= MAX_LOG_READ || settled(&text, max_lines, max_bytes) {
            return Ok(String::from_utf8_lossy(tail_of(&text, max_lines, max_bytes)).into_owned());
        }
        window = window.saturating_mul(4).min(MAX_LOG_READ);
    }
}

/// The termination message of an exited container from its CRI status (upstream
/// `getTerminationMessage` and `readLastStringFromContainerLogs`); empty when there is none.
pub fn message_of(status: &cri::ContainerStatus) -> String {
    let path = status
        .annotations
        .get(ANNOTATION_TERMINATION_MESSAGE_PATH)
        .map_or("", String::as_str);
    let fallback = status
        .annotations
        .get(ANNOTATION_TERMINATION_MESSAGE_POLICY)
        .is_some_and(|p| p == FALLBACK_TO_LOGS_ON_ERROR)
        && status.exit_code != 0
        && status.reason != CANNOT_RUN;
    let mount = (!path.is_empty())
        .then(|| status.mounts.iter().find(|m| m.container_path == path))
        .flatten();
    let from_file = match mount {
        Some(m) => match read_at_most(Path::new(&m.host_path), MAX_CONTAINER_MESSAGE) {
            Ok(text) => text,
            Err(e) if e.kind() == io::ErrorKind::NotFound => String::new(),
            Err(e) => return format!("Error on reading termination log {}: {e}", m.host_path),
        },
        None => String::new(),
    };
    if !from_file.is_empty() || !fallback || status.log_path.is_empty() {
        return from_file;
    }
    match log_tail(Path::new(&status.log_path), MAX_LOG_LINES, MAX_LOG_MESSAGE) {
        Ok(text) => text,
        Err(e) => format!("Error on reading termination message from logs: {e}"),
    }
}

/// Adds the termination message of every exited container to its status `message` (after the
/// runtime's own, as upstream).
pub fn fill_messages(containers: &mut [cri::ContainerStatus]) {
    for c in containers
        .iter_mut()
        .filter(|c| c.state == cri::ContainerState::ContainerExited as i32)
    {
        let text = message_of(c);
        if text.is_empty() {
            continue;
        }
        if !c.message.is_empty() {
            c.message.push_str(": ");
        }
        c.message.push_str(&text);
    }
}

/// Cuts `s` to at most `max` bytes, at a character boundary.
fn truncate(s: &mut String, max: usize) {
    if s.len() > max {
        let mut end = max;
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        s.truncate(end);
    }
}

/// Keeps the termination messages of a pod's status within [`MAX_POD_MESSAGES`] together:
/// each container's (current and last state) cut to an even share of it, `containers` being
/// how many the pod spec has (upstream's status manager `normalizeStatus`).
pub fn truncate_to_pod_budget(status: &mut PodStatus, containers: usize) {
    let share = MAX_POD_MESSAGES / containers.max(1);
    let cut = |s: &mut Option<ContainerState>| {
        if let Some(m) = s
            .as_mut()
            .and_then(|s| s.terminated.as_mut())
            .and_then(|t| t.message.as_mut())
        {
            truncate(m, share);
        }
    };
    for c in status
        .init_container_statuses
        .iter_mut()
        .flatten()
        .chain(status.container_statuses.iter_mut().flatten())
        .chain(status.ephemeral_container_statuses.iter_mut().flatten())
    {
        cut(&mut c.state);
        cut(&mut c.last_state);
    }
}

#[cfg(test)]
mod tests;
