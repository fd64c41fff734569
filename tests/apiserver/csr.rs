//! CertificateSigningRequests (`certificates.k8s.io/v1`) as kube-apiserver's registry keeps
//! them (`pkg/registry/certificates`, `pkg/apis/certificates/validation`). On create the
//! requester's identity replaces `spec.username`, `spec.groups`, `spec.uid` and `spec.extra`
//! and the status is cleared; `spec.request` must be a PEM `CERTIFICATE REQUEST` whose
//! signature checks (failures worded as Go's `x509` words them), `spec.signerName` a
//! `domain/path` as `ValidateSignerName` checks it (with apimachinery's messages),
//! `spec.usages` known ones without repeats, `spec.expirationSeconds` at least 600; the name
//! may be any path segment (`ValidateCertificateRequestName` takes any, store.rs). Updates of the object keep its spec and
//! status; `/status` may set the certificate (once: PEM CERTIFICATE blocks only) and
//! conditions other than Approved and Denied; `/approval` changes only the conditions.
//! Approved, Denied and Failed conditions are "True" only and never removed; Approved and
//! Denied exclude each other. Condition timestamps are filled in. The approver and the
//! signer are in `signer.rs`.

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use serde_json::{Value, json};
use x509_parser::certification_request::X509CertificationRequest;
use x509_parser::prelude::{FromDer, X509Certificate};

use super::auth::User;
use super::store::{ApiError, Part, Resource, now};

/// kube's `allValidUsages`, sorted as its messages list them.
pub const USAGES: &[&str] = &[
    "any",
    "cert sign",
    "client auth",
    "code signing",
    "content commitment",
    "crl sign",
    "data encipherment",
    "decipher only",
    "digital signature",
    "email protection",
    "encipher only",
    "ipsec end system",
    "ipsec tunnel",
    "ipsec user",
    "key agreement",
    "key encipherment",
    "microsoft sgc",
    "netscape sgc",
    "ocsp signing",
    "s/mime",
    "server auth",
    "signing",
    "timestamping",
];

/// The CSR strategy's `PrepareForCreate`: the requester's identity, no status.
pub fn prepare_create(user: &User, body: &mut Value) {
    let Some(obj) = body.as_object_mut() else {
        return;
    };
    let spec = obj.entry("spec").or_insert_with(|| json!({}));
    if let Some(spec) = spec.as_object_mut() {
        spec.remove("uid");
        spec.remove("extra");
        spec.insert("username".into(), json!(user.name));
        spec.insert("groups".into(), json!(user.groups));
    }
    obj.insert("status".into(), json!({}));
}

/// PEM blocks as Go's `pem.Decode` finds them, in order: (type, has headers, DER). Text
/// around blocks and blocks whose body is not base64 are skipped.
pub fn pem_blocks(data: &[u8]) -> Vec<(String, bool, Vec<u8>)> {
    let text = String::from_utf8_lossy(data);
    let mut lines = text.lines().map(str::trim);
    let mut blocks = Vec::new();
    while let Some(line) = lines.next() {
        let Some(label) = line
            .strip_prefix("-----BEGIN ")
            .and_then(|l| l.strip_suffix("-----"))
        else {
            continue;
        };
        let end = format!("-----END {label}-----");
        let (mut headers, mut body, mut ended) = (false, String::new(), false);
        for l in lines.by_ref() {
            if l == end {
                ended = true;
                break;
            }
            if body.is_empty() && l.contains(':') {
                headers = true;
            } else {
                body.push_str(l);
            }
        }
        if let (true, Ok(der)) = (ended, STANDARD.decode(&body)) {
            blocks.push((label.to_string(), headers, der));
        }
    }
    blocks
}

