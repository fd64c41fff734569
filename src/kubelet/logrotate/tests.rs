use std::io::Read;

use super::*;

fn write(p: &Path, text: &str) {
    std::fs::write(p, text).expect("write");
}

fn names(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .expect("dir")
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

fn gunzip(p: &Path) -> String {
    let mut s = String::new();
    flate2::read::GzDecoder::new(std::fs::File::open(p).expect("open"))
        .read_to_string(&mut s)
        .expect("gunzip");
    s
}

#[test]
fn rotated_files_are_compressed_and_the_oldest_go() {
    let dir = tempfile::tempdir().expect("tempdir");
    let log = dir.path().join("0.log");
    write(&log, "current\n");
    write(&dir.path().join("0.log.20260101-000001.gz"), "x");
    write(&dir.path().join("0.log.20260101-000002.gz"), "y");
    write(
        &dir.path().join("0.log.20260101-000003"),
        "newest rotated\n",
    );
    // Another container's files and the log's neighbours are not its rotated files.
    write(&dir.path().join("1.log.20260101-000001"), "other\n");
    // max_files 4: after the rotation, current + newest rotated + 2 older; so before it,
    // 2 rotated at most, all compressed.
    prepare(&log, 4).expect("prepare");
    assert_eq!(
        names(dir.path()),
        [
            "0.log",
            "0.log.20260101-000002.gz",
            "0.log.20260101-000003.gz",
            "1.log.20260101-000001"
        ]
    );
    assert_eq!(
        gunzip(&dir.path().join("0.log.20260101-000003.gz")),
        "newest rotated\n"
    );
    assert_eq!(std::fs::read_to_string(&log).expect("log"), "current\n");
}

#[test]
fn what_an_interrupted_rotation_left_is_cleaned_up() {
    let dir = tempfile::tempdir().expect("tempdir");
    let log = dir.path().join("0.log");
    write(&log, "current\n");
    // Compressed, but the original not removed yet; and a half-written compression.
    write(&dir.path().join("0.log.20260101-000001"), "old\n");
    compress(&dir.path().join("0.log.20260101-000001")).expect("compress");
    write(&dir.path().join("0.log.20260101-000001"), "old\n");
    write(&dir.path().join("0.log.20260101-000002.gz.tmp"), "half");
    prepare(&log, 5).expect("prepare");
    assert_eq!(names(dir.path()), ["0.log", "0.log.20260101-000001.gz"]);
    assert_eq!(
        gunzip(&dir.path().join("0.log.20260101-000001.gz")),
        "old\n"
    );
}

#[test]
fn max_files_two_keeps_only_the_newest_rotated_file() {
    let dir = tempfile::tempdir().expect("tempdir");
    let log = dir.path().join("0.log");
    write(&log, "current\n");
    write(&dir.path().join("0.log.20260101-000001"), "a\n");
    prepare(&log, 2).expect("prepare");
    assert_eq!(names(dir.path()), ["0.log"]);
}

#[test]
fn rotated_names_carry_the_time_and_never_collide() {
    let dir = tempfile::tempdir().expect("tempdir");
    let log = dir.path().join("0.log");
    let at = chrono::DateTime::parse_from_rfc3339("2026-12-02T03:04:05Z")
        .expect("time")
        .with_timezone(&chrono::Utc);
    let first = rotated_name(&log, at);
    assert_eq!(first, dir.path().join("0.log.20261202-030405"));
    write(&first, "x");
    assert_eq!(
        rotated_name(&log, at),
        dir.path().join("0.log.20261202-030405-1")
    );
    compress(&first).expect("compress");
    assert_eq!(
        rotated_name(&log, at),
        dir.path().join("0.log.20261202-030405-1"),
        "a compressed one takes the name too"
    );
}
