//! The objects, the resourceVersion counter and the watch history, with kube-apiserver's
//! create / update / patch / delete semantics and its `Status` errors.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde_json::{Map, Value, json};
use tokio::sync::mpsc::UnboundedSender;

use super::patch;
use super::select::Selector;

/// One served resource.
#[derive(Debug, PartialEq, Eq)]
pub struct Resource {
    pub group: &'static str,
    pub version: &'static str,
    pub plural: &'static str,
    pub kind: &'static str,
    pub namespaced: bool,
    /// Has a `/status` subresource; the main resource then ignores `.status`.
    pub has_status: bool,
    /// PUT of a missing object creates it (events do).
    pub create_on_update: bool,
    /// DELETE answers with the object instead of a `Status` (pods do).
    pub return_deleted: bool,
    pub short_names: &'static [&'static str],
}

impl Resource {
    pub fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.to_string()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }

    /// `pods`, `leases.coordination.k8s.io`: the name in error messages and store keys.
    pub fn qualified(&self) -> String {
        if self.group.is_empty() {
            self.plural.to_string()
        } else {
            format!("{}.{}", self.plural, self.group)
        }
    }
}

/// Flags of [`Resource`] beyond its names: status subresource, create on PUT, return the deleted object.
const STATUS: u8 = 1;
const CREATE_ON_UPDATE: u8 = 2;
const RETURN_DELETED: u8 = 4;

const fn res(
    group: &'static str,
    plural: &'static str,
    kind: &'static str,
    namespaced: bool,
    flags: u8,
    short_names: &'static [&'static str],
) -> Resource {
    Resource {
        group,
        version: "v1",
        plural,
        kind,
        namespaced,
        has_status: flags & STATUS != 0,
        create_on_update: flags & CREATE_ON_UPDATE != 0,
        return_deleted: flags & RETURN_DELETED != 0,
        short_names,
    }
}

pub const RESOURCES: &[Resource] = &[
    res("", "pods", "Pod", true, STATUS | RETURN_DELETED, &["po"]),
    res("", "nodes", "Node", false, STATUS, &["no"]),
    res("", "events", "Event", true, CREATE_ON_UPDATE, &["ev"]),
    res("", "configmaps", "ConfigMap", true, 0, &["cm"]),
    res("", "secrets", "Secret", true, 0, &[]),
    res("", "serviceaccounts", "ServiceAccount", true, 0, &["sa"]),
    res("", "services", "Service", true, STATUS, &["svc"]),
    res(
        "",
        "persistentvolumes",
        "PersistentVolume",
        false,
        STATUS,
        &["pv"],
    ),
    res(
        "",
        "persistentvolumeclaims",
        "PersistentVolumeClaim",
        true,
        STATUS,
        &["pvc"],
    ),
    res("coordination.k8s.io", "leases", "Lease", true, 0, &[]),
    res(
        "events.k8s.io",
        "events",
        "Event",
        true,
        CREATE_ON_UPDATE,
        &["ev"],
    ),
    // Also an `approval` subresource (csr.rs).
    res(
        "certificates.k8s.io",
        "certificatesigningrequests",
        "CertificateSigningRequest",
        false,
        STATUS,
        &["csr"],
    ),
];

/// Which part of an object a write goes to: the object, its `status` subresource, or a
/// CertificateSigningRequest's `approval` subresource (its status conditions only).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Part {
    Main,
    Status,
    Approval,
    /// A pod's `resize`: only its containers' cpu and memory resources.
    Resize,
}

pub fn find_resource(group: &str, version: &str, plural: &str) -> Option<&'static Resource> {
    RESOURCES
        .iter()
        .find(|r| r.group == group && r.version == version && r.plural == plural)
}

/// A failed request, answered as a `Status` object.
#[derive(Debug, Clone)]
pub struct ApiError {
    pub code: u16,
    pub reason: &'static str,
    pub message: String,
    pub details: Option<Value>,
}

impl ApiError {
    pub fn new(code: u16, reason: &'static str, message: impl Into<String>) -> Self {
        Self {
            code,
            reason,
            message: message.into(),
            details: None,
        }
    }

