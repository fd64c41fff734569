//! The test's kube-controller-manager for CertificateSigningRequests: an approver the test
//! controls ([`CsrPolicy`]) and the cluster CA's signer for the kubelet signers.
//!
//! With `Approve` or `Deny`, a pending request (neither Approved nor Denied) gets that
//! condition about 100 ms after the controller saw it, as a separate write through the
//! `approval` subresource (its own resourceVersion, a MODIFIED event). An Approved, not
//! Failed, unsigned request for `kubernetes.io/kube-apiserver-client-kubelet` or
//! `kubernetes.io/kubelet-serving` is then checked as kube-controller-manager's signer checks
//! it (`ValidateKubeletClientCSR` / `ValidateKubeletServingCSR`: subject `O=system:nodes`,
//! CN `system:node:<name>`, the SANs and usages each signer allows) and signed, or marked
//! Failed (`SignerValidationFailure`), through `status`. The certificate is signed as
//! `PermissiveSigningPolicy` does: the request's subject (re-encoded in Go's order) and SANs,
//! key usages and extended key usages from `spec.usages`, not a CA; lifetime the server's
//! ([`ApiServer::set_certificate_lifetime`], 1 h by default), shortened to
//! `spec.expirationSeconds` (not under 10 minutes); NotBefore backdated 5 minutes (by the
//! lifetime when that is shorter, so that a rotation deadline drawn from the validity
//! period is not already past), NotAfter = now + lifetime (less the backdating from 8 h up),
//! never after the CA's.

use std::collections::{HashMap, HashSet};
use std::net::IpAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use rcgen::{
    CertificateParams, ExtendedKeyUsagePurpose, IsCa, KeyUsagePurpose, PublicKeyData, SanType,
    SignatureAlgorithm,
};
use serde_json::{Value, json};
use tokio::sync::mpsc::UnboundedReceiver;
use x509_parser::certification_request::X509CertificationRequest;
use x509_parser::extensions::{GeneralName, ParsedExtension};
use x509_parser::prelude::FromDer;

use super::csr::{bytes_at, request_der};
use super::select::Selector;
use super::store::{ApiError, Change, Part, Resource, Store, find_resource};
use super::tls::{Authority, serial};
use super::{ApiServer, App};

/// How the test's approver answers new CertificateSigningRequests.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum CsrPolicy {
    /// Approve each (reason `AutoApproved`).
    Approve,
    /// Deny each with this reason and message.
    Deny { reason: String, message: String },
    /// Leave them pending ([`ApiServer::approve_csr`], [`ApiServer::deny_csr`], or a
    /// client's `approval` update decides).
    #[default]
    Manual,
}

/// The controller's settings, and the requests' UIDs in the order they were created.
#[derive(Debug)]
pub struct Settings {
    pub policy: CsrPolicy,
    pub lifetime: Duration,
    pub backdate: Duration,
    pub created: Vec<String>,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            policy: CsrPolicy::Manual,
            lifetime: Duration::from_secs(3600),
            backdate: Duration::from_secs(300),
            created: Vec::new(),
        }
    }
}

/// How long after a request appears the approver decides it.
const APPROVAL_DELAY: Duration = Duration::from_millis(100);

fn resource() -> &'static Resource {
    find_resource("certificates.k8s.io", "v1", "certificatesigningrequests")
        .expect("certificatesigningrequests are served")
}

fn has(csr: &Value, t: &str) -> bool {
    csr.pointer("/status/conditions")
        .and_then(Value::as_array)
        .is_some_and(|cs| cs.iter().any(|c| c["type"] == t && c["status"] == "True"))
}

/// Adds an Approved (or Denied) condition through `approval`, as `kubectl certificate
/// approve` (or `deny`) does.
fn decide(
    store: &mut Store,
    name: &str,
    approve: bool,
    reason: &str,
    message: &str,
) -> Result<Value, ApiError> {
    let res = resource();
    let mut csr = store.get(res, "", name)?;
    let t = if approve { "Approved" } else { "Denied" };
    let cond = json!({"type": t, "status": "True", "reason": reason, "message": message});
    match csr
        .pointer_mut("/status/conditions")
        .and_then(Value::as_array_mut)
    {
        Some(cs) => cs.push(cond),
        None => csr["status"] = json!({"conditions": [cond]}),
    }
    store
        .update(res, "", name, csr, Part::Approval)
        .map(|(_, o)| o)
}

