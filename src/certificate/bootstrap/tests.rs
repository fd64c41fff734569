//! TLS bootstrap's pure parts: when a kubeconfig is usable, what a CSR's status says, and the
//! kubeconfig written (read back by kube-rs).

use super::*;
use crate::certificate::store::tests::cert;
use k8s_openapi::api::certificates::v1::{
    CertificateSigningRequestCondition, CertificateSigningRequestStatus,
};

fn kubeconfig_with_cert(dir: &Path, cert_file: &str) -> PathBuf {
    let path = dir.join("kubelet.conf");
    std::fs::write(
        &path,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster: {{server: 'https://127.0.0.1:6443'}}\n\
             contexts:\n- name: x\n  context: {{cluster: c, user: u}}\ncurrent-context: x\n\
             users:\n- name: u\n  user: {{client-certificate: {cert_file}, client-key: {cert_file}}}\n"
        ),
    )
    .unwrap();
    path
}

#[test]
fn a_kubeconfig_is_unusable_when_missing_or_its_certificate_expired() {
    let dir = tempfile::tempdir().unwrap();
    assert!(
        unusable(&dir.path().join("none"))
            .unwrap()
            .contains("does not exist")
    );
    let path = kubeconfig_with_cert(dir.path(), "client.pem");
    let why = unusable(&path).unwrap();
    assert!(why.contains("client.pem"), "{why}");
    let (c, k) = cert(-60, 3600);
    std::fs::write(dir.path().join("client.pem"), format!("{c}{k}")).unwrap();
    assert_eq!(unusable(&path), None, "a relative path, valid now");
    let (c, k) = cert(-7200, -60);
    std::fs::write(dir.path().join("client.pem"), format!("{c}{k}")).unwrap();
    assert!(unusable(&path).unwrap().contains("not valid now"));
    std::fs::write(&path, "users: [").unwrap();
    assert!(unusable(&path).unwrap().contains("cannot be read"));
    // No client certificate (a token): usable, as upstream.
    std::fs::write(
        &path,
        "apiVersion: v1\nkind: Config\nclusters: []\ncontexts:\n- name: x\n  context: {cluster: c, user: u}\n\
         current-context: x\nusers:\n- name: u\n  user: {token: abc}\n",
    )
    .unwrap();
    assert_eq!(unusable(&path), None);
}

#[test]
fn the_written_kubeconfig_names_the_current_certificate_and_the_bootstraps_cluster() {
    let dir = tempfile::tempdir().unwrap();
    let boot = dir.path().join("bootstrap.conf");
    std::fs::write(dir.path().join("ca.crt"), "unused").unwrap();
    std::fs::write(
        &boot,
        "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster: {server: 'https://10.0.0.1:6443', certificate-authority: ca.crt}\n\
         contexts:\n- name: x\n  context: {cluster: c, user: u}\ncurrent-context: x\n\
         users:\n- name: u\n  user: {token: abcdef.0123456789abcdef}\n",
    )
    .unwrap();
    let cluster = read_bootstrap(&boot).unwrap();
    let out = dir.path().join("etc/kubelet.conf");
    let current = dir.path().join("pki/kubelet-client-current.pem");
    write_kubeconfig(&out, &cluster, &boot, &current).unwrap();
    let text = std::fs::read_to_string(&out).unwrap();
    assert!(
        !text.contains("abcdef"),
        "the bootstrap token stays out: {text}"
    );
    let kc = Kubeconfig::read_from(&out).unwrap();
    let c = kc.clusters[0].cluster.clone().unwrap();
    assert_eq!(c.server.as_deref(), Some("https://10.0.0.1:6443"));
    assert_eq!(
        c.certificate_authority.as_deref(),
        Some(dir.path().join("ca.crt").to_str().unwrap())
    );
    let user = current_user(&kc).unwrap();
    assert_eq!(user.client_certificate.as_deref(), current.to_str());
    assert_eq!(user.client_key.as_deref(), current.to_str());

    let e = read_bootstrap(&dir.path().join("none"))
        .unwrap_err()
        .to_string();
    assert!(e.starts_with("bootstrap kubeconfig "), "{e}");
}

fn csr(conditions: &[(&str, &str)], cert: &str) -> CertificateSigningRequest {
    CertificateSigningRequest {
        metadata: ObjectMeta {
            name: Some("node-csr-x".into()),
            ..Default::default()
        },
        spec: Default::default(),
        status: Some(CertificateSigningRequestStatus {
            certificate: Some(ByteString(cert.as_bytes().to_vec())),
            conditions: Some(
                conditions
                    .iter()
                    .map(|(t, r)| CertificateSigningRequestCondition {
                        type_: t.to_string(),
                        status: "True".into(),
                        reason: Some(r.to_string()),
                        message: Some("by the test".into()),
                        ..Default::default()
                    })
                    .collect(),
            ),
        }),
    }
}

#[test]
fn a_csrs_outcome() {
    assert!(outcome(&csr(&[], "")).is_none(), "pending");
    assert!(
        outcome(&csr(&[("Approved", "AutoApproved")], "")).is_none(),
        "approved, not issued"
    );
    let ok = outcome(&csr(&[("Approved", "AutoApproved")], "PEM")).unwrap();
    assert_eq!(ok.unwrap(), "PEM");
    let e = outcome(&csr(&[("Denied", "NotThisNode")], ""))
        .unwrap()
        .unwrap_err()
        .to_string();
    assert_eq!(
        e,
        "certificate signing request node-csr-x was denied: NotThisNode: by the test"
    );
    let e = outcome(&csr(&[("Failed", "SignerValidationFailure")], ""))
        .unwrap()
        .unwrap_err()
        .to_string();
    assert!(e.contains("was failed: SignerValidationFailure"), "{e}");
}