    fn with_details(mut self, res: &Resource, name: &str) -> Self {
        let mut d = Map::new();
        d.insert("name".into(), json!(name));
        if !res.group.is_empty() {
            d.insert("group".into(), json!(res.group));
        }
        d.insert("kind".into(), json!(res.plural));
        self.details = Some(Value::Object(d));
        self
    }

    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(400, "BadRequest", message)
    }

    pub fn not_found(res: &Resource, name: &str) -> Self {
        Self::new(
            404,
            "NotFound",
            format!("{} \"{name}\" not found", res.qualified()),
        )
        .with_details(res, name)
    }

    pub fn path_not_found() -> Self {
        Self::new(
            404,
            "NotFound",
            "the server could not find the requested resource",
        )
    }

    pub fn already_exists(res: &Resource, name: &str) -> Self {
        Self::new(
            409,
            "AlreadyExists",
            format!("{} \"{name}\" already exists", res.qualified()),
        )
        .with_details(res, name)
    }

    pub fn conflict(res: &Resource, name: &str, why: &str) -> Self {
        let message = format!(
            "Operation cannot be fulfilled on {} \"{name}\": {why}",
            res.qualified()
        );
        Self::new(409, "Conflict", message).with_details(res, name)
    }

    fn stale(res: &Resource, name: &str) -> Self {
        Self::conflict(
            res,
            name,
            "the object has been modified; please apply your changes to the latest version and try again",
        )
    }

    /// 422 with one field cause, shaped like apimachinery's `NewInvalid`.
    pub fn invalid(res: &Resource, name: &str, field: &str, cause: &str, detail: &str) -> Self {
        Self::invalid_all(res, name, &[(field, cause, detail)])
    }

    /// 422 with every `(field, cause reason, detail)` found, as apimachinery's `NewInvalid`
    /// aggregates them: `Kind.group "name" is invalid: [a: x, b: y]`.
    pub fn invalid_all(res: &Resource, name: &str, errs: &[(&str, &str, &str)]) -> Self {
        let causes: Vec<Value> = errs
            .iter()
            .map(|(field, cause, detail)| json!({"reason": cause, "message": detail, "field": field}))
            .collect();
        let mut d = json!({"name": name, "kind": res.kind, "causes": causes});
        if !res.group.is_empty() {
            d["group"] = json!(res.group);
        }
        let kind = if res.group.is_empty() {
            res.kind.to_string()
        } else {
            format!("{}.{}", res.kind, res.group)
        };
        let all: Vec<String> = errs.iter().map(|(f, _, d)| format!("{f}: {d}")).collect();
        let all = match all.as_slice() {
            [one] => one.clone(),
            _ => format!("[{}]", all.join(", ")),
        };
        let mut e = Self::new(
            422,
            "Invalid",
            format!("{kind} \"{name}\" is invalid: {all}"),
        );
        e.details = Some(d);
        e
    }

    pub fn expired(message: impl Into<String>) -> Self {
        Self::new(410, "Expired", message)
    }

    pub fn status(&self) -> Value {
        let mut s = json!({"kind": "Status", "apiVersion": "v1", "metadata": {},
            "status": "Failure", "message": self.message, "reason": self.reason, "code": self.code});
        if let Some(d) = &self.details {
            s["details"] = d.clone();
        }
        s
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChangeKind {
    Added,
    Modified,
    Deleted,
}

/// One write, as the watch history keeps it.
#[derive(Debug)]
pub struct Change {
    pub rv: u64,
    pub res: &'static Resource,
    pub kind: ChangeKind,
    /// The object after the write (for a delete: its last state carrying the delete's rv).
    pub object: Value,
    /// The object before the write.
    pub old: Option<Value>,
}

/// Store key: qualified resource, namespace ("" when cluster-scoped), name. Ordered as etcd keys.
type Key = (String, String, String);

fn key(res: &Resource, ns: &str, name: &str) -> Key {
    (res.qualified(), ns.to_string(), name.to_string())
}

/// What a DELETE asked for.
#[derive(Debug, Default)]
pub struct DeleteOptions {
    pub grace_period_seconds: Option<i64>,
    pub uid: Option<String>,
    pub resource_version: Option<String>,
}

#[derive(Debug, Default)]
pub struct Store {
    pub rv: u64,
    objects: BTreeMap<Key, Value>,
    /// Changes with rv > `floor`; older ones are forgotten.
    pub history: Vec<Arc<Change>>,
    pub floor: u64,
    pub watchers: Vec<UnboundedSender<Arc<Change>>>,
    seq: u64,
    seed: u64,
}

pub fn now() -> String {
    rfc3339(chrono::Utc::now())
}

fn rfc3339(t: chrono::DateTime<chrono::Utc>) -> String {
    t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
}

fn meta_str<'a>(obj: &'a Value, field: &str) -> &'a str {
    obj.pointer(&format!("/metadata/{field}"))
        .and_then(Value::as_str)
        .unwrap_or("")
}

fn meta(obj: &mut Value) -> &mut Map<String, Value> {
    if !obj.get("metadata").is_some_and(Value::is_object) {
        obj["metadata"] = json!({});
    }
    match obj.get_mut("metadata") {
        Some(Value::Object(m)) => m,
        _ => unreachable!("metadata was just made an object"),
    }
}

/// Metadata only the server writes; kept from the stored object on PUT and PATCH.
const SERVER_META: [&str; 5] = [
    "uid",
    "creationTimestamp",
    "deletionTimestamp",
    "deletionGracePeriodSeconds",
    "generation",
];

/// Sets the field at `pointer` (`/a/b`, parent existing or made) in `to` to its value in `from`,
/// or removes it when `from` has none.
fn copy_field(to: &mut Value, from: &Value, pointer: &str) {
    let (parent, field) = pointer.rsplit_once('/').unwrap_or(("", pointer));
    let value = from.pointer(pointer).cloned();
    let parent = if parent.is_empty() {
        Some(to)
    } else {
        to.pointer_mut(parent)
    };
    match (parent, value) {
        (Some(Value::Object(p)), Some(v)) => {
            p.insert(field.to_string(), v);
        }
        (Some(Value::Object(p)), None) => {
            p.remove(field);
        }
        _ => {}
    }
}

/// A DNS-1123 subdomain, the rule for pod, node, lease and event names.
fn valid_name(name: &str) -> bool {
    let ok_label = |l: &str| {
        !l.is_empty()
            && l.bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
            && !l.starts_with('-')
            && !l.ends_with('-')
    };
    name.len() <= 253 && name.split('.').all(ok_label)
}

/// apimachinery's `IsValidPathSegmentName`: why `name` cannot be a path segment.
fn path_segment_errors(name: &str) -> Vec<String> {
    if name == "." || name == ".." {
        return vec![format!("may not be '{name}'")];
    }
    ["/", "%"]
        .iter()
        .filter(|c| name.contains(**c))
        .map(|c| format!("may not contain '{c}'"))
        .collect()
}

