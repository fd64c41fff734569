//! HTTPS mode ([`ApiServer::start_tls`]): a cluster CA made for the server, a serving
//! certificate for `127.0.0.1` and `localhost` signed by it, client certificates it issues,
//! and kubeconfigs carrying those credentials. As kube-apiserver does (Go's
//! `tls.RequestClientCert`), the handshake asks for a client certificate without requiring
//! one and checks only that the client holds its key; each request's authentication then
//! verifies the certificate against the CA (`auth.rs`), so an expired or foreign certificate
//! is answered 401, not a failed handshake.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose, PublicKeyData, SanType, SerialNumber,
};
use rustls::DigitallySignedStruct;
use rustls::SignatureScheme;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, UnixTime};
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::server::{ServerConfig, WebPkiClientVerifier};
use tokio::net::TcpListener;

use super::ApiServer;

/// The cluster CA: it signs the serving certificate, the client certificates the tests ask
/// for and the approved CertificateSigningRequests.
pub struct Authority {
    issuer: Issuer<'static, KeyPair>,
    pub der: CertificateDer<'static>,
    pub pem: String,
    pub not_after: time::OffsetDateTime,
}

/// A subject as Go's `pkix.Name` encodes it (kube's signer re-encodes the request's subject
/// so): organizations before the common name. rcgen keeps one value per attribute type, so
/// a second organization goes in as a custom attribute of the same OID; more cannot be said.
pub fn subject(cn: &str, orgs: &[&str]) -> DistinguishedName {
    assert!(
        orgs.len() <= 2,
        "at most two organizations in a subject (rcgen keeps one value per attribute type)"
    );
    let mut dn = DistinguishedName::new();
    if let Some(o) = orgs.first() {
        dn.push(DnType::OrganizationName, *o);
    }
    if let Some(o) = orgs.get(1) {
        dn.push(DnType::CustomDnType(vec![2, 5, 4, 10]), *o);
    }
    if !cn.is_empty() {
        dn.push(DnType::CommonName, cn);
    }
    dn
}

/// A random positive serial number of 16 bytes, as Go's signers draw them.
pub fn serial() -> SerialNumber {
    let mut bytes: Vec<u8> = (0..16).map(|_| fastrand::u8(..)).collect();
    bytes[0] = (bytes[0] & 0x7f) | 0x01;
    SerialNumber::from_slice(&bytes)
}

impl Authority {
    pub fn new() -> Authority {
        let key = KeyPair::generate().expect("generating the CA key");
        let mut params = CertificateParams::default();
        params.distinguished_name = subject("kubernetes", &[]);
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
            KeyUsagePurpose::KeyCertSign,
        ];
        let now = time::OffsetDateTime::now_utc();
        params.not_before = now - time::Duration::hours(1);
        params.not_after = now + time::Duration::days(3650);
        params.serial_number = Some(serial());
        let cert = params.self_signed(&key).expect("self-signing the CA");
        let not_after = params.not_after;
        Authority {
            issuer: Issuer::new(params, key),
            der: cert.der().clone(),
            pem: cert.pem(),
            not_after,
        }
    }

    /// Signs `params` for the public key `key`.
    pub fn sign(
        &self,
        params: &CertificateParams,
        key: &impl PublicKeyData,
    ) -> Result<rcgen::Certificate, rcgen::Error> {
        params.signed_by(key, &self.issuer)
    }

    /// A new key and a certificate for it (PEMs), valid from now for `lifetime`: a client
    /// certificate, or a serving one for `sans` (IP addresses or DNS names).
    pub fn issue(
        &self,
        cn: &str,
        orgs: &[&str],
        sans: &[&str],
        lifetime: Duration,
    ) -> (String, String) {
        let key = KeyPair::generate().expect("generating a key");
        let mut params = CertificateParams::default();
        params.distinguished_name = subject(cn, orgs);
        params.subject_alt_names = sans
            .iter()
            .map(|s| match s.parse() {
                Ok(ip) => SanType::IpAddress(ip),
                Err(_) => SanType::DnsName((*s).try_into().expect("a DNS name")),
            })
            .collect();
        params.is_ca = IsCa::ExplicitNoCa;
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        params.extended_key_usages = vec![if sans.is_empty() {
            ExtendedKeyUsagePurpose::ClientAuth
        } else {
            ExtendedKeyUsagePurpose::ServerAuth
        }];
        params.use_authority_key_identifier_extension = true;
        let now = time::OffsetDateTime::now_utc();
        params.not_before = now;
        params.not_after = now + lifetime;
        params.serial_number = Some(serial());
        let cert = self.sign(&params, &key).expect("signing a certificate");
        (cert.pem(), key.serialize_pem())
    }
}