/// Why a request was not signed: refused by the signer's checks (the request is marked
/// Failed), or not signable here (logged, left alone).
enum Refusal {
    Validation(String),
    Error(String),
}

/// The request's public key, for rcgen to put in the certificate.
struct RequestKey {
    raw: Vec<u8>,
    alg: &'static SignatureAlgorithm,
}

impl PublicKeyData for RequestKey {
    fn der_bytes(&self) -> &[u8] {
        &self.raw
    }

    fn algorithm(&self) -> &'static SignatureAlgorithm {
        self.alg
    }
}

/// `keyUsagesFromStrings`.
fn usages(
    names: &[String],
) -> Result<(Vec<KeyUsagePurpose>, Vec<ExtendedKeyUsagePurpose>), String> {
    use ExtendedKeyUsagePurpose as E;
    use KeyUsagePurpose as K;
    let (mut ku, mut eku) = (Vec::new(), Vec::new());
    for n in names {
        let k = match n.as_str() {
            "signing" | "digital signature" => Some(K::DigitalSignature),
            "content commitment" => Some(K::ContentCommitment),
            "key encipherment" => Some(K::KeyEncipherment),
            "key agreement" => Some(K::KeyAgreement),
            "data encipherment" => Some(K::DataEncipherment),
            "cert sign" => Some(K::KeyCertSign),
            "crl sign" => Some(K::CrlSign),
            "encipher only" => Some(K::EncipherOnly),
            "decipher only" => Some(K::DecipherOnly),
            _ => None,
        };
        let e = match n.as_str() {
            "any" => Some(E::Any),
            "server auth" => Some(E::ServerAuth),
            "client auth" => Some(E::ClientAuth),
            "code signing" => Some(E::CodeSigning),
            "email protection" | "s/mime" => Some(E::EmailProtection),
            "ipsec end system" => Some(E::Other(vec![1, 3, 6, 1, 5, 5, 7, 3, 5])),
            "ipsec tunnel" => Some(E::Other(vec![1, 3, 6, 1, 5, 5, 7, 3, 6])),
            "ipsec user" => Some(E::Other(vec![1, 3, 6, 1, 5, 5, 7, 3, 7])),
            "timestamping" => Some(E::TimeStamping),
            "ocsp signing" => Some(E::OcspSigning),
            "microsoft sgc" => Some(E::Other(vec![1, 3, 6, 1, 4, 1, 311, 10, 3, 3])),
            "netscape sgc" => Some(E::Other(vec![2, 16, 840, 1, 113730, 4, 1])),
            _ => None,
        };
        match (k, e) {
            (Some(k), _) if !ku.contains(&k) => ku.push(k),
            (_, Some(e)) if !eku.contains(&e) => eku.push(e),
            (None, None) => return Err(format!("unrecognized usage: {n}")),
            _ => {}
        }
    }
    Ok((ku, eku))
}

