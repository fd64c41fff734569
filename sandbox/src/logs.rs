//! Container output in the CRI log format: `<RFC3339Nano time> <stream> <F|P> <content>`, one
//! record per line. A line longer than [`MAX_LINE`] is split into partial (`P`) records; the
//! final piece, and a line cut short by end of stream, is a full (`F`) record. Kubernetes log
//! readers (`kubectl logs`, log shippers) parse exactly this.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};

/// Longest record content before a line is split into partial records.
pub const MAX_LINE: usize = 16 * 1024;

/// Which output stream bytes came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stream {
    Stdout,
    Stderr,
}

impl Stream {
    fn name(self) -> &'static str {
        match self {
            Stream::Stdout => "stdout",
            Stream::Stderr => "stderr",
        }
    }
}

/// Writes one container's output into its log file. Holds the unfinished line of each stream.
///
/// A record that cannot be written whole (a full disk) is taken back out of the file, so the
/// log only ever holds whole records; the output is dropped (the container must never block on
/// its log) and counted, and writing goes on as soon as the disk takes it again.
#[derive(Debug)]
pub struct LogWriter {
    path: Option<PathBuf>,
    file: Option<File>,
    partial: [Vec<u8>; 2],
    /// Bytes of output dropped since writes started failing (None while they succeed).
    dropping: Option<u64>,
}

impl LogWriter {
    /// A writer appending to `path` (created with its parent directories), or discarding when `None`.
    pub fn open(path: Option<&Path>) -> std::io::Result<Self> {
        let mut w = LogWriter {
            path: path.map(Path::to_path_buf),
            file: None,
            partial: [Vec::new(), Vec::new()],
            dropping: None,
        };
        w.reopen()?;
        Ok(w)
    }

    /// Closes and reopens the file, so that a rotated log continues in a new file.
    pub fn reopen(&mut self) -> std::io::Result<()> {
        self.file = None;
        if let Some(path) = &self.path {
            if let Some(dir) = path.parent() {
                std::fs::create_dir_all(dir)?;
            }
            self.file = Some(OpenOptions::new().create(true).append(true).open(path)?);
        }
        Ok(())
    }

    /// Bytes of output dropped since writes started failing, while they fail.
    pub fn dropping(&self) -> Option<u64> {
        self.dropping
    }

    /// Feeds bytes read from `stream`; complete lines are written at once. Every line is
    /// handled even when one cannot be written; the first error is returned.
    pub fn write(&mut self, stream: Stream, mut data: &[u8]) -> std::io::Result<()> {
        let idx = stream as usize;
        let mut result = Ok(());
        while !data.is_empty() {
            match data.iter().position(|b| *b == b'\n') {
                Some(n) => {
                    let mut line = std::mem::take(&mut self.partial[idx]);
                    line.extend_from_slice(&data[..n]);
                    result = result.and(self.emit_line(stream, &line));
                    data = &data[n + 1..];
                }
                None => {
                    self.partial[idx].extend_from_slice(data);
                    data = &[];
                }
            }
        }
        while self.partial[idx].len() >= MAX_LINE {
            let rest = self.partial[idx].split_off(MAX_LINE);
            let chunk = std::mem::replace(&mut self.partial[idx], rest);
            result = result.and(self.record(stream, 'P', &chunk));
        }
        result
    }

    /// Writes out what is left of a stream's last line, at end of stream.
    pub fn finish(&mut self, stream: Stream) -> std::io::Result<()> {
        let idx = stream as usize;
        if !self.partial[idx].is_empty() {
            let line = std::mem::take(&mut self.partial[idx]);
            self.record(stream, 'F', &line)?;
        }
        Ok(())
    }

    fn emit_line(&mut self, stream: Stream, line: &[u8]) -> std::io::Result<()> {
        let mut rest = line;
        let mut result = Ok(());
        while rest.len() > MAX_LINE {
            result = result.and(self.record(stream, 'P', &rest[..MAX_LINE]));
            rest = &rest[MAX_LINE..];
        }
        result.and(self.record(stream, 'F', rest))
    }

    fn record(&mut self, stream: Stream, tag: char, content: &[u8]) -> std::io::Result<()> {
        let Some(file) = self.file.as_mut() else {
            return Ok(());
        };
        let ts = chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Nanos, true);
        let mut rec = Vec::with_capacity(content.len() + 48);
        rec.extend_from_slice(ts.as_bytes());
        rec.push(b' ');
        rec.extend_from_slice(stream.name().as_bytes());
        rec.push(b' ');
        rec.push(tag as u8);
        rec.push(b' ');
        rec.extend_from_slice(content);
        rec.push(b'\n');
        match write_whole(file, &rec) {
            Ok(()) => {
                if let Some(dropped) = self.dropping.take() {
                    tracing::warn!(log = ?self.path, dropped, "writing the log again; output was dropped while it could not be written");
                }
                Ok(())
            }
            Err(e) => {
                match &mut self.dropping {
                    Some(dropped) => *dropped += content.len() as u64,
                    None => {
                        tracing::warn!(log = ?self.path, error = %e, "the log cannot be written; dropping output until it can");
                        self.dropping = Some(content.len() as u64);
                    }
                }
                Err(e)
            }
        }
    }
}