impl Store {
    pub fn new() -> Self {
        let seed = chrono::Utc::now().timestamp_nanos_opt().unwrap_or(0) as u64;
        Self {
            seed,
            ..Default::default()
        }
    }

    /// A Service's defaults as kube-apiserver fills them: `type: ClusterIP`, ports' protocol
    /// TCP, and a cluster IP allocated from 10.96.0.0/16 (from .10 up; a given one must be
    /// free) unless it is `None` (headless) or the Service an ExternalName.
    fn prepare_service(
        &mut self,
        res: &'static Resource,
        name: &str,
        svc: &mut Value,
    ) -> Result<(), ApiError> {
        if !svc.get("spec").is_some_and(Value::is_object) {
            svc["spec"] = json!({});
        }
        let spec = &mut svc["spec"];
        if spec.get("type").is_none() {
            spec["type"] = json!("ClusterIP");
        }
        for p in spec
            .get_mut("ports")
            .and_then(Value::as_array_mut)
            .into_iter()
            .flatten()
        {
            if p.get("protocol").is_none() {
                p["protocol"] = json!("TCP");
            }
        }
        if spec["type"] == "ExternalName" {
            return Ok(());
        }
        let used: Vec<String> = self
            .objects
            .iter()
            .filter(|((r, _, _), _)| r == "services")
            .filter_map(|(_, o)| o.pointer("/spec/clusterIP")?.as_str().map(String::from))
            .collect();
        let asked = spec
            .get("clusterIP")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string();
        let ip = if asked == "None" {
            asked
        } else if !asked.is_empty() {
            if used.contains(&asked) {
                let msg = format!(
                    "Invalid value: \"{asked}\": failed to allocate IP {asked}: provided IP is already allocated"
                );
                return Err(ApiError::invalid(
                    res,
                    name,
                    "spec.clusterIPs",
                    "FieldValueInvalid",
                    &msg,
                ));
            }
            asked
        } else {
            (10..=65534u32)
                .map(|n| format!("10.96.{}.{}", n >> 8, n & 0xff))
                .find(|ip| !used.contains(ip) && !ip.ends_with(".0") && !ip.ends_with(".255"))
                .ok_or_else(|| ApiError::new(500, "InternalError", "no cluster IP left"))?
        };
        spec["clusterIP"] = json!(ip);
        spec["clusterIPs"] = json!([ip]);
        Ok(())
    }

    pub fn next(&mut self) -> u64 {
        self.seq += 1;
        let mut x = self.seed ^ self.seq.wrapping_mul(0x9E37_79B9_7F4A_7C15);
        x ^= x >> 31;
        x = x.wrapping_mul(0xBF58_476D_1CE4_E5B9);
        x ^ (x >> 29)
    }

    pub fn new_uid(&mut self) -> String {
        let (a, b) = (self.next(), self.next());
        format!(
            "{:08x}-{:04x}-4{:03x}-8{:03x}-{:012x}",
            a >> 32,
            (a >> 16) & 0xffff,
            a & 0xfff,
            b >> 52,
            b & 0xffff_ffff_ffff
        )
    }

    pub fn get(&self, res: &Resource, ns: &str, name: &str) -> Result<Value, ApiError> {
        self.objects
            .get(&key(res, ns, name))
            .cloned()
            .ok_or_else(|| ApiError::not_found(res, name))
    }

    /// The objects of `res` (in `ns` when given) matching `sel`, in key order.
    pub fn select(&self, res: &Resource, ns: Option<&str>, sel: &Selector) -> Vec<(Key, Value)> {
        let q = res.qualified();
        self.objects
            .iter()
            .filter(|((r, n, _), o)| *r == q && ns.is_none_or(|ns| ns == n) && sel.matches(res, o))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect()
    }

    /// Records a write: bumps nothing itself; `object` already carries `rv`.
    fn emit(
        &mut self,
        res: &'static Resource,
        kind: ChangeKind,
        object: Value,
        old: Option<Value>,
    ) {
        let change = Arc::new(Change {
            rv: self.rv,
            res,
            kind,
            object,
            old,
        });
        self.history.push(change.clone());
        self.watchers.retain(|w| w.send(change.clone()).is_ok());
    }

    /// Writes `next` under a new resourceVersion (removes it for a delete) and records the change.
    fn commit(
        &mut self,
        res: &'static Resource,
        kind: ChangeKind,
        mut next: Value,
        old: Option<Value>,
    ) -> Value {
        self.rv += 1;
        meta(&mut next).insert("resourceVersion".into(), json!(self.rv.to_string()));
        let k = key(res, meta_str(&next, "namespace"), meta_str(&next, "name"));
        if kind == ChangeKind::Deleted {
            self.objects.remove(&k);
        } else {
            self.objects.insert(k, next.clone());
        }
        self.emit(res, kind, next.clone(), old);
        next
    }

    /// Forgets the history: watches from any older resourceVersion now get 410.
    pub fn compact(&mut self) {
        self.floor = self.rv;
        self.history.clear();
    }