/// `ValidateKubeletClientCSR` and `ValidateKubeletServingCSR`.
fn check_kubelet(
    signer: &str,
    orgs: &[String],
    cn: &str,
    sans: &[SanType],
    names: &[String],
) -> Result<(), String> {
    if orgs != ["system:nodes"] {
        return Err("subject organization is not system:nodes".into());
    }
    let count = |f: fn(&SanType) -> bool| sans.iter().filter(|s| f(s)).count();
    let (dns, ips) = (
        count(|s| matches!(s, SanType::DnsName(_))),
        count(|s| matches!(s, SanType::IpAddress(_))),
    );
    let (emails, uris) = (
        count(|s| matches!(s, SanType::Rfc822Name(_))),
        count(|s| matches!(s, SanType::URI(_))),
    );
    let mut set: Vec<&str> = names.iter().map(String::as_str).collect();
    set.sort_unstable();
    set.dedup();
    let serving = signer == "kubernetes.io/kubelet-serving";
    if serving {
        if dns == 0 && ips == 0 {
            return Err("DNS or IP subjectAltName is required".into());
        }
    } else if dns > 0 {
        return Err("DNS subjectAltNames are not allowed".into());
    }
    if emails > 0 {
        return Err("Email subjectAltNames are not allowed".into());
    }
    if !serving && ips > 0 {
        return Err("IP subjectAltNames are not allowed".into());
    }
    if uris > 0 {
        return Err("URI subjectAltNames are not allowed".into());
    }
    let auth = if serving {
        "server auth"
    } else {
        "client auth"
    };
    let with_rsa = {
        let mut v = vec!["digital signature", "key encipherment", auth];
        v.sort_unstable();
        v
    };
    let mut without = vec!["digital signature", auth];
    without.sort_unstable();
    let check_cn = || {
        if cn.starts_with("system:node:") {
            Ok(())
        } else {
            Err("subject common name does not begin with system:node:".to_string())
        }
    };
    if !serving {
        check_cn()?;
    }
    if set != with_rsa && set != without {
        // Go's `%v` of the sorted set: `[client auth digital signature key encipherment]`.
        return Err(format!("usages did not match [{}]", with_rsa.join(" ")));
    }
    check_cn()
}

/// Signs the request of `csr` with the CA, or says why not.
fn sign(
    ca: &Authority,
    csr: &Value,
    lifetime: Duration,
    backdate: Duration,
) -> Result<String, Refusal> {
    let err = |e: String| Refusal::Error(e);
    let signer = csr
        .pointer("/spec/signerName")
        .and_then(Value::as_str)
        .unwrap_or("");
    let names: Vec<String> = csr
        .pointer("/spec/usages")
        .and_then(Value::as_array)
        .map(|u| {
            u.iter()
                .filter_map(|v| v.as_str().map(String::from))
                .collect()
        })
        .unwrap_or_default();
    let pem = bytes_at(csr, "/spec/request").map_err(|e| err(e.message))?;
    let der = request_der(&pem).map_err(err)?;
    let (_, req) = X509CertificationRequest::from_der(&der).map_err(|e| err(e.to_string()))?;
    let info = &req.certification_request_info;
    let orgs: Vec<String> = info
        .subject
        .iter_organization()
        .filter_map(|a| a.as_str().ok().map(String::from))
        .collect();
    let cn = info
        .subject
        .iter_common_name()
        .find_map(|a| a.as_str().ok().map(String::from))
        .unwrap_or_default();
    let mut sans = Vec::new();
    for ext in req.requested_extensions().into_iter().flatten() {
        let ParsedExtension::SubjectAlternativeName(san) = ext else {
            continue;
        };
        for n in &san.general_names {
            let ia5 = |s: &str| {
                s.to_string()
                    .try_into()
                    .map_err(|_| err(format!("SAN {s}")))
            };
            sans.push(match n {
                GeneralName::DNSName(s) => SanType::DnsName(ia5(s)?),
                GeneralName::RFC822Name(s) => SanType::Rfc822Name(ia5(s)?),
                GeneralName::URI(s) => SanType::URI(ia5(s)?),
                GeneralName::IPAddress(b) => SanType::IpAddress(match b.len() {
                    4 => IpAddr::from(<[u8; 4]>::try_from(*b).map_err(|_| err("IP".into()))?),
                    16 => IpAddr::from(<[u8; 16]>::try_from(*b).map_err(|_| err("IP".into()))?),
                    _ => return Err(err("an IP SAN of neither 4 nor 16 bytes".into())),
                }),
                other => return Err(err(format!("unsupported SAN {other:?}"))),
            });
        }
    }
    check_kubelet(signer, &orgs, &cn, &sans, &names).map_err(Refusal::Validation)?;
    let (ku, eku) = usages(&names).map_err(err)?;
    let spki = &info.subject_pki;
    let alg_oid = spki.algorithm.algorithm.to_id_string();
    let curve = spki
        .algorithm
        .parameters
        .as_ref()
        .and_then(|p| p.as_oid().ok())
        .map(|o| o.to_id_string())
        .unwrap_or_default();
    let alg: &'static SignatureAlgorithm = match (alg_oid.as_str(), curve.as_str()) {
        ("1.2.840.10045.2.1", "1.2.840.10045.3.1.7") => &rcgen::PKCS_ECDSA_P256_SHA256,
        ("1.2.840.10045.2.1", "1.3.132.0.34") => &rcgen::PKCS_ECDSA_P384_SHA384,
        ("1.2.840.113549.1.1.1", _) => &rcgen::PKCS_RSA_SHA256,
        ("1.3.101.112", _) => &rcgen::PKCS_ED25519,
        _ => return Err(err(format!("unsupported public key {alg_oid} {curve}"))),
    };
    let key = RequestKey {
        raw: spki.subject_public_key.data.to_vec(),
        alg,
    };
    let mut params = CertificateParams::default();
    let orgs: Vec<&str> = orgs.iter().map(String::as_str).take(2).collect();
    params.distinguished_name = super::tls::subject(&cn, &orgs);
    params.subject_alt_names = sans;
    params.key_usages = ku;
    params.extended_key_usages = eku;
    params.is_ca = IsCa::ExplicitNoCa;
    params.use_authority_key_identifier_extension = true;
    params.serial_number = Some(serial());
    let ttl = match csr
        .pointer("/spec/expirationSeconds")
        .and_then(Value::as_u64)
    {
        Some(s) => Duration::from_secs(s.max(600)).min(lifetime),
        None => lifetime,
    };
    let backdate = backdate.min(ttl);
    let now = time::OffsetDateTime::now_utc();
    params.not_before = now - backdate;
    params.not_after = if ttl < Duration::from_secs(8 * 3600) {
        now + ttl
    } else {
        now + ttl - backdate
    };
    params.not_after = params.not_after.min(ca.not_after);
    let cert = ca.sign(&params, &key).map_err(|e| err(e.to_string()))?;
    Ok(cert.pem())
}

