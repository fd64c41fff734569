//! Who is asking and whether they may (upstream `pkg/kubelet/server/auth.go` and the webhook
//! authenticator and authorizer): a verified client certificate's subject, else a bearer token
//! reviewed by the API server (TokenReview, results cached for `cacheTTL`), else anonymous
//! when allowed (401 otherwise); then the request's attributes (verb from the method, the
//! `nodes` subresource from the path) authorized by SubjectAccessReview (cached for
//! `cacheAuthorizedTTL`/`cacheUnauthorizedTTL`), trying the fine-grained subresource first and
//! `proxy` after it, as current upstream does, or always allowed with `AlwaysAllow`.

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};
use kube::api::PostParams;

use crate::config::{AuthzMode, ServerConfig};
use crate::util::lock;

/// An authenticated user.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct User {
    pub name: String,
    pub uid: String,
    pub groups: Vec<String>,
    pub extra: BTreeMap<String, Vec<String>>,
}

impl User {
    pub fn anonymous() -> User {
        User {
            name: "system:anonymous".into(),
            uid: String::new(),
            groups: vec!["system:unauthenticated".into()],
            extra: BTreeMap::new(),
        }
    }
}

/// What a request asks, as authorization sees it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Attributes {
    pub verb: String,
    /// The `nodes` subresources to check, in order: the first allowed one wins.
    pub subresources: Vec<&'static str>,
}

/// The attributes of a request (upstream `GetRequestAttributes`): the verb from the HTTP
/// method; `stats`, `metrics`, `log` for their paths; `pods`, `healthz`, `configz` checked
/// before `proxy` for theirs (the fine-grained checks); `proxy` for everything else.
pub fn attributes(method: &http::Method, path: &str) -> Attributes {
    let verb = match *method {
        http::Method::POST => "create",
        http::Method::PUT => "update",
        http::Method::PATCH => "patch",
        http::Method::DELETE => "delete",
        _ => "get",
    };
    let under = |prefix: &str| path == prefix || path.starts_with(&format!("{prefix}/"));
    let subresources: Vec<&'static str> = if under("/stats") {
        vec!["stats"]
    } else if under("/metrics") {
        vec!["metrics"]
    } else if under("/logs") {
        vec!["log"]
    } else if under("/pods") || under("/runningpods") {
        vec!["pods", "proxy"]
    } else if under("/healthz") {
        vec!["healthz", "proxy"]
    } else if under("/configz") {
        vec!["configz", "proxy"]
    } else {
        vec!["proxy"]
    };
    Attributes {
        verb: verb.to_string(),
        subresources,
    }
}

/// Why a request was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refused {
    /// 401.
    Unauthorized,
    /// 403, with upstream's text.
    Forbidden(String),
    /// The API server could not be asked (500).
    Error(String),
}

/// A configuration that asks for the API server's reviews on a node without one.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NeedsApiServer {
    #[error(
        "authentication.webhook.enabled needs an API server (--kubeconfig); \
         set it to false on a standalone node"
    )]
    TokenWebhook,
    #[error(
        "authorization.mode Webhook needs an API server (--kubeconfig); \
         use AlwaysAllow on a standalone node"
    )]
    WebhookAuthorization,
}

