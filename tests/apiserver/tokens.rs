//! `POST serviceaccounts/<name>/token` (TokenRequest) as kube-apiserver answers it: the
//! service account must exist; `expirationSeconds` defaults to 3600, may not be under 10
//! minutes, and is capped by the server's maximum (`--service-account-max-token-expiration`,
//! [`super::ApiServer::set_max_token_expiration`]); audiences default to the server's; a bound
//! pod must exist with the UID given and run as that service account. The token is a JWT with
//! kube-apiserver's claims, signed with a key only this server knows (it recognises its tokens
//! by lookup: TokenReview authenticates them as the service account). Tokens are not stored as
//! objects; each issued one is recorded for the tests.

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use super::store::{ApiError, Store, find_resource};

/// The audience of tokens that ask for none (kube-apiserver's default: its issuer).
pub const DEFAULT_AUDIENCE: &str = "https://kubernetes.default.svc.cluster.local";

/// One token the server issued.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IssuedToken {
    pub token: String,
    pub namespace: String,
    pub service_account: String,
    pub audiences: Vec<String>,
    /// The pod it is bound to: name and UID.
    pub pod: Option<(String, String)>,
    /// Its lifetime, after the server's cap.
    pub expiration_seconds: i64,
    pub issued_at: chrono::DateTime<chrono::Utc>,
}

/// Answers a TokenRequest for `ns/name`: the TokenRequest with its status, and the record.
pub fn issue(
    store: &mut Store,
    ns: &str,
    name: &str,
    body: &[u8],
    max_expiration: Option<i64>,
) -> Result<(Value, IssuedToken), ApiError> {
    let sa_res = find_resource("", "v1", "serviceaccounts").ok_or_else(ApiError::path_not_found)?;
    let pod_res = find_resource("", "v1", "pods").ok_or_else(ApiError::path_not_found)?;
    let mut req: Value = serde_json::from_slice(body).map_err(|e| {
        ApiError::bad_request(format!(
            "the object provided is unrecognized (must be of type TokenRequest): {e}"
        ))
    })?;
    let sa = store.get(sa_res, ns, name)?;
    let invalid = |field: &str, detail: String| {
        let mut e = ApiError::new(
            422,
            "Invalid",
            format!("TokenRequest.authentication.k8s.io \"{name}\" is invalid: {field}: {detail}"),
        );
        e.details = Some(json!({"name": name, "group": "authentication.k8s.io",
            "kind": "TokenRequest", "causes": [{"reason": "FieldValueInvalid",
            "message": detail, "field": field}]}));
        e
    };
    let asked = req
        .pointer("/spec/expirationSeconds")
        .and_then(Value::as_i64)
        .unwrap_or(3600);
    if asked < 600 {
        return Err(invalid(
            "spec.expirationSeconds",
            format!("Invalid value: {asked}: may not specify a duration less than 10 minutes"),
        ));
    }
    if asked > 1 << 32 {
        return Err(invalid(
            "spec.expirationSeconds",
            format!("Invalid value: {asked}: may not specify a duration larger than 2^32 seconds"),
        ));
    }
    let lifetime = match max_expiration {
        Some(max) if asked > max => max,
        _ => asked,
    };
    let mut audiences: Vec<String> = req
        .pointer("/spec/audiences")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|a| a.as_str().map(String::from))
        .collect();
    if audiences.is_empty() {
        audiences.push(DEFAULT_AUDIENCE.to_string());
    }
    let mut pod = None;
    if let Some(bound) = req.pointer("/spec/boundObjectRef").filter(|b| !b.is_null()) {
        let kind = bound["kind"].as_str().unwrap_or("");
        if kind != "Pod" {
            return Err(ApiError::bad_request(format!(
                "cannot bind token to object of type {kind} with the test API server (only Pod)"
            )));
        }
        let pod_name = bound["name"].as_str().unwrap_or("");
        let obj = store.get(pod_res, ns, pod_name)?;
        let uid = obj["metadata"]["uid"].as_str().unwrap_or("").to_string();
        if let Some(want) = bound["uid"].as_str().filter(|u| !u.is_empty())
            && want != uid
        {
            let why = format!(
                "the UID in the bound object reference ({want}) does not match the UID in record. The object might have been deleted and then recreated"
            );
            return Err(ApiError::new(409, "Conflict", why));
        }
        if obj
            .pointer("/spec/serviceAccountName")
            .and_then(Value::as_str)
            != Some(name)
        {
            return Err(ApiError::bad_request(format!(
                "cannot bind token for serviceaccount {name:?} to pod running with different serviceaccount name."
            )));
        }
        pod = Some((pod_name.to_string(), uid));
    }
    let now = chrono::Utc::now();
    let exp = now + chrono::Duration::seconds(lifetime);
    let mut claims = json!({
        "iss": DEFAULT_AUDIENCE,
        "sub": format!("system:serviceaccount:{ns}:{name}"),
        "aud": audiences,
        "iat": now.timestamp(),
        "nbf": now.timestamp(),
        "exp": exp.timestamp(),
        "jti": store.new_uid(),
        "kubernetes.io": {"namespace": ns, "serviceaccount": {"name": name,
            "uid": sa["metadata"]["uid"]}},
    });
    if let Some((pod_name, uid)) = &pod {
        claims["kubernetes.io"]["pod"] = json!({"name": pod_name, "uid": uid});
    }
    let header = URL_SAFE_NO_PAD.encode(json!({"alg": "HS256", "typ": "JWT"}).to_string());
    let payload = URL_SAFE_NO_PAD.encode(claims.to_string());
    let key = store.next().to_le_bytes();
    let signature = URL_SAFE_NO_PAD.encode(
        Sha256::new()
            .chain_update(key)
            .chain_update(format!("{header}.{payload}"))
            .finalize(),
    );
    let token = format!("{header}.{payload}.{signature}");
    req["apiVersion"] = json!("authentication.k8s.io/v1");
    req["kind"] = json!("TokenRequest");
    req["metadata"] = json!({"name": name, "namespace": ns,
        "creationTimestamp": super::store::now()});
    req["spec"]["expirationSeconds"] = json!(lifetime);
    req["spec"]["audiences"] = json!(audiences);
    req["status"] = json!({"token": token,
        "expirationTimestamp": exp.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)});
    let issued = IssuedToken {
        token,
        namespace: ns.to_string(),
        service_account: name.to_string(),
        audiences,
        pod,
        expiration_seconds: lifetime,
        issued_at: now,
    };
    Ok((req, issued))
}

/// The claims of a token this server issued (its middle part, decoded).
pub fn claims(token: &str) -> Option<Value> {
    let payload = token.split('.').nth(1)?;
    serde_json::from_slice(&URL_SAFE_NO_PAD.decode(payload).ok()?).ok()
}