/// One pass over the requests: decides and signs what is due; when the next decision is.
fn reconcile(
    app: &App,
    seen: &mut HashMap<String, Instant>,
    given_up: &mut HashSet<String>,
) -> Option<Instant> {
    let settings = app.csr.lock().unwrap_or_else(|e| e.into_inner());
    let (policy, lifetime, backdate) = (
        settings.policy.clone(),
        settings.lifetime,
        settings.backdate,
    );
    drop(settings);
    let res = resource();
    let mut store = app.store();
    let csrs = store.select(res, None, &Selector::default());
    let now = Instant::now();
    let uids: HashSet<String> = csrs
        .iter()
        .map(|(_, c)| c["metadata"]["uid"].as_str().unwrap_or("").to_string())
        .collect();
    seen.retain(|u, _| uids.contains(u));
    let mut next: Option<Instant> = None;
    for (_, csr) in csrs {
        let uid = csr["metadata"]["uid"].as_str().unwrap_or("").to_string();
        let name = csr["metadata"]["name"].as_str().unwrap_or("").to_string();
        let first = *seen.entry(uid.clone()).or_insert(now);
        let approved = has(&csr, "Approved");
        if !approved && !has(&csr, "Denied") {
            let due = first + APPROVAL_DELAY;
            let decided = match &policy {
                CsrPolicy::Manual => continue,
                _ if due > now => {
                    next = Some(next.map_or(due, |n| n.min(due)));
                    continue;
                }
                CsrPolicy::Approve => decide(
                    &mut store,
                    &name,
                    true,
                    "AutoApproved",
                    "Auto approving by the test API server's CSR policy",
                ),
                CsrPolicy::Deny { reason, message } => {
                    decide(&mut store, &name, false, reason, message)
                }
            };
            if let Err(e) = decided {
                eprintln!("apiserver: deciding CSR {name}: {}", e.message);
            }
            continue;
        }
        let signer = csr
            .pointer("/spec/signerName")
            .and_then(Value::as_str)
            .unwrap_or("");
        let ours = [
            "kubernetes.io/kube-apiserver-client-kubelet",
            "kubernetes.io/kubelet-serving",
        ];
        let signed = csr
            .pointer("/status/certificate")
            .and_then(Value::as_str)
            .is_some_and(|c| !c.is_empty());
        if !approved
            || has(&csr, "Failed")
            || signed
            || !ours.contains(&signer)
            || given_up.contains(&uid)
        {
            continue;
        }
        let mut update = csr.clone();
        match sign(&app.ca, &csr, lifetime, backdate) {
            Ok(pem) => update["status"]["certificate"] = json!(STANDARD.encode(pem)),
            Err(Refusal::Validation(why)) => {
                let failed = json!({"type": "Failed", "status": "True",
                    "reason": "SignerValidationFailure", "message": why});
                match update["status"]["conditions"].as_array_mut() {
                    Some(cs) => cs.push(failed),
                    None => update["status"]["conditions"] = json!([failed]),
                }
            }
            Err(Refusal::Error(why)) => {
                eprintln!("apiserver: not signing CSR {name}: {why}");
                given_up.insert(uid);
                continue;
            }
        }
        if let Err(e) = store.update(res, "", &name, update, Part::Status) {
            eprintln!("apiserver: writing CSR {name}'s status: {}", e.message);
            given_up.insert(uid);
        }
    }
    next
}