    /// Checks `apiVersion`/`kind` and the namespace of a body against the request.
    fn check_body(&self, res: &Resource, ns: &str, body: &mut Value) -> Result<(), ApiError> {
        if !body.is_object() {
            return Err(ApiError::bad_request(format!(
                "the object provided is unrecognized (must be of type {})",
                res.kind
            )));
        }
        let av = body.get("apiVersion").and_then(Value::as_str).unwrap_or("");
        let kind = body.get("kind").and_then(Value::as_str).unwrap_or("");
        if (!kind.is_empty() && kind != res.kind) || (!av.is_empty() && av != res.api_version()) {
            return Err(ApiError::bad_request(format!(
                "the object provided is unrecognized (must be of type {}): {av}, Kind={kind}",
                res.kind
            )));
        }
        for field in ["metadata", "spec", "status"] {
            if body
                .get(field)
                .is_some_and(|v| !v.is_object() && !v.is_null())
            {
                return Err(ApiError::bad_request(format!(
                    "json: cannot unmarshal {field} into an object of {}",
                    res.kind
                )));
            }
        }
        let body_ns = meta_str(body, "namespace").to_string();
        if res.namespaced {
            if !body_ns.is_empty() && body_ns != ns {
                return Err(ApiError::bad_request(
                    "the namespace of the provided object does not match the namespace sent on the request",
                ));
            }
            meta(body).insert("namespace".into(), json!(ns));
        } else {
            meta(body).remove("namespace");
        }
        body["apiVersion"] = json!(res.api_version());
        body["kind"] = json!(res.kind);
        if res.kind == "Secret" || res.kind == "ConfigMap" {
            prepare_data(res, body)?;
        }
        Ok(())
    }

    pub fn create(
        &mut self,
        res: &'static Resource,
        ns: &str,
        mut body: Value,
    ) -> Result<Value, ApiError> {
        self.check_body(res, ns, &mut body)?;
        if !meta_str(&body, "resourceVersion").is_empty() {
            return Err(ApiError::new(
                500,
                "InternalError",
                "Internal error occurred: resourceVersion should not be set on objects to be created",
            ));
        }
        let mut name = meta_str(&body, "name").to_string();
        let generate = meta_str(&body, "generateName").to_string();
        if name.is_empty() && !generate.is_empty() {
            const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
            loop {
                let mut x = self.next();
                let suffix: String = (0..5)
                    .map(|_| {
                        let c = ALPHABET[(x % ALPHABET.len() as u64) as usize] as char;
                        x /= ALPHABET.len() as u64;
                        c
                    })
                    .collect();
                name = format!("{generate}{suffix}");
                if !self.objects.contains_key(&key(res, ns, &name)) {
                    break;
                }
            }
            meta(&mut body).insert("name".into(), json!(name));
        }
        if name.is_empty() {
            let msg = "Required value: name or generateName is required";
            return Err(ApiError::invalid(
                res,
                "",
                "metadata.name",
                "FieldValueRequired",
                msg,
            ));
        }
        // kube validates a CertificateSigningRequest's name only as a path segment
        // (`ValidateCertificateRequestName` accepts any): `node-csr-<base64url>` is fine.
        let csr = res.kind == "CertificateSigningRequest";
        if !csr && !valid_name(&name) {
            let msg = format!(
                "Invalid value: \"{name}\": a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character"
            );
            return Err(ApiError::invalid(
                res,
                &name,
                "metadata.name",
                "FieldValueInvalid",
                &msg,
            ));
        }
        if res.kind == "Pod" {
            prepare_pod(res, &name, &mut body)?;
        }
        if csr {
            super::csr::validate_create(res, &name, &body)?;
            let why: Vec<String> = path_segment_errors(&name)
                .into_iter()
                .map(|w| format!("Invalid value: \"{name}\": {w}"))
                .collect();
            if !why.is_empty() {
                let errs: Vec<(&str, &str, &str)> = why
                    .iter()
                    .map(|w| ("metadata.name", "FieldValueInvalid", w.as_str()))
                    .collect();
                return Err(ApiError::invalid_all(res, &name, &errs));
            }
        }
        if self.objects.contains_key(&key(res, ns, &name)) {
            return Err(ApiError::already_exists(res, &name));
        }
        if res.kind == "Service" {
            self.prepare_service(res, &name, &mut body)?;
        }
        let uid = self.new_uid();
        let m = meta(&mut body);
        m.insert("uid".into(), json!(uid));
        m.insert("creationTimestamp".into(), json!(now()));
        m.insert("generation".into(), json!(1));
        m.remove("deletionTimestamp");
        m.remove("deletionGracePeriodSeconds");
        Ok(self.commit(res, ChangeKind::Added, body, None))
    }

    /// PUT: replaces the object (or only the subresource's part of it, [`Part`]). Creates when
    /// the resource allows it; returns whether it did.
    pub fn update(
        &mut self,
        res: &'static Resource,
        ns: &str,
        name: &str,
        mut body: Value,
        part: Part,
    ) -> Result<(bool, Value), ApiError> {
        self.check_body(res, ns, &mut body)?;
        let body_name = meta_str(&body, "name");
        if body_name != name {
            return Err(ApiError::bad_request(format!(
                "the name of the object ({body_name}) does not match the name on the URL ({name})"
            )));
        }
        let stored = self.objects.get(&key(res, ns, name)).cloned();
        // A uid in a PUT body is a precondition.
        let (uid, have) = (
            meta_str(&body, "uid"),
            stored.as_ref().map_or("", |o| meta_str(o, "uid")),
        );
        if !uid.is_empty() && stored.is_some() && uid != have {
            let why = format!(
                "Precondition failed: UID in precondition: {uid}, UID in object meta: {have}"
            );
            return Err(ApiError::conflict(res, name, &why));
        }
        let Some(old) = stored else {
            if res.create_on_update && part == Part::Main {
                meta(&mut body).remove("resourceVersion");
                return self.create(res, ns, body).map(|o| (true, o));
            }
            return Err(ApiError::not_found(res, name));
        };
        self.replace(res, name, old, body, part).map(|o| (false, o))
    }

