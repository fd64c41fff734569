//! `$(VAR)` expansion as upstream's `expansion` package does it (commands, args, env values,
//! `subPathExpr`).

use std::collections::HashMap;

/// Expands `$(VAR)` references from `vars`; `$$` is a literal `$`, unknown references stay as
/// they are (upstream `expansion.Expand`).
pub fn expand(input: &str, vars: &HashMap<String, String>) -> String {
    let mut out = String::with_capacity(input.len());
    let mut rest = input;
    while let Some(i) = rest.find('$') {
        out.push_str(&rest[..i]);
        let after = &rest[i + 1..];
        if let Some(tail) = after.strip_prefix('$') {
            out.push('$');
            rest = tail;
        } else if let Some(inner) = after.strip_prefix('(') {
            match inner.find(')') {
                Some(end) => {
                    let name = &inner[..end];
                    match vars.get(name) {
                        Some(v) => out.push_str(v),
                        None => {
                            out.push_str("$(");
                            out.push_str(name);
                            out.push(')');
                        }
                    }
                    rest = &inner[end + 1..];
                }
                None => {
                    out.push_str("$(");
                    rest = inner;
                }
            }
        } else {
            out.push('$');
            rest = after;
        }
    }
    out.push_str(rest);
    out
}

/// Variables an expression names that have no value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("missing value for {}", .0.join(", "))]
pub struct MissingVars(pub Vec<String>);

/// [`expand`] where every variable must have a value (upstream's
/// `ExpandContainerVolumeMounts` for a `subPathExpr`): one unset or empty is an error naming it.
pub fn expand_all(expr: &str, vars: &HashMap<String, String>) -> Result<String, MissingVars> {
    let mut missing = std::collections::BTreeSet::new();
    let mut known = HashMap::new();
    // The references as `expand` sees them: `$$` is an escaped `$`, `$(NAME)` a variable.
    let mut rest = expr;
    while let Some(i) = rest.find('$') {
        let after = &rest[i + 1..];
        if let Some(tail) = after.strip_prefix('$') {
            rest = tail;
            continue;
        }
        let Some(inner) = after.strip_prefix('(') else {
            rest = after;
            continue;
        };
        let Some(end) = inner.find(')') else { break };
        let name = &inner[..end];
        match vars.get(name).filter(|v| !v.is_empty()) {
            Some(v) => known.insert(name.to_string(), v.clone()),
            None => {
                missing.insert(name.to_string());
                known.insert(name.to_string(), String::new())
            }
        };
        rest = &inner[end + 1..];
    }
    if !missing.is_empty() {
        return Err(MissingVars(missing.into_iter().collect()));
    }
    Ok(expand(expr, &known))
}