/// A cached authorization decision's key: who, which verb, which `nodes` subresource.
type Decision = (User, String, &'static str);

struct Cached<T> {
    value: T,
    until: Instant,
}

/// Authentication and authorization with their caches.
pub struct Auth {
    cfg: ServerConfig,
    node_name: String,
    client: Option<kube::Client>,
    tokens: Mutex<HashMap<String, Cached<Option<User>>>>,
    decisions: Mutex<HashMap<Decision, Cached<bool>>>,
}

impl Auth {
    pub fn new(cfg: ServerConfig, node_name: String, client: Option<kube::Client>) -> Self {
        Auth {
            cfg,
            node_name,
            client,
            tokens: Mutex::new(HashMap::new()),
            decisions: Mutex::new(HashMap::new()),
        }
    }

    /// Checks what the configuration asks for against what is available: the webhooks need an
    /// API server (upstream refuses to start without one, too).
    pub fn check(&self) -> Result<(), NeedsApiServer> {
        if self.client.is_none() && self.cfg.token_webhook {
            return Err(NeedsApiServer::TokenWebhook);
        }
        if self.client.is_none() && self.cfg.authz_mode == AuthzMode::Webhook {
            return Err(NeedsApiServer::WebhookAuthorization);
        }
        Ok(())
    }

    /// Who sent the request: the client certificate's user, the bearer token's, or anonymous.
    pub async fn authenticate(
        &self,
        cert_user: Option<&(String, Vec<String>)>,
        authorization: Option<&str>,
    ) -> Result<User, Refused> {
        if let Some((name, groups)) = cert_user {
            let mut groups = groups.clone();
            groups.push("system:authenticated".into());
            return Ok(User {
                name: name.clone(),
                uid: String::new(),
                groups,
                extra: BTreeMap::new(),
            });
        }
        let token = authorization
            .and_then(|h| h.strip_prefix("Bearer "))
            .map(str::trim)
            .filter(|t| !t.is_empty());
        if let Some(token) = token.filter(|_| self.cfg.token_webhook) {
            return match self.review_token(token).await? {
                Some(u) => Ok(u),
                None => Err(Refused::Unauthorized),
            };
        }
        if self.cfg.anonymous {
            return Ok(User::anonymous());
        }
        Err(Refused::Unauthorized)
    }

    async fn review_token(&self, token: &str) -> Result<Option<User>, Refused> {
        if let Some(c) = lock(&self.tokens).get(token) {
            if c.until > Instant::now() {
                return Ok(c.value.clone());
            }
        }
        let Some(client) = &self.client else {
            return Err(Refused::Unauthorized);
        };
        let api: kube::Api<TokenReview> = kube::Api::all(client.clone());
        let review = TokenReview {
            spec: TokenReviewSpec {
                token: token.to_string(),
                audiences: None,
            },
            ..Default::default()
        };
        let done = api
            .create(&PostParams::default(), &review)
            .await
            .map_err(|e| Refused::Error(format!("TokenReview: {e}")))?;
        let st = done.status.unwrap_or_default();
        let user = (st.authenticated == Some(true))
            .then(|| st.user.unwrap_or_default())
            .map(|u| User {
                name: u.username.unwrap_or_default(),
                uid: u.uid.unwrap_or_default(),
                groups: u.groups.unwrap_or_default(),
                extra: u.extra.unwrap_or_default(),
            });
        lock(&self.tokens).insert(
            token.to_string(),
            Cached {
                value: user.clone(),
                until: Instant::now() + self.cfg.token_cache_ttl,
            },
        );
        Ok(user)
    }

    /// Whether `user` may do what `attrs` says on this node.
    pub async fn authorize(&self, user: &User, attrs: &Attributes) -> Result<(), Refused> {
        if self.cfg.authz_mode == AuthzMode::AlwaysAllow {
            return Ok(());
        }
        for sub in &attrs.subresources {
            if self.allowed(user, &attrs.verb, sub).await? {
                return Ok(());
            }
        }
        let last = attrs.subresources.last().copied().unwrap_or("proxy");
        Err(Refused::Forbidden(format!(
            "Forbidden (user={}, verb={}, resource=nodes, subresource={last})",
            user.name, attrs.verb
        )))
    }

    async fn allowed(&self, user: &User, verb: &str, sub: &'static str) -> Result<bool, Refused> {
        let key = (user.clone(), verb.to_string(), sub);
        if let Some(c) = lock(&self.decisions).get(&key) {
            if c.until > Instant::now() {
                return Ok(c.value);
            }
        }
        let Some(client) = &self.client else {
            return Ok(false);
        };
        let api: kube::Api<SubjectAccessReview> = kube::Api::all(client.clone());
        let review = SubjectAccessReview {
            spec: SubjectAccessReviewSpec {
                user: Some(user.name.clone()),
                uid: Some(user.uid.clone()).filter(|u| !u.is_empty()),
                groups: Some(user.groups.clone()),
                extra: Some(user.extra.clone()).filter(|e| !e.is_empty()),
                resource_attributes: Some(ResourceAttributes {
                    verb: Some(verb.to_string()),
                    resource: Some("nodes".into()),
                    subresource: Some(sub.to_string()),
                    name: Some(self.node_name.clone()),
                    version: Some("v1".into()),
                    ..Default::default()
                }),
                ..Default::default()
            },
            ..Default::default()
        };
        let done = api
            .create(&PostParams::default(), &review)
            .await
            .map_err(|e| Refused::Error(format!("SubjectAccessReview: {e}")))?;
        let ok = done.status.is_some_and(|s| s.allowed);
        let ttl: Duration = if ok {
            self.cfg.authz_allowed_ttl
        } else {
            self.cfg.authz_denied_ttl
        };
        lock(&self.decisions).insert(
            key,
            Cached {
                value: ok,
                until: Instant::now() + ttl,
            },
        );
        Ok(ok)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_map_to_upstreams_subresources() {
        let get = http::Method::GET;
        let cases: &[(&http::Method, &str, &str, &[&str])] = &[
            (&get, "/stats/summary", "get", &["stats"]),
            (&get, "/metrics/cadvisor", "get", &["metrics"]),
            (&get, "/metrics", "get", &["metrics"]),
            (&get, "/logs/syslog", "get", &["log"]),
            (&get, "/pods", "get", &["pods", "proxy"]),
            (&get, "/runningpods/", "get", &["pods", "proxy"]),
            (&get, "/healthz", "get", &["healthz", "proxy"]),
            (&get, "/configz", "get", &["configz", "proxy"]),
            (&get, "/containerLogs/ns/pod/c", "get", &["proxy"]),
            (&http::Method::POST, "/exec/ns/pod/c", "create", &["proxy"]),
            (&get, "/podsx", "get", &["proxy"]),
        ];
        for (method, path, verb, subs) in cases {
            let a = attributes(method, path);
            assert_eq!(
                (a.verb.as_str(), a.subresources.as_slice()),
                (*verb, *subs),
                "{path}"
            );
        }
    }

    #[tokio::test]
    async fn anonymous_only_when_enabled_and_certificates_name_users() {
        let mut cfg = ServerConfig {
            token_webhook: false,
            ..Default::default()
        };
        let auth = Auth::new(cfg.clone(), "n".into(), None);
        assert_eq!(
            auth.authenticate(None, None).await,
            Err(Refused::Unauthorized)
        );
        cfg.anonymous = true;
        let auth = Auth::new(cfg.clone(), "n".into(), None);
        assert_eq!(auth.authenticate(None, None).await, Ok(User::anonymous()));
        let cert = (
            "system:kube-apiserver".to_string(),
            vec!["system:masters".to_string()],
        );
        let u = auth.authenticate(Some(&cert), None).await.expect("user");
        assert_eq!(u.name, "system:kube-apiserver");
        assert_eq!(u.groups, ["system:masters", "system:authenticated"]);
        // Without an API server, webhooks cannot work: the configuration is refused.
        assert!(
            Auth::new(ServerConfig::default(), "n".into(), None)
                .check()
                .is_err()
        );
        cfg.authz_mode = AuthzMode::AlwaysAllow;
        let auth = Auth::new(cfg, "n".into(), None);
        assert!(auth.check().is_ok());
        assert_eq!(
            auth.authorize(&User::anonymous(), &attributes(&http::Method::GET, "/pods"))
                .await,
            Ok(())
        );
    }
}