/// What HTTPS mode serves with: the TLS acceptor, the verifier each request's client
/// certificate is judged by, and the admin's credentials.
pub struct Serving {
    pub acceptor: tokio_rustls::TlsAcceptor,
    pub verifier: Arc<dyn ClientCertVerifier>,
    /// The admin's client certificate and key (CN=admin, O=system:masters).
    pub admin: (String, String),
}

/// The peer's certificate of a request's connection (its first, end-entity one), if it sent
/// one; set on every request by the connection's service.
#[derive(Clone, Debug, Default)]
pub struct PeerCert(pub Option<CertificateDer<'static>>);

/// Asks for a client certificate and accepts any (or none), but checks the handshake's
/// signature: the client holds the certificate's key.
#[derive(Debug)]
struct RequestClientCert(Arc<dyn ClientCertVerifier>);

impl ClientCertVerifier for RequestClientCert {
    fn client_auth_mandatory(&self) -> bool {
        false
    }

    fn root_hint_subjects(&self) -> &[rustls::DistinguishedName] {
        self.0.root_hint_subjects()
    }

    fn verify_client_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        Ok(ClientCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.supported_verify_schemes()
    }
}

impl fmt::Debug for Serving {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Serving")
    }
}

impl Serving {
    pub fn new(ca: &Authority) -> Serving {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut roots = rustls::RootCertStore::empty();
        roots.add(ca.der.clone()).expect("the CA as a trust anchor");
        let verifier =
            WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider.clone())
                .allow_unauthenticated()
                .build()
                .expect("the client certificate verifier");
        let (cert, key) = ca.issue(
            "kube-apiserver",
            &[],
            &["127.0.0.1", "localhost"],
            Duration::from_secs(3650 * 86400),
        );
        let chain = vec![CertificateDer::from(pem_der(&cert))];
        let key = PrivateKeyDer::Pkcs8(pem_der(&key).into());
        let config = ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .expect("TLS versions")
            .with_client_cert_verifier(Arc::new(RequestClientCert(verifier.clone())))
            .with_single_cert(chain, key)
            .expect("the serving certificate");
        let admin = ca.issue(
            "admin",
            &["system:masters"],
            &[],
            Duration::from_secs(3650 * 86400),
        );
        Serving {
            acceptor: tokio_rustls::TlsAcceptor::from(Arc::new(config)),
            verifier,
            admin,
        }
    }
}

/// The DER of the first block of a PEM text the server wrote.
fn pem_der(pem: &str) -> Vec<u8> {
    let body: String = pem
        .lines()
        .skip_while(|l| !l.starts_with("-----BEGIN"))
        .skip(1)
        .take_while(|l| !l.starts_with("-----END"))
        .collect();
    STANDARD.decode(body).expect("a PEM the server wrote")
}

fn b64(s: &str) -> String {
    STANDARD.encode(s)
}

/// A kubeconfig for `server` trusting `ca_pem` (when given), its user given as YAML lines.
pub fn kubeconfig(server: &str, ca_pem: Option<&str>, user: &str) -> String {
    let ca = ca_pem
        .map(|c| format!("    certificate-authority-data: {}\n", b64(c)))
        .unwrap_or_default();
    format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: test\n  cluster:\n    server: {server}\n{ca}\
         contexts:\n- name: test\n  context:\n    cluster: test\n    user: test\n    namespace: default\n\
         current-context: test\nusers:\n- name: test\n  user:{user}\n"
    )
}

/// A kubeconfig user with a client certificate.
pub fn cert_user((cert, key): &(String, String)) -> String {
    format!(
        "\n    client-certificate-data: {}\n    client-key-data: {}",
        b64(cert),
        b64(key)
    )
}