    /// PATCH by content type; only the subresource's part is taken from the result ([`Part`]).
    pub fn patch(
        &mut self,
        res: &'static Resource,
        ns: &str,
        name: &str,
        content_type: &str,
        body: &[u8],
        part: Part,
    ) -> Result<Value, ApiError> {
        let old = self.get(res, ns, name)?;
        let mut new = old.clone();
        let media = content_type.split(';').next().unwrap_or("").trim();
        let parse = |b: &[u8]| -> Result<Value, ApiError> {
            serde_json::from_slice(b)
                .map_err(|e| ApiError::bad_request(format!("error decoding patch: {e}")))
        };
        match media {
            "application/merge-patch+json" => patch::merge(&mut new, &parse(body)?),
            "application/strategic-merge-patch+json" => {
                let p = parse(body)?;
                if !p.is_object() {
                    return Err(ApiError::bad_request(
                        "strategic merge patch must be a JSON object",
                    ));
                }
                patch::strategic(&mut new, &p, "")
            }
            "application/json-patch+json" => {
                let ops: json_patch::Patch = serde_json::from_slice(body).map_err(|e| {
                    ApiError::bad_request(format!("error decoding json patch: {e}"))
                })?;
                json_patch::patch(&mut new, &ops).map_err(|e| {
                    ApiError::new(
                        422,
                        "Invalid",
                        format!(
                            "the server rejected our request due to an error in our request: {e}"
                        ),
                    )
                })?;
            }
            _ => {
                return Err(ApiError::new(
                    415,
                    "UnsupportedMediaType",
                    format!(
                        "the body of the request was in an unknown format - accepted media types include: application/json-patch+json, application/merge-patch+json, application/strategic-merge-patch+json (got {media})"
                    ),
                ));
            }
        }
        self.check_body(res, ns, &mut new)?;
        if meta_str(&new, "name") != name {
            return Err(ApiError::bad_request(format!(
                "the name of the object ({}) does not match the name on the URL ({name})",
                meta_str(&new, "name")
            )));
        }
        self.replace(res, name, old, new, part)
    }

    /// The common tail of PUT and PATCH: optimistic concurrency, server-owned fields kept,
    /// status isolation, generation, and no write (no new rv) when nothing changed.
    fn replace(
        &mut self,
        res: &'static Resource,
        name: &str,
        old: Value,
        new: Value,
        part: Part,
    ) -> Result<Value, ApiError> {
        let status = matches!(part, Part::Status | Part::Approval);
        let uid = meta_str(&new, "uid");
        if !uid.is_empty() && uid != meta_str(&old, "uid") {
            let msg = format!("Invalid value: \"{uid}\": field is immutable");
            return Err(ApiError::invalid(
                res,
                name,
                "metadata.uid",
                "FieldValueInvalid",
                &msg,
            ));
        }
        if !status && old.get("immutable") == Some(&json!(true)) {
            for field in ["data", "binaryData", "immutable"] {
                if old.get(field) != new.get(field) {
                    let msg = "Forbidden: field is immutable when `immutable` is set";
                    return Err(ApiError::invalid(
                        res,
                        name,
                        field,
                        "FieldValueForbidden",
                        msg,
                    ));
                }
            }
        }
        let old_rv = meta_str(&old, "resourceVersion").to_string();
        let asked_rv = meta_str(&new, "resourceVersion");
        if !asked_rv.is_empty() && asked_rv != old_rv {
            return Err(ApiError::stale(res, name));
        }
        let mut next = if status { old.clone() } else { new.clone() };
        if status {
            copy_field(&mut next, &new, "/status");
        } else if part == Part::Resize {
            next = resized_pod(res, name, &old, &new)?;
        } else {
            if res.has_status {
                copy_field(&mut next, &old, "/status");
            }
            for f in SERVER_META {
                copy_field(&mut next, &old, &format!("/metadata/{f}"));
            }
            if res.kind == "Pod" {
                default_pod_spec(&mut next["spec"]);
                check_pod_update(res, name, &old, &next)?;
            }
        }
        if res.kind == "CertificateSigningRequest" {
            super::csr::prepare_update(res, name, &old, &mut next, part)?;
        }
        if !status && next.get("spec") != old.get("spec") {
            let g = old
                .pointer("/metadata/generation")
                .and_then(Value::as_i64)
                .unwrap_or(0);
            meta(&mut next).insert("generation".into(), json!(g + 1));
        }
        meta(&mut next).insert("resourceVersion".into(), json!(old_rv));
        if next == old {
            return Ok(old);
        }
        Ok(self.commit(res, ChangeKind::Modified, next, Some(old)))
    }

