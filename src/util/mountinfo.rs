//! The mount table as `/proc/<pid>/mountinfo` gives it: which mount points lie below a dir.

use std::ffi::OsString;
use std::os::unix::ffi::OsStringExt;
use std::path::{Path, PathBuf};

/// The mount points in `mountinfo` (the text of `/proc/<pid>/mountinfo`) that are `dir` or
/// lie below it, compared by path components. The kernel's octal escapes (`\040` for a
/// space, `\011`, `\012`, `\134`) are decoded; malformed lines are skipped.
pub fn mounts_under(mountinfo: &str, dir: &Path) -> Vec<PathBuf> {
    mountinfo
        .lines()
        .filter_map(|line| line.split(' ').nth(4))
        .filter(|p| p.starts_with('/'))
        .map(unescape_octal)
        .filter(|p| p.starts_with(dir))
        .collect()
}

/// Decodes the `\ooo` escapes of a mountinfo field.
pub fn unescape_octal(field: &str) -> PathBuf {
    let b = field.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\' {
            let digits = b.get(i + 1..i + 4).unwrap_or_default();
            if digits.len() == 3 && digits.iter().all(|d| (b'0'..=b'7').contains(d)) {
                let v = digits
                    .iter()
                    .fold(0u32, |acc, d| acc * 8 + u32::from(d - b'0'));
                if let Ok(byte) = u8::try_from(v) {
                    out.push(byte);
                    i += 4;
                    continue;
                }
            }
        }
        out.push(b[i]);
        i += 1;
    }
    PathBuf::from(OsString::from_vec(out))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mounts_under_matches_by_component_and_decodes_escapes() {
        let text = "\
22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw
30 22 0:26 / /var/lib/nodelet rw shared:2 - ext4 /dev/sdb1 rw
31 30 0:40 / /var/lib/nodelet/pods/abc/volumes/kubernetes.io~secret/tok rw - tmpfs tmpfs rw
32 30 0:41 / /var/lib/nodelet/pods/abcd/volumes/x rw - tmpfs tmpfs rw
33 30 0:42 / /var/lib/nodelet/pods/abc rw - tmpfs tmpfs rw
34 30 0:43 / /var/lib/nodelet/pods/sp\\040ace/vol\\040one rw - tmpfs tmpfs rw
35 30 0:44 / /var/lib/nodelet/pods/tab\\011x/back\\134slash rw - tmpfs tmpfs rw
36 30 0:45 / /var/lib/nodelet/pods/bad\\9x/m rw - tmpfs tmpfs rw
garbage line
37 30 0:46 /
";
        let pods = Path::new("/var/lib/nodelet/pods");
        assert_eq!(
            mounts_under(text, &pods.join("abc")),
            vec![
                pods.join("abc/volumes/kubernetes.io~secret/tok"),
                pods.join("abc"),
            ],
            "the pod dir itself and below it, not abcd"
        );
        assert_eq!(
            mounts_under(text, &pods.join("sp ace")),
            vec![pods.join("sp ace/vol one")]
        );
        assert_eq!(
            mounts_under(text, &pods.join("tab\tx")),
            vec![pods.join("tab\tx/back\\slash")]
        );
        // An invalid escape stays as written.
        assert_eq!(
            mounts_under(text, &pods.join("bad\\9x")),
            vec![pods.join("bad\\9x/m")]
        );
        // A trailing slash does not matter; a mount above the dir is not under it.
        assert_eq!(
            mounts_under(text, Path::new("/var/lib/nodelet/pods/abcd/")).len(),
            1
        );
        assert!(mounts_under(text, &pods.join("none")).is_empty());
        assert!(mounts_under("", pods).is_empty());
        assert_eq!(mounts_under(text, pods).len(), 6);
    }
}
