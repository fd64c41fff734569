//! JSON merge patch (RFC 7386) and the strategic merge patch of the lists the kubelet patches.

use serde_json::{Map, Value};

/// RFC 7386: objects merge key by key, `null` removes, anything else replaces.
pub fn merge(target: &mut Value, patch: &Value) {
    let Value::Object(p) = patch else {
        *target = patch.clone();
        return;
    };
    if !target.is_object() {
        *target = Value::Object(Map::new());
    }
    let Value::Object(t) = target else { return };
    for (k, v) in p {
        if v.is_null() {
            t.remove(k);
        } else {
            merge(t.entry(k.clone()).or_insert(Value::Null), v);
        }
    }
}

/// The patch merge key of the list at `path` (dotted field names, list indices left out), as
/// declared by `patchMergeKey` in the core/v1 types; lists not named here are replaced.
fn merge_key(path: &str) -> Option<&'static str> {
    Some(match path {
        "metadata.ownerReferences" => "uid",
        "status.conditions" => "type",
        "status.containerStatuses"
        | "status.initContainerStatuses"
        | "status.ephemeralContainerStatuses" => "name",
        "status.podIPs" | "status.hostIPs" => "ip",
        "status.addresses" => "type",
        "status.volumesAttached" => "name",
        "spec.containers" | "spec.initContainers" | "spec.ephemeralContainers" | "spec.volumes" => {
            "name"
        }
        "spec.containers.env" | "spec.initContainers.env" => "name",
        "spec.containers.ports" | "spec.initContainers.ports" => "containerPort",
        "spec.containers.volumeMounts" | "spec.initContainers.volumeMounts" => "mountPath",
        _ => return None,
    })
}

fn directive(v: &Value) -> Option<&str> {
    v.get("$patch").and_then(Value::as_str)
}

/// A patch value with its directives removed, for places where it is stored as is.
fn clean(v: &Value) -> Value {
    match v {
        Value::Object(m) => Value::Object(
            m.iter()
                .filter(|(k, v)| !k.starts_with('$') && !v.is_null())
                .map(|(k, v)| (k.clone(), clean(v)))
                .collect(),
        ),
        Value::Array(a) => Value::Array(a.iter().map(clean).collect()),
        other => other.clone(),
    }
}

/// Strategic merge patch of `patch` (an object) into `target` at `path`: a merge patch, where
/// the lists with a merge key merge element by element, `$patch: replace|delete` act on maps
/// and list elements, and `$setElementOrder/<list>` orders the merged list.
pub fn strategic(target: &mut Value, patch: &Value, path: &str) {
    let Value::Object(p) = patch else {
        *target = patch.clone();
        return;
    };
    if directive(patch) == Some("replace") {
        *target = clean(patch);
        return;
    }
    if !target.is_object() {
        *target = Value::Object(Map::new());
    }
    let Value::Object(t) = target else { return };
    let mut orders = Vec::new();
    for (k, v) in p {
        if let Some(list) = k.strip_prefix("$setElementOrder/") {
            orders.push((list.to_string(), v));
            continue;
        }
        if k.starts_with('$') {
            continue;
        }
        let sub = join(path, k);
        match v {
            Value::Null => {
                t.remove(k);
            }
            Value::Object(_) if directive(v) == Some("delete") => {
                t.remove(k);
            }
            Value::Object(_) => strategic(t.entry(k.clone()).or_insert(Value::Null), v, &sub),
            Value::Array(items) => match merge_key(&sub) {
                Some(key) => {
                    let list = t
                        .entry(k.clone())
                        .or_insert_with(|| Value::Array(Vec::new()));
                    merge_list(list, items, key, &sub);
                }
                None => {
                    t.insert(k.clone(), clean(v));
                }
            },
            _ => {
                t.insert(k.clone(), v.clone());
            }
        }
    }
    for (list, order) in orders {
        let Some(key) = merge_key(&join(path, &list)) else {
            continue;
        };
        let (Value::Array(order), Some(Value::Array(items))) = (order, t.get_mut(&list)) else {
            continue;
        };
        let rank = |item: &Value| order.iter().position(|o| o.get(key) == item.get(key));
        items.sort_by_key(|i| rank(i).unwrap_or(usize::MAX)); // stable: others keep their order, last
    }
}

fn join(path: &str, field: &str) -> String {
    if path.is_empty() {
        field.to_string()
    } else {
        format!("{path}.{field}")
    }
}

fn merge_list(list: &mut Value, patch: &[Value], key: &str, path: &str) {
    if patch.iter().any(|e| directive(e) == Some("replace")) {
        *list = Value::Array(
            patch
                .iter()
                .filter(|e| directive(e).is_none())
                .map(clean)
                .collect(),
        );
        return;
    }
    if !list.is_array() {
        *list = Value::Array(Vec::new());
    }
    let Value::Array(items) = list else { return };
    for e in patch {
        let id = e.get(key);
        let pos = id.and_then(|id| items.iter().position(|i| i.get(key) == Some(id)));
        match (directive(e), pos) {
            (Some("delete"), Some(i)) => {
                items.remove(i);
            }
            (Some("delete"), None) => {}
            (_, Some(i)) => strategic(&mut items[i], e, path),
            (_, None) => items.push(clean(e)),
        }
    }
}