    /// POST `pods/{name}/binding`: assigns an unscheduled pod to `target.name` and marks it
    /// PodScheduled, as the scheduler's binding does.
    pub fn bind(
        &mut self,
        res: &'static Resource,
        ns: &str,
        name: &str,
        binding: &Value,
    ) -> Result<Value, ApiError> {
        let node = binding
            .pointer("/target/name")
            .and_then(Value::as_str)
            .unwrap_or("");
        if node.is_empty() {
            let msg = "Required value";
            return Err(ApiError::invalid(
                res,
                name,
                "target.name",
                "FieldValueRequired",
                msg,
            ));
        }
        let old = self.get(res, ns, name)?;
        if old.pointer("/metadata/deletionTimestamp").is_some() {
            let why = format!("pod {name} is being deleted, cannot be assigned to a host");
            return Err(ApiError::conflict(res, name, &why));
        }
        let bound = old
            .pointer("/spec/nodeName")
            .and_then(Value::as_str)
            .unwrap_or("");
        if !bound.is_empty() {
            let why = format!("pod {name} is already assigned to node \"{bound}\"");
            return Err(ApiError::conflict(res, name, &why));
        }
        let mut next = old.clone();
        next["spec"]["nodeName"] = json!(node);
        let scheduled =
            json!({"type": "PodScheduled", "status": "True", "lastTransitionTime": now()});
        match next["status"]["conditions"].as_array_mut() {
            Some(cs) => {
                cs.retain(|c| c["type"] != "PodScheduled");
                cs.push(scheduled);
            }
            None => next["status"]["conditions"] = json!([scheduled]),
        }
        self.commit(res, ChangeKind::Modified, next, Some(old));
        Ok(
            json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201}),
        )
    }

    /// DELETE: graceful for scheduled pods, immediate otherwise. Answers the pod (terminating
    /// or gone) for pods, a Success `Status` for the others; always 200, as kube-apiserver does.
    pub fn delete(
        &mut self,
        res: &'static Resource,
        ns: &str,
        name: &str,
        opts: &DeleteOptions,
    ) -> Result<Value, ApiError> {
        let old = self.get(res, ns, name)?;
        if let Some(uid) = &opts.uid {
            let have = meta_str(&old, "uid");
            if uid != have {
                let why = format!(
                    "Precondition failed: UID in precondition: {uid}, UID in object meta: {have}"
                );
                return Err(ApiError::conflict(res, name, &why));
            }
        }
        if let Some(rv) = &opts.resource_version {
            let have = meta_str(&old, "resourceVersion");
            if rv != have {
                let why = format!(
                    "Precondition failed: ResourceVersion in precondition: {rv}, ResourceVersion in object meta: {have}"
                );
                return Err(ApiError::conflict(res, name, &why));
            }
        }
        if res.kind == "Pod" {
            let scheduled = !old
                .pointer("/spec/nodeName")
                .and_then(Value::as_str)
                .unwrap_or("")
                .is_empty();
            let phase = old
                .pointer("/status/phase")
                .and_then(Value::as_str)
                .unwrap_or("");
            let grace = match opts.grace_period_seconds {
                Some(g) => g,
                None => old
                    .pointer("/spec/terminationGracePeriodSeconds")
                    .and_then(Value::as_i64)
                    .unwrap_or(30),
            };
            if scheduled && grace > 0 && phase != "Succeeded" && phase != "Failed" {
                return self.delete_gracefully(res, old, grace);
            }
        }
        let last = self.commit(res, ChangeKind::Deleted, old.clone(), Some(old));
        if res.return_deleted {
            return Ok(last);
        }
        let mut details = json!({"name": name, "kind": res.plural, "uid": meta_str(&last, "uid")});
        if !res.group.is_empty() {
            details["group"] = json!(res.group);
        }
        Ok(
            json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "details": details}),
        )
    }

    fn delete_gracefully(
        &mut self,
        res: &'static Resource,
        old: Value,
        grace: i64,
    ) -> Result<Value, ApiError> {
        let now = chrono::Utc::now();
        let prior = old
            .pointer("/metadata/deletionGracePeriodSeconds")
            .and_then(Value::as_i64);
        let prior_ts = old
            .pointer("/metadata/deletionTimestamp")
            .and_then(Value::as_str)
            .and_then(|s| chrono::DateTime::parse_from_rfc3339(s).ok())
            .map(|t| t.with_timezone(&chrono::Utc));
        let deadline = match (prior, prior_ts) {
            // Already terminating: a DELETE may only shorten the grace period, counted from
            // when the first DELETE asked.
            (Some(p), Some(_)) if grace >= p => return Ok(old),
            (Some(p), Some(ts)) => {
                ts - chrono::Duration::seconds(p) + chrono::Duration::seconds(grace)
            }
            _ => now + chrono::Duration::seconds(grace),
        };
        let mut next = old.clone();
        let g = old
            .pointer("/metadata/generation")
            .and_then(Value::as_i64)
            .unwrap_or(0);
        let m = meta(&mut next);
        m.insert("deletionTimestamp".into(), json!(rfc3339(deadline)));
        m.insert("deletionGracePeriodSeconds".into(), json!(grace));
        m.insert("generation".into(), json!(g + 1));
        Ok(self.commit(res, ChangeKind::Modified, next, Some(old)))
    }
}

