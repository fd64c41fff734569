//! Service account tokens for projected volumes, from the TokenRequest API
//! (`POST serviceaccounts/<name>/token`), cached and refreshed as upstream's token manager does
//! (`pkg/kubelet/token`, behaviour only): a token is asked for again once 80% of its lifetime
//! has passed or it is older than 24 hours (each less a random jitter of up to 10 seconds);
//! when a refresh fails, the cached token is used while it has not expired.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use chrono::{DateTime, Utc};
use k8s_openapi::api::authentication::v1::{BoundObjectReference, TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::ServiceAccount;
use kube::api::PostParams;
use kube::{Api, Client};

/// A token older than this is refreshed whatever its lifetime.
const MAX_TTL: Duration = Duration::from_secs(24 * 60 * 60);
/// How long a TokenRequest may take.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// The most a refresh is brought forward by, at random.
const MAX_JITTER_SECS: u64 = 10;

/// Why a token could not be had.
#[derive(Debug, thiserror::Error)]
pub enum TokenError {
    /// The node has no API server to ask.
    #[error(
        "cannot request a token for service account {service_account:?}: the node has no API \
         server (standalone)"
    )]
    Standalone { service_account: String },
    /// The TokenRequest took longer than its timeout.
    #[error("requesting a service account token: timed out")]
    Timeout,
    /// The API server refused the TokenRequest: its message, as upstream shows it.
    #[error("{}", .0.message)]
    Refused(#[source] Box<kube::core::Status>),
    /// The TokenRequest could not be made (connection, decoding).
    #[error("requesting a service account token: {0}")]
    Request(#[source] Box<kube::Error>),
    /// The answer lacks a field the token needs (`token`, `expirationTimestamp`,
    /// `spec.expirationSeconds`).
    #[error("the TokenRequest answer has no {0}")]
    Incomplete(&'static str),
    /// The answer's expiration time is not one chrono can hold.
    #[error("the TokenRequest answer's expirationTimestamp is out of range")]
    ExpirationOutOfRange,
}

impl From<kube::Error> for TokenError {
    fn from(e: kube::Error) -> Self {
        match e {
            kube::Error::Api(s) => TokenError::Refused(s),
            e => TokenError::Request(Box::new(e)),
        }
    }
}

/// What a token is asked for.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct TokenKey {
    pub namespace: String,
    pub service_account: String,
    pub audiences: Vec<String>,
    pub expiration_seconds: Option<i64>,
    pub pod_name: String,
    pub pod_uid: String,
}

#[derive(Debug, Clone)]
struct Cached {
    token: String,
    expires: DateTime<Utc>,
    /// The lifetime the API server gave it (the answer's `spec.expirationSeconds`).
    lifetime: i64,
}

impl Cached {
    fn issued(&self) -> DateTime<Utc> {
        self.expires - chrono::Duration::seconds(self.lifetime)
    }

    /// Upstream's `requiresRefresh`, with `jitter` seconds.
    fn requires_refresh(&self, now: DateTime<Utc>, jitter: u64) -> bool {
        let jitter = chrono::Duration::seconds(i64::try_from(jitter).unwrap_or(0));
        let max_ttl = chrono::Duration::from_std(MAX_TTL).unwrap_or(chrono::Duration::zero());
        if now > self.issued() + max_ttl - jitter {
            return true;
        }
        now > self.expires - chrono::Duration::seconds(self.lifetime * 20 / 100) - jitter
    }
}

/// The tokens of the node's pods.
pub struct TokenManager {
    client: Option<Client>,
    cache: Mutex<HashMap<TokenKey, Cached>>,
}

impl TokenManager {
    pub fn new(client: Option<Client>) -> Self {
        TokenManager {
            client,
            cache: Mutex::new(HashMap::new()),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<TokenKey, Cached>> {
        crate::util::lock(&self.cache)
    }

    /// A token for `key`: the cached one while it needs no refresh, else a new one.
    pub async fn token(&self, key: &TokenKey) -> Result<String, TokenError> {
        let Some(client) = &self.client else {
            return Err(TokenError::Standalone {
                service_account: key.service_account.clone(),
            });
        };
        let now = Utc::now();
        let cached = self.lock().get(key).cloned();
        if let Some(c) = &cached
            && !c.requires_refresh(now, fastrand::u64(..MAX_JITTER_SECS))
        {
            return Ok(c.token.clone());
        }
        match request(client, key).await {
            Ok(fresh) => {
                let token = fresh.token.clone();
                self.lock().insert(key.clone(), fresh);
                Ok(token)
            }
            Err(e) => match cached {
                Some(c) if c.expires > now => {
                    tracing::warn!(
                        namespace = %key.namespace,
                        service_account = %key.service_account,
                        "couldn't refresh a token, using the cached one: {e}"
                    );
                    Ok(c.token)
                }
                _ => Err(e),
            },
        }
    }

    /// Forgets the tokens bound to pod `uid`.
    pub fn forget_pod(&self, uid: &str) {
        self.lock().retain(|k, _| k.pod_uid != uid);
    }
}

async fn request(client: &Client, key: &TokenKey) -> Result<Cached, TokenError> {
    let api: Api<ServiceAccount> = Api::namespaced(client.clone(), &key.namespace);
    let req = TokenRequest {
        spec: Some(TokenRequestSpec {
            audiences: Some(key.audiences.clone()).filter(|a| !a.is_empty()),
            expiration_seconds: key.expiration_seconds,
            bound_object_ref: Some(BoundObjectReference {
                api_version: Some("v1".into()),
                kind: Some("Pod".into()),
                name: Some(key.pod_name.clone()),
                uid: Some(key.pod_uid.clone()),
            }),
            ..Default::default()
        }),
        ..Default::default()
    };
    let params = PostParams::default();
    let asked = api.create_token_request(&key.service_account, &params, &req);
    let answer = tokio::time::timeout(REQUEST_TIMEOUT, asked)
        .await
        .map_err(|_| TokenError::Timeout)??;
    let status = answer.status.unwrap_or_default();
    let token = status
        .token
        .filter(|t| !t.is_empty())
        .ok_or(TokenError::Incomplete("token"))?;
    let expires = status
        .expiration_timestamp
        .ok_or(TokenError::Incomplete("expirationTimestamp"))?
        .0;
    let expires = DateTime::from_timestamp(
        expires.as_second(),
        u32::try_from(expires.subsec_nanosecond()).unwrap_or(0),
    )
    .ok_or(TokenError::ExpirationOutOfRange)?;
    let lifetime = answer
        .spec
        .and_then(|s| s.expiration_seconds)
        .ok_or(TokenError::Incomplete("spec.expirationSeconds"))?;
    Ok(Cached {
        token,
        expires,
        lifetime,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(s: &str) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(s)
            .expect("a time")
            .with_timezone(&Utc)
    }

    #[test]
    fn refresh_after_80_percent_or_24_hours() {
        // An hour's token issued at 10:00.
        let c = Cached {
            token: "t".into(),
            expires: at("2026-01-01T11:00:00Z"),
            lifetime: 3600,
        };
        assert!(!c.requires_refresh(at("2026-01-01T10:47:59Z"), 0));
        assert!(c.requires_refresh(at("2026-01-01T10:48:01Z"), 0));
        // The jitter brings it forward by up to 10 s.
        assert!(c.requires_refresh(at("2026-01-01T10:47:55Z"), 9));
        // A year's token is refreshed after a day.
        let long = Cached {
            token: "t".into(),
            expires: at("2027-01-01T10:00:00Z"),
            lifetime: 365 * 24 * 3600,
        };
        assert!(!long.requires_refresh(at("2026-01-02T09:59:00Z"), 0));
        assert!(long.requires_refresh(at("2026-01-02T10:00:01Z"), 0));
    }
}