/// kube's `certificates.ParseCSR` and `CheckSignature`: the DER of the first PEM block, a
/// CERTIFICATE REQUEST whose signature verifies with its own key.
pub fn request_der(pem: &[u8]) -> Result<Vec<u8>, String> {
    let der = match pem_blocks(pem).into_iter().next() {
        Some((label, _, der)) if label == "CERTIFICATE REQUEST" => der,
        _ => return Err("PEM block type must be CERTIFICATE REQUEST".into()),
    };
    let (_, req) = X509CertificationRequest::from_der(&der)
        .map_err(|_| "x509: malformed certificate request".to_string())?;
    // Go's `checkSignature` words the failure by the key's algorithm.
    req.verify_signature().map_err(|_| {
        let alg = req
            .certification_request_info
            .subject_pki
            .algorithm
            .algorithm
            .to_id_string();
        match alg.as_str() {
            "1.2.840.10045.2.1" => "x509: ECDSA verification failure",
            "1.3.101.112" => "x509: Ed25519 verification failure",
            "1.2.840.113549.1.1.1" => "crypto/rsa: verification error",
            _ => "x509: signature verification failure",
        }
        .to_string()
    })?;
    Ok(der)
}

/// `validateCertificate`: PEM CERTIFICATE blocks, no headers, each a certificate.
fn check_certificates(pem: &[u8]) -> Result<(), String> {
    let blocks = pem_blocks(pem);
    if blocks.is_empty() {
        return Err("must contain at least one CERTIFICATE PEM block".into());
    }
    for (label, headers, der) in blocks {
        if label != "CERTIFICATE" {
            return Err(format!(
                "only CERTIFICATE PEM blocks are allowed, found \"{label}\""
            ));
        }
        if headers {
            return Err("no PEM block headers are permitted".into());
        }
        X509Certificate::from_der(&der).map_err(|e| format!("x509: {e}"))?;
    }
    Ok(())
}

/// A `[]byte` field of the object (base64 in JSON), empty when absent; a 400 as the JSON
/// decoding's when it is not base64.
pub fn bytes_at(obj: &Value, pointer: &str) -> Result<Vec<u8>, ApiError> {
    let bad = |why: String| {
        ApiError::bad_request(format!(
            "CertificateSigningRequest in version \"v1\" cannot be handled as a CertificateSigningRequest: {why}"
        ))
    };
    match obj.pointer(pointer) {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::String(s)) => STANDARD
            .decode(s)
            .map_err(|e| bad(format!("illegal base64 data: {e}"))),
        Some(_) => Err(bad(format!("{pointer}: expected a base64 string"))),
    }
}

/// Go's `%#v` of a `[]byte`, as field errors print invalid values.
fn go_bytes(b: &[u8]) -> String {
    let items: Vec<String> = b.iter().map(|x| format!("0x{x:x}")).collect();
    format!("[]byte{{{}}}", items.join(", "))
}

fn conditions(csr: &Value) -> Vec<Value> {
    csr.pointer("/status/conditions")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default()
}

fn of_type(conds: &[Value], t: &str) -> Vec<Value> {
    conds.iter().filter(|c| c["type"] == t).cloned().collect()
}