/// A Secret's or ConfigMap's data as kube-apiserver takes it: a Secret's `stringData` merged
/// into `data` (base64) and dropped, `data` values checked to be base64, `type` defaulted to
/// `Opaque`; keys checked to be config keys, and a ConfigMap's key in both `data` and
/// `binaryData` refused.
fn prepare_data(res: &Resource, obj: &mut Value) -> Result<(), ApiError> {
    use base64::Engine;
    let b64 = base64::engine::general_purpose::STANDARD;
    let name = meta_str(obj, "name").to_string();
    if res.kind == "Secret" {
        if let Some(Value::Object(sd)) = obj.as_object_mut().and_then(|o| o.remove("stringData")) {
            for (k, v) in sd {
                let text = v.as_str().unwrap_or("").to_string();
                obj["data"][k] = json!(b64.encode(text));
            }
        }
        if obj.get("type").is_none() {
            obj["type"] = json!("Opaque");
        }
    }
    let binary = |field: &str| res.kind == "Secret" || field == "binaryData";
    let mut seen = std::collections::BTreeSet::new();
    for field in ["data", "binaryData"] {
        let Some(map) = obj.get(field) else { continue };
        let Some(map) = map.as_object() else {
            return Err(ApiError::bad_request(format!(
                "json: cannot unmarshal {field} into a map of {}",
                res.kind
            )));
        };
        for (k, v) in map {
            let valid = !k.is_empty()
                && k.len() <= 253
                && k.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"-._".contains(&b));
            if !valid || k == "." || k == ".." || k.starts_with("..") {
                let msg = format!(
                    "Invalid value: \"{k}\": a valid config key must consist of alphanumeric characters, '-', '_' or '.' (e.g. 'key.name',  or 'KEY_NAME',  or 'key-name', regex used for validation is '[-._a-zA-Z0-9]+')"
                );
                return Err(ApiError::invalid(
                    res,
                    &name,
                    &format!("{field}[{k}]"),
                    "FieldValueInvalid",
                    &msg,
                ));
            }
            let Some(text) = v.as_str() else {
                return Err(ApiError::bad_request(format!(
                    "json: cannot unmarshal {field}[{k}] into a string"
                )));
            };
            if binary(field) && b64.decode(text).is_err() {
                return Err(ApiError::bad_request(format!(
                    "illegal base64 data in {field}[{k}]"
                )));
            }
            if !seen.insert(k.clone()) {
                let msg = format!("Invalid value: \"{k}\": duplicate of key present in data");
                return Err(ApiError::invalid(
                    res,
                    &name,
                    &format!("binaryData[{k}]"),
                    "FieldValueInvalid",
                    &msg,
                ));
            }
        }
    }
    Ok(())
}

/// Pod creation as the pod strategy does it: status reset to Pending with the QoS class,
/// the main spec defaults, and the one validation tests trip over (no containers).
fn prepare_pod(res: &Resource, name: &str, pod: &mut Value) -> Result<(), ApiError> {
    let required =
        |field: &str| ApiError::invalid(res, name, field, "FieldValueRequired", "Required value");
    let containers = pod.pointer("/spec/containers").and_then(Value::as_array);
    if containers.is_none_or(Vec::is_empty) {
        return Err(required("spec.containers"));
    }
    for (i, c) in containers.into_iter().flatten().enumerate() {
        for field in ["name", "image"] {
            if c.get(field)
                .and_then(Value::as_str)
                .is_none_or(str::is_empty)
            {
                return Err(required(&format!("spec.containers[{i}].{field}")));
            }
        }
    }
    for list in ["initContainers", "containers"] {
        let cs = pod
            .pointer(&format!("/spec/{list}"))
            .and_then(Value::as_array);
        for (i, c) in cs.into_iter().flatten().enumerate() {
            let at = format!("spec.{list}[{i}].resources");
            if let Some((field, cause, detail)) = extended_resource_error(&at, &c["resources"]) {
                return Err(ApiError::invalid(res, name, &field, cause, &detail));
            }
        }
    }
    let qos = qos_class(&pod["spec"]);
    pod["status"] = json!({"phase": "Pending", "qosClass": qos});
    default_pod_spec(&mut pod["spec"]);
    Ok(())
}

/// Extended resources (`example.com/dev`: a domain outside kubernetes.io) are not
/// overcommitable: a request needs a limit equal to it, and the amounts are whole numbers (the
/// pod validation's rules, with its messages).
fn extended_resource_error(at: &str, resources: &Value) -> Option<(String, &'static str, String)> {
    let extended =
        |n: &str| n.contains('/') && !n.contains("kubernetes.io/") && !n.starts_with("requests.");
    let text = |v: &Value| match v {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    };
    let limits = resources.get("limits").and_then(Value::as_object);
    let requests = resources.get("requests").and_then(Value::as_object);
    for (n, q) in requests.into_iter().flatten().filter(|(n, _)| extended(n)) {
        match limits.and_then(|l| l.get(n)) {
            None => {
                let detail = "Required value: Limit must be set for non overcommitable resources";
                return Some((format!("{at}.limits"), "FieldValueRequired", detail.into()));
            }
            Some(l) if text(l) != text(q) => {
                let detail = format!(
                    "Invalid value: {:?}: must be equal to {n} limit of {}",
                    text(q),
                    text(l)
                );
                return Some((format!("{at}.requests[{n}]"), "FieldValueInvalid", detail));
            }
            Some(_) => {}
        }
    }
    for (n, q) in limits.into_iter().flatten().filter(|(n, _)| extended(n)) {
        if text(q).parse::<u64>().is_err() {
            let detail = format!("Invalid value: {:?}: must be an integer", text(q));
            return Some((format!("{at}.limits[{n}]"), "FieldValueInvalid", detail));
        }
    }
    None
}

/// The defaults kube-apiserver fills into a pod spec that the kubelet reads.
fn default_pod_spec(spec: &mut Value) {
    if !spec.is_object() {
        return;
    }
    for (field, value) in [
        ("restartPolicy", json!("Always")),
        ("terminationGracePeriodSeconds", json!(30)),
        ("dnsPolicy", json!("ClusterFirst")),
        ("schedulerName", json!("default-scheduler")),
        ("securityContext", json!({})),
    ] {
        if spec.get(field).is_none() {
            spec[field] = value;
        }
    }
    for list in ["initContainers", "containers"] {
        let Some(cs) = spec.get_mut(list).and_then(Value::as_array_mut) else {
            continue;
        };
        for c in cs.iter_mut().filter(|c| c.is_object()) {
            let image = c.get("image").and_then(Value::as_str).unwrap_or("");
            let last = image.rsplit('/').next().unwrap_or("");
            let latest = !image.contains('@') && (!last.contains(':') || last.ends_with(":latest"));
            let policy = if latest { "Always" } else { "IfNotPresent" };
            for (field, value) in [
                ("imagePullPolicy", policy),
                ("terminationMessagePath", "/dev/termination-log"),
                ("terminationMessagePolicy", "File"),
            ] {
                if c.get(field).is_none() {
                    c[field] = json!(value);
                }
            }
            if c.get("resources").is_none() {
                c["resources"] = json!({});
            }
        }
    }
}