impl ApiServer {
    /// Starts serving HTTPS on 127.0.0.1 on a free port, with a fresh cluster CA, client
    /// certificate and bootstrap token authentication, and the authorization described in
    /// `auth.rs`.
    pub async fn start_tls() -> ApiServer {
        nodelet::api::install_crypto_provider();
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("binding 127.0.0.1:0");
        let ca = Authority::new();
        let serving = Serving::new(&ca);
        ApiServer::launch(listener, ca, Some(serving))
    }

    /// The cluster CA's certificate (PEM). In plain-HTTP mode, the CA that signs
    /// CertificateSigningRequests.
    pub fn ca_pem(&self) -> String {
        self.app.ca.pem.clone()
    }

    /// A new key and a client certificate for it signed by the cluster CA: subject `cn` in
    /// the `orgs` (at most two), valid from now for `lifetime`. Returns the PEMs (cert, key).
    pub fn issue_client_cert(
        &self,
        cn: &str,
        orgs: &[&str],
        lifetime: Duration,
    ) -> (String, String) {
        self.app.ca.issue(cn, orgs, &[], lifetime)
    }

    fn tls(&self) -> &Serving {
        self.app
            .tls
            .as_ref()
            .expect("the API server serves HTTPS (ApiServer::start_tls)")
    }

    /// Writes `kubeconfig-<node>` into `dir`: the cluster CA and a client certificate for
    /// `system:node:<node>` in `system:nodes`, valid for a year. HTTPS mode only.
    pub fn write_node_kubeconfig(&self, dir: &Path, node: &str) -> PathBuf {
        self.tls();
        let creds = self.issue_client_cert(
            &format!("system:node:{node}"),
            &["system:nodes"],
            Duration::from_secs(365 * 86400),
        );
        let path = dir.join(format!("kubeconfig-{node}"));
        let text = kubeconfig(&self.url(), Some(&self.app.ca.pem), &cert_user(&creds));
        std::fs::write(&path, text).expect("writing the node kubeconfig");
        path
    }

    /// Writes `bootstrap-kubeconfig` into `dir`: the cluster CA and the bearer `token`
    /// (`<id>.<secret>`, see [`ApiServer::add_bootstrap_token`]). HTTPS mode only.
    pub fn write_bootstrap_kubeconfig(&self, dir: &Path, token: &str) -> PathBuf {
        self.tls();
        let path = dir.join("bootstrap-kubeconfig");
        let user = format!("\n    token: {token}");
        let text = kubeconfig(&self.url(), Some(&self.app.ca.pem), &user);
        std::fs::write(&path, text).expect("writing the bootstrap kubeconfig");
        path
    }

    /// The admin's kube client in HTTPS mode: trusting the CA, as CN=admin in
    /// system:masters.
    pub(super) fn tls_client(&self) -> kube::Client {
        let (cert, key) = &self.tls().admin;
        let mut config = kube::Config::new(self.url().parse().expect("server url is a URI"));
        config.root_cert = Some(vec![self.app.ca.der.to_vec()]);
        config.auth_info = serde_json::from_value(serde_json::json!({
            "client-certificate-data": b64(cert),
            "client-key-data": b64(key),
        }))
        .expect("a kubeconfig user");
        kube::Client::try_from(config).expect("kube client for the test API server")
    }

    /// Creates the bootstrap token `<id>.<secret>` as kubeadm does: the Secret
    /// `kube-system/bootstrap-token-<id>` of type `bootstrap.kubernetes.io/token`, usable for
    /// authentication and signing, without expiration or extra groups. `id` is 6 characters
    /// of [a-z0-9], `secret` 16.
    pub fn add_bootstrap_token(&self, id: &str, secret: &str) {
        let token = |s: &str, n: usize| {
            s.len() == n
                && s.bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
        };
        assert!(
            token(id, 6) && token(secret, 16),
            "a bootstrap token is [a-z0-9]{{6}}.[a-z0-9]{{16}}"
        );
        let res = super::store::find_resource("", "v1", "secrets").expect("secrets are served");
        let secret = serde_json::json!({"apiVersion": "v1", "kind": "Secret",
            "metadata": {"name": format!("bootstrap-token-{id}"), "namespace": "kube-system"},
            "type": "bootstrap.kubernetes.io/token",
            "stringData": {"token-id": id, "token-secret": secret,
                "usage-bootstrap-authentication": "true", "usage-bootstrap-signing": "true"}});
        self.app
            .store()
            .create(res, "kube-system", secret)
            .expect("creating the bootstrap token Secret");
    }
}