/// A field error: (field, cause reason, detail).
type FieldError = (String, &'static str, String);

/// apimachinery's `IsDNS1123Label`: its messages for `l`.
fn dns1123_label(l: &str) -> Vec<String> {
    let mut errs = Vec::new();
    if l.len() > 63 {
        errs.push("must be no more than 63 characters".to_string());
    }
    if !dns1123_label_form(l) {
        if dns1123_subdomain_form(l) {
            errs.push("must not contain dots".into());
        } else {
            errs.push(
                "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')"
                    .into(),
            );
        }
    }
    errs
}

/// apimachinery's `IsDNS1123Subdomain`: its messages for `s`.
fn dns1123_subdomain(s: &str) -> Vec<String> {
    let mut errs = Vec::new();
    if s.len() > 253 {
        errs.push("must be no more than 253 characters".to_string());
    }
    if !dns1123_subdomain_form(s) {
        errs.push(
            "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')"
                .into(),
        );
    }
    errs
}

/// `[a-z0-9]([-a-z0-9]*[a-z0-9])?`, any length.
fn dns1123_label_form(l: &str) -> bool {
    let b = l.as_bytes();
    let alnum = |c: &u8| c.is_ascii_lowercase() || c.is_ascii_digit();
    !b.is_empty()
        && alnum(&b[0])
        && alnum(&b[b.len() - 1])
        && b.iter().all(|c| alnum(c) || *c == b'-')
}

/// Labels of that form separated by dots, any length.
fn dns1123_subdomain_form(s: &str) -> bool {
    s.split('.').all(dns1123_label_form)
}

/// `ValidateSignerName` (pkg/apis/core/validation): every error's detail, in its order.
fn check_signer(name: &str) -> Vec<String> {
    let form = "must be a fully qualified domain and path of the form 'example.com/signer-name'";
    let segments: Vec<&str> = name.split('/').collect();
    let [domain, path] = segments.as_slice() else {
        return vec![format!("Invalid value: \"{name}\": {form}")];
    };
    let mut errs = Vec::new();
    if domain.len() > 253 {
        errs.push("Too long: may not be more than 253 bytes".to_string());
    }
    let labels: Vec<&str> = domain.split('.').collect();
    if let Some((lbl, bad)) = labels
        .iter()
        .map(|l| (l, dns1123_label(l)))
        .find(|(_, e)| !e.is_empty())
    {
        for e in bad {
            errs.push(format!(
                "Invalid value: \"{domain}\": validating label \"{lbl}\": {e}"
            ));
        }
    }
    if labels.len() < 2 {
        errs.push(format!(
            "Invalid value: \"{domain}\": should be a domain with at least two segments separated by dots"
        ));
    }
    if let Some((lbl, bad)) = path
        .split('.')
        .map(|l| (l, dns1123_subdomain(l)))
        .find(|(_, e)| !e.is_empty())
    {
        for e in bad {
            errs.push(format!(
                "Invalid value: \"{path}\": validating label \"{lbl}\": {e}"
            ));
        }
    }
    // A DNS-1123 subdomain, a label and a '.' for the path, and the '/'.
    let max = 253 + (253 + 63 + 1) + 1;
    if name.len() > max {
        errs.push(format!("Too long: may not be more than {max} bytes"));
    }
    errs
}

/// `validateCertificateSigningRequest` (with the update options when `old` is given).
fn validate(csr: &Value, old: Option<&Value>) -> Result<Vec<FieldError>, ApiError> {
    let mut errs: Vec<FieldError> = Vec::new();
    let request = bytes_at(csr, "/spec/request")?;
    if let Err(e) = request_der(&request) {
        let detail = format!("Invalid value: {}: {e}", go_bytes(&request));
        errs.push(("spec.request".into(), "FieldValueInvalid", detail));
    }
    let usages: Vec<String> = csr
        .pointer("/spec/usages")
        .and_then(Value::as_array)
        .map(|u| {
            u.iter()
                .map(|v| v.as_str().unwrap_or("").to_string())
                .collect()
        })
        .unwrap_or_default();
    if usages.is_empty() {
        errs.push((
            "spec.usages".into(),
            "FieldValueRequired",
            "Required value".into(),
        ));
    }
    let had = |f: &dyn Fn(&Value) -> bool| old.is_some_and(f);
    let unknown = |c: &Value| {
        c.pointer("/spec/usages")
            .and_then(Value::as_array)
            .is_some_and(|u| {
                u.iter()
                    .any(|v| !USAGES.contains(&v.as_str().unwrap_or("")))
            })
    };
    for (i, u) in usages.iter().enumerate() {
        if !USAGES.contains(&u.as_str()) && !had(&unknown) {
            let all: Vec<String> = USAGES.iter().map(|u| format!("\"{u}\"")).collect();
            let detail = format!(
                "Unsupported value: \"{u}\": supported values: {}",
                all.join(", ")
            );
            errs.push((
                format!("spec.usages[{i}]"),
                "FieldValueNotSupported",
                detail,
            ));
        }
        if usages[..i].contains(u) {
            let detail = format!("Duplicate value: \"{u}\"");
            errs.push((format!("spec.usages[{i}]"), "FieldValueDuplicate", detail));
        }
    }
    let signer = csr
        .pointer("/spec/signerName")
        .and_then(Value::as_str)
        .unwrap_or("");
    if signer.is_empty() {
        errs.push((
            "spec.signerName".into(),
            "FieldValueRequired",
            "Required value".into(),
        ));
    } else if signer == "kubernetes.io/legacy-unknown" {
        let detail = format!(
            "Invalid value: \"{signer}\": the legacy signerName is not allowed via this API version"
        );
        errs.push(("spec.signerName".into(), "FieldValueInvalid", detail));
    } else {
        for detail in check_signer(signer) {
            let cause = if detail.starts_with("Too long") {
                "FieldValueTooLong"
            } else {
                "FieldValueInvalid"
            };
            errs.push(("spec.signerName".into(), cause, detail));
        }
    }
    if let Some(secs) = csr
        .pointer("/spec/expirationSeconds")
        .and_then(Value::as_i64)
        && secs < 600
    {
        let detail = format!(
            "Invalid value: {secs}: may not specify a duration less than 600 seconds (10 minutes)"
        );
        errs.push(("spec.expirationSeconds".into(), "FieldValueInvalid", detail));
    }
    let conds = conditions(csr);
    let old_conds = old.map(conditions).unwrap_or_default();
    let old_types: Vec<&str> = old_conds
        .iter()
        .map(|c| c["type"].as_str().unwrap_or(""))
        .collect();
    let both_before = old_types.contains(&"Approved") && old_types.contains(&"Denied");
    let dup_before = old_types
        .iter()
        .enumerate()
        .any(|(i, t)| old_types[..i].contains(t));
    let (mut approved, mut denied, mut seen) = (false, false, Vec::new());
    for (i, c) in conds.iter().enumerate() {
        let t = c["type"].as_str().unwrap_or("");
        let status = c["status"].as_str().unwrap_or("");
        let field = |f: &str| format!("status.conditions[{i}].{f}");
        if t.is_empty() && !old_types.contains(&"") {
            errs.push((field("type"), "FieldValueRequired", "Required value".into()));
        }
        let true_only = ["Approved", "Denied", "Failed"].contains(&t);
        let allowed: &[&str] = if true_only {
            &["True"]
        } else {
            &["False", "True", "Unknown"]
        };
        if status.is_empty() {
            errs.push((
                field("status"),
                "FieldValueRequired",
                "Required value".into(),
            ));
        } else if !allowed.contains(&status) {
            let all: Vec<String> = allowed.iter().map(|s| format!("\"{s}\"")).collect();
            let detail = format!(
                "Unsupported value: \"{status}\": supported values: {}",
                all.join(", ")
            );
            errs.push((field("status"), "FieldValueNotSupported", detail));
        }
        if !both_before && ((t == "Approved" && denied) || (t == "Denied" && approved)) {
            let detail = format!(
                "Invalid value: \"{t}\": Approved and Denied conditions are mutually exclusive"
            );
            errs.push((field("type"), "FieldValueInvalid", detail));
        }
        approved |= t == "Approved";
        denied |= t == "Denied";
        if seen.contains(&t) && !dup_before {
            errs.push((
                field("type"),
                "FieldValueDuplicate",
                format!("Duplicate value: \"{t}\""),
            ));
        }
        seen.push(t);
    }
    let cert = bytes_at(csr, "/status/certificate")?;
    let unchanged = match old {
        Some(o) => bytes_at(o, "/status/certificate").is_ok_and(|c| c == cert),
        None => false,
    };
    if !cert.is_empty()
        && !unchanged
        && let Err(e) = check_certificates(&cert)
    {
        let detail = format!("Invalid value: \"<certificate data>\": {e}");
        errs.push(("status.certificate".into(), "FieldValueInvalid", detail));
    }
    Ok(errs)
}

fn name_of(csr: &Value) -> &str {
    csr.pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or("")
}

fn fail(res: &Resource, name: &str, errs: Vec<FieldError>) -> Result<(), ApiError> {
    if errs.is_empty() {
        return Ok(());
    }
    let errs: Vec<(&str, &str, &str)> = errs
        .iter()
        .map(|(f, r, d)| (f.as_str(), *r, d.as_str()))
        .collect();
    Err(ApiError::invalid_all(res, name, &errs))
}

/// `ValidateCertificateSigningRequestCreate`, after the name is known.
pub fn validate_create(res: &Resource, name: &str, csr: &Value) -> Result<(), ApiError> {
    fail(res, name, validate(csr, None)?)
}

/// `populateConditionTimestamps`: a missing lastUpdateTime is now; a missing
/// lastTransitionTime is the old one of a condition of the same type and status, or now.
fn stamp(next: &mut Value, old: &Value) {
    let old_conds = conditions(old);
    let Some(conds) = next
        .pointer_mut("/status/conditions")
        .and_then(Value::as_array_mut)
    else {
        return;
    };
    let t = now();
    for c in conds.iter_mut().filter(|c| c.is_object()) {
        if c["lastUpdateTime"].as_str().is_none_or(str::is_empty) {
            c["lastUpdateTime"] = json!(t);
        }
        if c["lastTransitionTime"].as_str().is_none_or(str::is_empty) {
            let before = old_conds.iter().find(|o| {
                o["type"] == c["type"]
                    && o["status"] == c["status"]
                    && o["lastTransitionTime"]
                        .as_str()
                        .is_some_and(|s| !s.is_empty())
            });
            c["lastTransitionTime"] = before.map_or(json!(t), |o| o["lastTransitionTime"].clone());
        }
    }
}

/// Sets `next`'s status conditions (removing the field when `conds` is `None`).
fn set_conditions(next: &mut Value, conds: Option<Value>) {
    if !next.get("status").is_some_and(Value::is_object) {
        next["status"] = json!({});
    }
    if let Some(status) = next["status"].as_object_mut() {
        match conds {
            Some(c) => status.insert("conditions".into(), c),
            None => status.remove("conditions"),
        };
    }
}

/// The strategies' `PrepareForUpdate` and `ValidateUpdate` for the object, `/status` and
/// `/approval`: `next` is what the store would write.
pub fn prepare_update(
    res: &Resource,
    name: &str,
    old: &Value,
    next: &mut Value,
    part: Part,
) -> Result<(), ApiError> {
    if let Some(spec) = old.get("spec") {
        next["spec"] = spec.clone();
    }
    match part {
        Part::Main | Part::Resize => {
            if let Some(status) = old.get("status") {
                next["status"] = status.clone();
            }
        }
        Part::Status => {
            // Approved and Denied conditions are kept as they were (when as many).
            let mut conds = conditions(next);
            let old_conds = conditions(old);
            for t in ["Approved", "Denied"] {
                let at = |cs: &[Value]| -> Vec<usize> {
                    (0..cs.len()).filter(|i| cs[*i]["type"] == t).collect()
                };
                let (o, n) = (at(&old_conds), at(&conds));
                if o.len() == n.len() {
                    for (oi, ni) in o.into_iter().zip(n) {
                        conds[ni] = old_conds[oi].clone();
                    }
                }
            }
            if next.pointer("/status/conditions").is_some() {
                set_conditions(next, Some(json!(conds)));
            }
            stamp(next, old);
        }
        Part::Approval => {
            let conds = next.pointer("/status/conditions").cloned();
            next["status"] = old.get("status").cloned().unwrap_or_else(|| json!({}));
            set_conditions(next, conds);
            stamp(next, old);
        }
    }
    let mut errs = validate(next, Some(old))?;
    let (old_conds, new_conds) = (conditions(old), conditions(next));
    for t in ["Approved", "Denied", "Failed"] {
        let (o, n) = (of_type(&old_conds, t), of_type(&new_conds, t));
        if n.len() < o.len() {
            let detail = format!("Forbidden: updates may not remove a condition of type \"{t}\"");
            errs.push(("status.conditions".into(), "FieldValueForbidden", detail));
        } else if part != Part::Approval && t != "Failed" && n.len() > o.len() {
            let detail = format!("Forbidden: updates may not add a condition of type \"{t}\"");
            errs.push(("status.conditions".into(), "FieldValueForbidden", detail));
        } else if part != Part::Approval && t != "Failed" && n != o {
            let detail = format!("Forbidden: updates may not modify a condition of type \"{t}\"");
            errs.push(("status.conditions".into(), "FieldValueForbidden", detail));
        }
    }
    let (old_cert, new_cert) = (
        bytes_at(old, "/status/certificate")?,
        bytes_at(next, "/status/certificate")?,
    );
    if old_cert != new_cert {
        let detail = if part != Part::Status {
            Some("Forbidden: updates may not set certificate content")
        } else if !old_cert.is_empty() {
            Some("Forbidden: updates may not modify existing certificate content")
        } else {
            None
        };
        if let Some(d) = detail {
            errs.push(("status.certificate".into(), "FieldValueForbidden", d.into()));
        }
    }
    let name = if name.is_empty() { name_of(next) } else { name };
    fail(res, name, errs)
}
