//! Field and label selectors of list and watch requests.

use serde_json::Value;

use super::store::{ApiError, Resource};

#[derive(Debug, Clone)]
enum Label {
    Eq(String, String),
    NotEq(String, String),
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
    Exists(String),
    NotExists(String),
}

#[derive(Debug, Clone, Default)]
pub struct Selector {
    /// (field path, value, equal?)
    fields: Vec<(String, String, bool)>,
    labels: Vec<Label>,
}

/// The pod fields kube-apiserver lets a field selector name (`registry/core/pod.ToSelectableFields`).
const POD_FIELDS: &[&str] = &[
    "spec.nodeName",
    "spec.restartPolicy",
    "spec.schedulerName",
    "spec.serviceAccountName",
    "spec.hostNetwork",
    "status.phase",
    "status.podIP",
    "status.nominatedNodeName",
];

fn selectable(res: &Resource, field: &str) -> bool {
    match (res.kind, field) {
        (_, "metadata.name" | "metadata.namespace") => true,
        ("Pod", f) => POD_FIELDS.contains(&f),
        ("Node", f) => f == "spec.unschedulable",
        ("CertificateSigningRequest", f) => f == "spec.signerName",
        // Events select on many of their fields (involvedObject.*, reason, type, source...).
        ("Event", _) => true,
        _ => false,
    }
}

/// The string a field selector compares: missing fields are "", booleans "true"/"false".
fn field_value(obj: &Value, field: &str) -> String {
    let pointer = format!("/{}", field.replace('.', "/"));
    match obj.pointer(&pointer) {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Bool(b)) => b.to_string(),
        Some(Value::Number(n)) => n.to_string(),
        _ => String::new(),
    }
}

/// Splits on commas outside parentheses.
fn terms(s: &str) -> Vec<&str> {
    let (mut out, mut depth, mut start) = (Vec::new(), 0i32, 0);
    for (i, c) in s.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            ',' if depth == 0 => {
                out.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    out.push(&s[start..]);
    out.into_iter()
        .map(str::trim)
        .filter(|t| !t.is_empty())
        .collect()
}

fn set_values(rest: &str) -> Option<Vec<String>> {
    let inner = rest.trim().strip_prefix('(')?.strip_suffix(')')?;
    Some(inner.split(',').map(|v| v.trim().to_string()).collect())
}

fn parse_label(term: &str) -> Result<Label, ApiError> {
    let bad = || ApiError::bad_request(format!("unable to parse requirement: {term}"));
    if let Some(k) = term.strip_prefix('!') {
        return Ok(Label::NotExists(k.trim().to_string()));
    }
    if let Some((k, v)) = term.split_once("!=") {
        return Ok(Label::NotEq(k.trim().into(), v.trim().into()));
    }
    if let Some((k, v)) = term.split_once("==").or_else(|| term.split_once('=')) {
        return Ok(Label::Eq(k.trim().into(), v.trim().into()));
    }
    if let Some((k, rest)) = term.split_once(" notin ") {
        return Ok(Label::NotIn(
            k.trim().into(),
            set_values(rest).ok_or_else(bad)?,
        ));
    }
    if let Some((k, rest)) = term.split_once(" in ") {
        return Ok(Label::In(
            k.trim().into(),
            set_values(rest).ok_or_else(bad)?,
        ));
    }
    if term.contains(|c: char| c.is_whitespace() || "()<>".contains(c)) {
        return Err(bad());
    }
    Ok(Label::Exists(term.to_string()))
}

impl Selector {
    pub fn parse(
        res: &Resource,
        fields: Option<&str>,
        labels: Option<&str>,
    ) -> Result<Self, ApiError> {
        let mut sel = Selector::default();
        for term in terms(fields.unwrap_or("")) {
            let (field, value, eq) = if let Some((f, v)) = term.split_once("!=") {
                (f, v, false)
            } else if let Some((f, v)) = term.split_once("==").or_else(|| term.split_once('=')) {
                (f, v, true)
            } else {
                return Err(ApiError::bad_request(format!(
                    "invalid selector: '{term}'; can't understand '{term}'"
                )));
            };
            let field = field.trim();
            if !selectable(res, field) {
                return Err(ApiError::bad_request(format!(
                    "field label not supported: {field}"
                )));
            }
            sel.fields
                .push((field.to_string(), value.trim().to_string(), eq));
        }
        for term in terms(labels.unwrap_or("")) {
            sel.labels.push(parse_label(term)?);
        }
        Ok(sel)
    }

    /// A selector for one object by name (a watch on `.../pods/{name}`).
    pub fn with_name(mut self, name: &str) -> Self {
        self.fields
            .push(("metadata.name".into(), name.into(), true));
        self
    }

    pub fn matches(&self, _res: &Resource, obj: &Value) -> bool {
        let fields_ok = self
            .fields
            .iter()
            .all(|(f, v, eq)| (field_value(obj, f) == *v) == *eq);
        let labels = obj.pointer("/metadata/labels");
        let label = |k: &str| labels.and_then(|l| l.get(k)).and_then(Value::as_str);
        fields_ok
            && self.labels.iter().all(|l| match l {
                Label::Eq(k, v) => label(k) == Some(v.as_str()),
                Label::NotEq(k, v) => label(k) != Some(v.as_str()),
                Label::In(k, vs) => label(k).is_some_and(|x| vs.iter().any(|v| v == x)),
                Label::NotIn(k, vs) => label(k).is_none_or(|x| vs.iter().all(|v| v != x)),
                Label::Exists(k) => label(k).is_some(),
                Label::NotExists(k) => label(k).is_none(),
            })
    }
}