/// A pod's `resize` subresource (kube-apiserver's `ValidatePodResize`): `old` with the cpu and
/// memory of its containers' (and sidecars') resources taken from `new`; any other change, a
/// change of another resource or of the QoS class is refused.
fn resized_pod(res: &Resource, name: &str, old: &Value, new: &Value) -> Result<Value, ApiError> {
    let forbidden = |field: &str, msg: &str| {
        Err(ApiError::invalid(
            res,
            name,
            field,
            "FieldValueForbidden",
            &format!("Forbidden: {msg}"),
        ))
    };
    let mut next = old.clone();
    let mut new_spec = new.get("spec").cloned().unwrap_or_default();
    default_pod_spec(&mut new_spec);
    let mut seen = old.get("spec").cloned().unwrap_or_default();
    for list in ["initContainers", "containers"] {
        let (olds, news) = (
            old.pointer(&format!("/spec/{list}"))
                .and_then(Value::as_array),
            new_spec.get(list).and_then(Value::as_array),
        );
        if olds.map_or(0, Vec::len) != news.map_or(0, Vec::len) {
            return forbidden(
                "spec",
                "pod resize may not change fields other than cpu and memory resources",
            );
        }
        for (i, (o, n)) in olds
            .into_iter()
            .flatten()
            .zip(news.into_iter().flatten())
            .enumerate()
        {
            let field = format!("spec.{list}[{i}].resources");
            let (was, asked) = (&o["resources"], &n["resources"]);
            for part in ["requests", "limits"] {
                let others = |v: &Value| {
                    let mut m = v.get(part).cloned().unwrap_or_else(|| json!({}));
                    if let Some(m) = m.as_object_mut() {
                        m.remove("cpu");
                        m.remove("memory");
                    }
                    m
                };
                if others(was) != others(asked) {
                    return forbidden(&field, "only cpu and memory resources are mutable");
                }
            }
            if list == "initContainers" && was != asked && o["restartPolicy"] != "Always" {
                return forbidden(&field, "only sidecar init containers can be resized");
            }
            seen[list][i]["resources"] = asked.clone();
            next["spec"][list][i]["resources"] = asked.clone();
        }
    }
    if seen != new_spec {
        return forbidden(
            "spec",
            "pod resize may not change fields other than cpu and memory resources",
        );
    }
    if qos_class(&next["spec"]) != qos_class(&old["spec"]) {
        return forbidden(
            "spec",
            "Pod QOS Class may not change as a result of resizing",
        );
    }
    Ok(next)
}

/// Pod specs are immutable on update except container images, activeDeadlineSeconds,
/// tolerations and terminationGracePeriodSeconds (kube-apiserver's `ValidatePodUpdate`).
fn check_pod_update(res: &Resource, name: &str, old: &Value, new: &Value) -> Result<(), ApiError> {
    let mutable_removed = |pod: &Value| {
        let mut spec = pod.get("spec").cloned().unwrap_or_default();
        for list in ["initContainers", "containers"] {
            for c in spec
                .get_mut(list)
                .and_then(Value::as_array_mut)
                .into_iter()
                .flatten()
            {
                if let Some(c) = c.as_object_mut() {
                    c.remove("image");
                }
            }
        }
        if let Some(m) = spec.as_object_mut() {
            for f in [
                "activeDeadlineSeconds",
                "tolerations",
                "terminationGracePeriodSeconds",
            ] {
                m.remove(f);
            }
        }
        spec
    };
    if mutable_removed(old) == mutable_removed(new) {
        return Ok(());
    }
    let msg = "Forbidden: pod updates may not change fields other than `spec.containers[*].image`,`spec.initContainers[*].image`,`spec.activeDeadlineSeconds`,`spec.tolerations` (only additions to existing tolerations),`spec.terminationGracePeriodSeconds` (allow it to be set to 1 if it was previously negative)";
    Err(ApiError::invalid(
        res,
        name,
        "spec",
        "FieldValueForbidden",
        msg,
    ))
}

/// BestEffort without any cpu/memory request or limit; Guaranteed when every container limits
/// both and requests equal limits; Burstable otherwise.
fn qos_class(spec: &Value) -> &'static str {
    let (mut any, mut guaranteed) = (false, true);
    for list in ["initContainers", "containers"] {
        for c in spec
            .get(list)
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            let requests = &c["resources"]["requests"];
            let limits = &c["resources"]["limits"];
            for r in ["cpu", "memory"] {
                let (req, lim) = (requests.get(r), limits.get(r));
                any |= req.is_some() || lim.is_some();
                guaranteed &= lim.is_some() && req.is_none_or(|q| Some(q) == lim);
            }
        }
    }
    match (any, guaranteed) {
        (false, _) => "BestEffort",
        (true, true) => "Guaranteed",
        (true, false) => "Burstable",
    }
}