/// Records a request's creation (for [`ApiServer::csrs`]'s order).
pub fn created(app: &App, csr: &Value) {
    let uid = csr["metadata"]["uid"].as_str().unwrap_or("").to_string();
    let mut settings = app.csr.lock().unwrap_or_else(|e| e.into_inner());
    settings.created.push(uid);
}

/// Runs the approver and signer until aborted: a pass whenever a request changes, the
/// policy changes, or a decision comes due.
pub async fn run(app: Arc<App>, mut changes: UnboundedReceiver<Arc<Change>>) {
    let (mut seen, mut given_up) = (HashMap::new(), HashSet::new());
    let res = resource();
    let (mut pass, mut next) = (true, None);
    loop {
        if pass {
            next = reconcile(&app, &mut seen, &mut given_up);
        }
        let due = async {
            match next {
                Some(at) => tokio::time::sleep_until(at.into()).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            change = changes.recv() => {
                let Some(c) = change else { return };
                // Only requests' changes matter; take in everything queued.
                pass = c.res == res;
                while let Ok(c) = changes.try_recv() {
                    pass |= c.res == res;
                }
            }
            _ = app.csr_wake.notified() => pass = true,
            _ = due => pass = true,
        }
    }
}

impl ApiServer {
    /// How the approver answers CertificateSigningRequests from now on (pending ones too).
    pub fn set_csr_policy(&self, p: CsrPolicy) {
        self.app
            .csr
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .policy = p;
        self.app.csr_wake.notify_one();
    }

    /// The lifetime of the certificates the signer issues from now on (1 h by default).
    pub fn set_certificate_lifetime(&self, d: Duration) {
        self.app
            .csr
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .lifetime = d;
        self.app.csr_wake.notify_one();
    }

    /// How far back the signer dates certificates' NotBefore from now on (5 minutes by
    /// default; never more than the lifetime).
    pub fn set_certificate_backdate(&self, d: Duration) {
        self.app
            .csr
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .backdate = d;
    }

    /// Approves the request `name` now (reason `TestApprove`), as `kubectl certificate
    /// approve` would.
    pub fn approve_csr(&self, name: &str) {
        decide(
            &mut self.app.store(),
            name,
            true,
            "TestApprove",
            "This CSR was approved by the test.",
        )
        .unwrap_or_else(|e| panic!("approving CSR {name}: {}", e.message));
    }

    /// Denies the request `name` now with `reason` and `message`.
    pub fn deny_csr(&self, name: &str, reason: &str, message: &str) {
        decide(&mut self.app.store(), name, false, reason, message)
            .unwrap_or_else(|e| panic!("denying CSR {name}: {}", e.message));
    }

    /// The stored CertificateSigningRequests, in the order they were created.
    pub fn csrs(&self) -> Vec<Value> {
        let mut csrs: Vec<Value> = self
            .app
            .store()
            .select(resource(), None, &Selector::default())
            .into_iter()
            .map(|(_, v)| v)
            .collect();
        let settings = self.app.csr.lock().unwrap_or_else(|e| e.into_inner());
        csrs.sort_by_key(|c| {
            let uid = c["metadata"]["uid"].as_str().unwrap_or("");
            settings.created.iter().position(|u| u == uid)
        });
        csrs
    }
}
