//! The checks of a network list and of an attachment before any plugin runs.

use crate::{Attachment, Error, NetworkList, SUPPORTED_VERSIONS, Target, config};

pub(crate) fn check_network(net: &NetworkList) -> Result<(), Error> {
    let bad = |why: String| Error::Config {
        path: net.source.clone(),
        why,
    };
    config::check_name(&net.name)
        .map_err(|why| bad(format!("network name {:?} {why}", net.name)))?;
    if net.plugins.is_empty() {
        return Err(bad("no plugins".to_string()));
    }
    if !SUPPORTED_VERSIONS.contains(&net.cni_version.as_str()) {
        return Err(Error::Unsupported {
            plugin: None,
            what: format!(
                "network {:?} is CNI {:?}; supported: {}",
                net.name,
                net.cni_version,
                SUPPORTED_VERSIONS.join(", ")
            ),
        });
    }
    Ok(())
}

pub(crate) fn check_attachment(att: &Attachment, netns_needed: bool) -> Result<(), Error> {
    if netns_needed && att.netns.as_os_str().is_empty() {
        return Err(invalid(&att.container_id, &att.ifname, "no netns".into()));
    }
    check_target(&Target::of(att))
}

/// The spec's rules for the container ID, the interface name and CNI_ARGS (which also keep the
/// cache entry's name a file name).
pub(crate) fn check_target(t: &Target<'_>) -> Result<(), Error> {
    let bad = |why: String| invalid(t.container_id, t.ifname, why);
    config::check_name(t.container_id).map_err(|why| bad(format!("container ID {why}")))?;
    let ifname = t.ifname;
    if ifname.is_empty() || ifname.len() > 15 {
        return Err(bad("the interface name must have 1 to 15 bytes".into()));
    }
    if ifname == "."
        || ifname == ".."
        || ifname
            .chars()
            .any(|c| c == '/' || c == ':' || c.is_whitespace())
    {
        return Err(bad(
            "the interface name holds '/', ':' or white space, or is . or ..".into(),
        ));
    }
    for (k, v) in t.args {
        if k.is_empty() || k.contains(['=', ';']) || v.contains(';') {
            return Err(bad(format!(
                "CNI_ARGS pair {k:?}={v:?}: keys need no '=' or ';', values no ';'"
            )));
        }
    }
    Ok(())
}

fn invalid(container_id: &str, ifname: &str, why: String) -> Error {
    Error::InvalidAttachment {
        container_id: container_id.to_string(),
        ifname: ifname.to_string(),
        why,
    }
}
