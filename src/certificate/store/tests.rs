//! The cert dir: files written 0600 with a `current` link, torn files refused by name.

use super::*;
use std::os::unix::fs::PermissionsExt;

/// A self-signed certificate valid from `from` to `until` (seconds from now) and its key.
pub(crate) fn cert(from: i64, until: i64) -> (String, String) {
    let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
    let mut p = rcgen::CertificateParams::new(vec!["node-a".to_string()]).unwrap();
    let now = time::OffsetDateTime::now_utc();
    p.not_before = now + time::Duration::seconds(from);
    p.not_after = now + time::Duration::seconds(until);
    let c = p.self_signed(&key).unwrap();
    (c.pem(), key.serialize_pem())
}

#[test]
fn update_writes_a_private_file_and_points_current_at_it() {
    let dir = tempfile::tempdir().unwrap();
    let store = CertStore::new(&dir.path().join("pki"), "kubelet-client");
    assert_eq!(store.current().unwrap(), None);
    let (c, k) = cert(-60, 3600);
    let file = store.update(&c, &k).unwrap();
    let mode = std::fs::metadata(&file).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);
    let name = file.file_name().unwrap().to_string_lossy().into_owned();
    assert!(name.starts_with("kubelet-client-20"), "{name}");
    let link = std::fs::read_link(store.current_path()).unwrap();
    assert_eq!(link, PathBuf::from(&name), "a relative link");
    let pair = store.current().unwrap().unwrap();
    assert_eq!(pair.cert_pem, c);
    assert_eq!(pair.key_pem, k);
    let now = chrono::Utc::now().timestamp();
    assert!(pair.valid_at(now));
    assert!(!pair.valid_at(now + 7200));

    // A second one in the same second is kept beside the first, and becomes current.
    let (c2, k2) = cert(-60, 7200);
    let second = store.update(&c2, &k2).unwrap();
    assert_ne!(second, file);
    assert!(file.exists());
    assert_eq!(store.current().unwrap().unwrap().cert_pem, c2);
}

#[test]
fn a_torn_current_file_is_refused_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let store = CertStore::new(dir.path(), "kubelet-client");
    let (c, k) = cert(-60, 3600);
    let file = store.update(&c, &k).unwrap();
    let full = std::fs::read_to_string(&file).unwrap();
    std::fs::write(&file, &full[..full.len() / 3]).unwrap();
    let e = store.current().unwrap_err().to_string();
    assert!(
        e.starts_with(&store.current_path().display().to_string()),
        "{e}"
    );
    std::fs::write(&file, &c).unwrap();
    let e = store.current().unwrap_err().to_string();
    assert!(e.contains("holds no private key"), "{e}");
    std::fs::write(&file, &k).unwrap();
    let e = store.current().unwrap_err().to_string();
    assert!(e.contains("holds no certificate"), "{e}");
}
