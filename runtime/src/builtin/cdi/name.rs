//! CDI names: the `vendor/class` kind of a spec file, the name of a device in it, and the fully
//! qualified `vendor/class=name` a container asks for, with the CDI reference parser's character
//! rules (vendor and class: a letter first, then letters, digits, `_`, `-` and `.`, a letter or
//! digit last; device name: a letter or digit first, then also `:`, a letter or digit last).

use std::fmt;

/// Why a name is not a CDI name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct NameError(String);

/// A fully qualified CDI device name, `vendor/class=name`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct QualifiedName {
    pub vendor: String,
    pub class: String,
    pub name: String,
}

impl fmt::Display for QualifiedName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}={}", self.vendor, self.class, self.name)
    }
}

impl QualifiedName {
    /// Parses `vendor/class=name`, checking each part.
    pub fn parse(device: &str) -> Result<QualifiedName, NameError> {
        let Some((kind, name)) = device.split_once('=') else {
            return Err(NameError(format!(
                "{device:?} is not a qualified CDI device name (vendor/class=name)"
            )));
        };
        let (vendor, class) =
            parse_kind(kind).map_err(|e| NameError(format!("CDI device name {device:?}: {e}")))?;
        check_device_name(name)
            .map_err(|e| NameError(format!("CDI device name {device:?}: {e}")))?;
        Ok(QualifiedName {
            vendor,
            class,
            name: name.to_string(),
        })
    }
}

/// Splits and checks a `vendor/class` kind.
pub fn parse_kind(kind: &str) -> Result<(String, String), NameError> {
    let Some((vendor, class)) = kind
        .split_once('/')
        .filter(|(v, c)| !v.is_empty() && !c.is_empty())
    else {
        return Err(NameError(format!(
            "kind {kind:?} must be vendor/class (as vendor.com/device)"
        )));
    };
    check_vendor_or_class("vendor", vendor)?;
    check_vendor_or_class("class", class)?;
    Ok((vendor.to_string(), class.to_string()))
}

fn alnum(c: char) -> bool {
    c.is_ascii_alphanumeric()
}

/// A vendor or class: a letter first, a letter or digit last, letters, digits, `_`, `-`, `.`
/// between.
fn check_vendor_or_class(what: &str, s: &str) -> Result<(), NameError> {
    let mut chars = s.chars();
    let first = chars.next();
    if !first.is_some_and(|c| c.is_ascii_alphabetic()) {
        return Err(NameError(format!("{what} {s:?} must start with a letter")));
    }
    check_middle_and_last(what, s, &['_', '-', '.'])
}

/// A device name: a letter or digit first and last, letters, digits, `_`, `-`, `.`, `:`
/// between.
pub fn check_device_name(s: &str) -> Result<(), NameError> {
    if !s.chars().next().is_some_and(alnum) {
        return Err(NameError(format!(
            "device name {s:?} must start with a letter or a digit"
        )));
    }
    check_middle_and_last("device name", s, &['_', '-', '.', ':'])
}

fn check_middle_and_last(what: &str, s: &str, extra: &[char]) -> Result<(), NameError> {
    let chars: Vec<char> = s.chars().collect();
    if chars.len() > 1 {
        if let Some(c) = chars[1..chars.len() - 1]
            .iter()
            .find(|c| !alnum(**c) && !extra.contains(c))
        {
            return Err(NameError(format!(
                "{what} {s:?} has the invalid character {c:?}"
            )));
        }
    }
    if !chars.last().is_some_and(|c| alnum(*c)) {
        return Err(NameError(format!(
            "{what} {s:?} must end with a letter or a digit"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn qualified_names_parse() {
        let n = QualifiedName::parse("vendor.com/gpu=0").unwrap();
        assert_eq!(
            (n.vendor.as_str(), n.class.as_str(), n.name.as_str()),
            ("vendor.com", "gpu", "0")
        );
        assert_eq!(n.to_string(), "vendor.com/gpu=0");
        for ok in [
            "a/b=c",
            "nvidia.com/gpu=all",
            "foo.bar.baz/foo-bar123.B_az=GPU-1:2.x_y",
            "example.com/class=1",
        ] {
            QualifiedName::parse(ok).unwrap_or_else(|e| panic!("{ok}: {e}"));
        }
    }

    #[test]
    fn bad_names_say_why() {
        for (bad, why) in [
            ("", "not a qualified CDI device name"),
            ("gpu0", "not a qualified CDI device name"),
            ("/dev/null", "not a qualified CDI device name"),
            ("vendor.com=gpu0", "must be vendor/class"),
            ("/class=x", "must be vendor/class"),
            ("vendor.com/=x", "must be vendor/class"),
            ("vendor.com/gpu=", "must start with a letter or a digit"),
            (
                "1vendor/gpu=x",
                "vendor \"1vendor\" must start with a letter",
            ),
            ("vendor/gpu/x=y", "invalid character '/'"),
            ("vendor-/gpu=x", "must end with a letter or a digit"),
            ("vendor/gpu=x y", "invalid character ' '"),
            ("vendor/gpu=x:", "must end with a letter or a digit"),
            ("vendor/gpu=-x", "must start with a letter or a digit"),
            (
                "vendor/g pu=x",
                "class \"g pu\" has the invalid character ' '",
            ),
        ] {
            let err = QualifiedName::parse(bad).unwrap_err().to_string();
            assert!(err.contains(why), "{bad:?}: {err}");
        }
    }
}