/// Appends `rec` whole, or not at all: on an error, the part that went in is cut off again.
fn write_whole(file: &mut File, rec: &[u8]) -> std::io::Result<()> {
    let mut written = 0;
    while written < rec.len() {
        match file.write(&rec[written..]) {
            Ok(0) => {
                written_back(file, written);
                return Err(std::io::ErrorKind::WriteZero.into());
            }
            Ok(n) => written += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => {
                written_back(file, written);
                return Err(e);
            }
        }
    }
    Ok(())
}

/// Cuts the last `written` bytes (a record's torn start) off an append-only file.
fn written_back(file: &File, written: usize) {
    if written == 0 {
        return;
    }
    if let Ok(meta) = file.metadata() {
        let _ = file.set_len(meta.len().saturating_sub(written as u64));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn records(path: &Path) -> Vec<(String, String, String)> {
        std::fs::read_to_string(path)
            .unwrap()
            .lines()
            .map(|l| {
                let mut it = l.splitn(4, ' ');
                let ts = it.next().unwrap();
                assert!(
                    chrono::DateTime::parse_from_rfc3339(ts).is_ok(),
                    "bad time {ts}"
                );
                (
                    it.next().unwrap().to_string(),
                    it.next().unwrap().to_string(),
                    it.next().unwrap_or("").to_string(),
                )
            })
            .collect()
    }

    #[test]
    fn lines_split_across_reads_are_joined() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("a/0.log");
        let mut w = LogWriter::open(Some(&p)).unwrap();
        w.write(Stream::Stdout, b"hel").unwrap();
        w.write(Stream::Stderr, b"oops\n").unwrap();
        w.write(Stream::Stdout, b"lo\nwor").unwrap();
        w.write(Stream::Stdout, b"ld\n\n").unwrap();
        w.write(Stream::Stdout, b"tail").unwrap();
        w.finish(Stream::Stdout).unwrap();
        let r = records(&p);
        let want = [
            ("stderr", "F", "oops"),
            ("stdout", "F", "hello"),
            ("stdout", "F", "world"),
            ("stdout", "F", ""),
            ("stdout", "F", "tail"),
        ];
        assert_eq!(r.len(), want.len(), "{r:?}");
        for (got, want) in r.iter().zip(want) {
            assert_eq!((got.0.as_str(), got.1.as_str(), got.2.as_str()), want);
        }
    }

    #[test]
    fn long_lines_become_partial_records() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("0.log");
        let mut w = LogWriter::open(Some(&p)).unwrap();
        let long = vec![b'x'; MAX_LINE * 2 + 5];
        w.write(Stream::Stdout, &long).unwrap();
        w.write(Stream::Stdout, b"\n").unwrap();
        let r = records(&p);
        let tags: Vec<_> = r.iter().map(|x| x.1.as_str()).collect();
        assert_eq!(tags, ["P", "P", "F"]);
        let total: usize = r.iter().map(|x| x.2.len()).sum();
        assert_eq!(total, long.len());
    }

    #[test]
    fn reopen_continues_in_a_new_file() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("0.log");
        let mut w = LogWriter::open(Some(&p)).unwrap();
        w.write(Stream::Stdout, b"one\n").unwrap();
        std::fs::rename(&p, dir.path().join("0.log.1")).unwrap();
        w.reopen().unwrap();
        w.write(Stream::Stdout, b"two\n").unwrap();
        assert_eq!(records(&p)[0].2, "two");
        assert_eq!(records(&dir.path().join("0.log.1"))[0].2, "one");
    }

    /// A full disk: records that do not fit are taken back out whole, the output is dropped
    /// (counted), and writing resumes once there is room. Root only (a small tmpfs).
    #[test]
    fn a_full_disk_drops_whole_records_and_writing_resumes() {
        if !nix::unistd::Uid::effective().is_root() {
            crate::skip(
                "needs root",
                "a_full_disk_drops_whole_records_and_writing_resumes",
            );
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        nix::mount::mount(
            Some("tmpfs"),
            dir.path(),
            Some("tmpfs"),
            nix::mount::MsFlags::empty(),
            Some("size=64k"),
        )
        .unwrap();
        struct Unmount<'a>(&'a Path);
        impl Drop for Unmount<'_> {
            fn drop(&mut self) {
                let _ = nix::mount::umount2(self.0, nix::mount::MntFlags::MNT_DETACH);
            }
        }
        let _unmount = Unmount(dir.path());
        let path = dir.path().join("c/0.log");
        let mut w = LogWriter::open(Some(&path)).unwrap();
        // Lines of 1000 bytes: the 64 KiB fill up part-way through one.
        let mut line = vec![b'x'; 999];
        line.push(b'\n');
        let mut failed = 0;
        for _ in 0..100 {
            if w.write(Stream::Stdout, &line).is_err() {
                failed += 1;
            }
        }
        assert!(failed > 0, "the tmpfs never filled up");
        assert!(w.dropping().is_some_and(|d| d >= 999));
        let whole = records(&path);
        assert!(!whole.is_empty());
        let text = std::fs::read(&path).unwrap();
        assert_eq!(text.last(), Some(&b'\n'), "a torn record was left");
        assert_eq!(text.iter().filter(|b| **b == b'\n').count(), whole.len());
        assert!(
            whole
                .iter()
                .all(|(_, tag, content)| tag == "F" && content.len() == 999)
        );
        // Room again: the next line goes in.
        std::fs::write(&path, b"").unwrap();
        w.write(Stream::Stdout, b"back\n").unwrap();
        assert_eq!(w.dropping(), None);
        assert_eq!(records(&path).last().unwrap().2, "back");
    }
}
