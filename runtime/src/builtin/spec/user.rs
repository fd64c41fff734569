//! The container's user: uid, gid, supplementary groups and home directory, resolved against
//! the image's own /etc/passwd and /etc/group like containerd's `WithUser` and
//! `WithAdditionalGIDs`.
//!
//! The user string is containerd's: `run_as_username`, else `run_as_user`, suffixed with
//! `:<run_as_group>`; without either, the image's `User` (`name`, `uid`, `name:group`,
//! `uid:gid`). `run_as_group` alone is an error.

use std::io::Read;
use std::path::{Component, Path, PathBuf};

use super::invalid;
use crate::{Result, cri};

/// The resolved identity of the container process.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct User {
    pub uid: u32,
    pub gid: u32,
    /// Sorted, deduplicated, and including `gid` (containerd's `ensureAdditionalGids`).
    pub additional_gids: Vec<u32>,
    /// From the passwd entry, when there is one.
    pub home: Option<String>,
}

#[derive(Debug)]
struct Passwd {
    name: String,
    uid: u32,
    gid: u32,
    home: String,
}

#[derive(Debug)]
struct Group {
    name: String,
    gid: u32,
    members: Vec<String>,
}

fn parse_passwd(text: &str) -> Vec<Passwd> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.starts_with('+') && !l.starts_with('-'))
        .filter_map(|l| {
            let f: Vec<&str> = l.split(':').collect();
            Some(Passwd {
                name: f.first()?.to_string(),
                uid: f.get(2)?.trim().parse().ok()?,
                gid: f.get(3)?.trim().parse().ok()?,
                home: f.get(5).map(|s| s.to_string()).unwrap_or_default(),
            })
        })
        .filter(|p| !p.name.is_empty())
        .collect()
}

fn parse_group(text: &str) -> Vec<Group> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.starts_with('+') && !l.starts_with('-'))
        .filter_map(|l| {
            let f: Vec<&str> = l.split(':').collect();
            Some(Group {
                name: f.first()?.to_string(),
                gid: f.get(2)?.trim().parse().ok()?,
                members: f
                    .get(3)
                    .map(|m| {
                        m.split(',')
                            .map(str::trim)
                            .filter(|s| !s.is_empty())
                            .map(String::from)
                            .collect()
                    })
                    .unwrap_or_default(),
            })
        })
        .filter(|g| !g.name.is_empty())
        .collect()
}

/// Resolves `path` (absolute, inside the container) to a host path under `root`, following
/// symlinks as if `root` were `/`: nothing in the image can point us at a host file.
pub(crate) fn resolve_in_root(root: &Path, path: &Path) -> Option<PathBuf> {
    let mut pending: Vec<PathBuf> = path
        .components()
        .rev()
        .map(|c| PathBuf::from(c.as_os_str()))
        .collect();
    let mut resolved = PathBuf::new();
    let mut links = 0;
    while let Some(c) = pending.pop() {
        match c.components().next() {
            None | Some(Component::RootDir | Component::CurDir | Component::Prefix(_)) => continue,
            Some(Component::ParentDir) => {
                resolved.pop();
                continue;
            }
            Some(Component::Normal(_)) => {}
        }
        let candidate = root.join(&resolved).join(&c);
        match std::fs::symlink_metadata(&candidate) {
            Ok(m) if m.file_type().is_symlink() => {
                links += 1;
                if links > 40 {
                    return None;
                }
                let target = std::fs::read_link(&candidate).ok()?;
                if target.is_absolute() {
                    resolved = PathBuf::new();
                }
                pending.extend(
                    target
                        .components()
                        .rev()
                        .map(|c| PathBuf::from(c.as_os_str())),
                );
            }
            Ok(_) => resolved.push(&c),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => resolved.push(&c),
            Err(_) => return None,
        }
    }
    Some(root.join(resolved))
}

/// Reads `<rootfs>/etc/<name>`: `Ok(None)` when absent, an error when unreadable or not a
/// regular file (a FIFO would hang us). At most 16 MiB are read.
fn read_etc(rootfs: &Path, name: &str) -> Result<Option<String>> {
    let shown = format!("/etc/{name} of the image");
    let Some(path) = resolve_in_root(rootfs, &Path::new("/etc").join(name)) else {
        return Err(invalid(format!("cannot resolve {shown}")));
    };
    match std::fs::symlink_metadata(&path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(invalid(format!("reading {shown}: {e}"))),
        Ok(m) if !m.is_file() => return Err(invalid(format!("{shown} is not a regular file"))),
        Ok(_) => {}
    }
    let mut buf = Vec::new();
    std::fs::File::open(&path)
        .and_then(|f| f.take(16 << 20).read_to_end(&mut buf))
        .map_err(|e| invalid(format!("reading {shown}: {e}")))?;
    Ok(Some(String::from_utf8_lossy(&buf).into_owned()))
}

fn id_from_i64(v: i64, what: &str) -> Result<u32> {
    u32::try_from(v)
        .ok()
        .filter(|&id| id != u32::MAX)
        .ok_or_else(|| invalid(format!("{what} {v} is out of range")))
}

/// The user string containerd would build from the security context, else the image's user.
fn user_string(
    sc: &cri::LinuxContainerSecurityContext,
    image: &images::ImageConfig,
) -> Result<String> {
    let user = if !sc.run_as_username.is_empty() {
        Some(sc.run_as_username.clone())
    } else if let Some(u) = &sc.run_as_user {
        Some(id_from_i64(u.value, "run_as_user")?.to_string())
    } else {
        None
    };
    let group = match &sc.run_as_group {
        Some(g) => Some(id_from_i64(g.value, "run_as_group")?),
        None => None,
    };
    Ok(match (user, group) {
        (None, Some(g)) => {
            return Err(invalid(format!(
                "run_as_group {g} is specified without run_as_user or run_as_username"
            )));
        }
        (Some(u), Some(g)) => format!("{u}:{g}"),
        (Some(u), None) => u,
        (None, None) => image.user.clone().unwrap_or_default(),
    })
}

/// Resolves the container's user against the image's passwd and group files.
pub(super) fn resolve(
    rootfs: &Path,
    sc: &cri::LinuxContainerSecurityContext,
    image: &images::ImageConfig,
) -> Result<User> {
    let userstr = user_string(sc, image)?;
    let userstr = userstr.trim();
    let (user, group) = match userstr.split_once(':') {
        Some((u, g)) => (u, Some(g)),
        None => (userstr, None),
    };
    let user = if user.is_empty() && group.is_none() {
        "0"
    } else {
        user
    };
    if user.is_empty() || group.is_some_and(str::is_empty) {
        return Err(invalid(format!(
            "user {userstr:?} is not of the form user[:group]"
        )));
    }
    let passwd = read_etc(rootfs, "passwd")?.map(|t| parse_passwd(&t));
    let (uid, mut gid, name, home) = match user.parse::<u32>() {
        Ok(uid) => match passwd.iter().flatten().find(|p| p.uid == uid) {
            Some(p) => (uid, p.gid, Some(p.name.clone()), Some(p.home.clone())),
            None => (uid, 0, None, None),
        },
        Err(_) => {
            let Some(entries) = &passwd else {
                return Err(invalid(format!(
                    "user {user:?}: the image has no /etc/passwd to look the name up in"
                )));
            };
            let p = entries.iter().find(|p| p.name == user).ok_or_else(|| {
                invalid(format!(
                    "user {user:?} not found in the image's /etc/passwd"
                ))
            })?;
            (p.uid, p.gid, Some(p.name.clone()), Some(p.home.clone()))
        }
    };
    let groups = read_etc(rootfs, "group")?.map(|t| parse_group(&t));
    if let Some(g) = group {
        gid = match g.parse::<u32>() {
            Ok(gid) => gid,
            Err(_) => {
                let Some(entries) = &groups else {
                    return Err(invalid(format!(
                        "group {g:?}: the image has no /etc/group to look the name up in"
                    )));
                };
                entries
                    .iter()
                    .find(|e| e.name == g)
                    .map(|e| e.gid)
                    .ok_or_else(|| {
                        invalid(format!("group {g:?} not found in the image's /etc/group"))
                    })?
            }
        };
    }

    let policy =
        cri::SupplementalGroupsPolicy::try_from(sc.supplemental_groups_policy).map_err(|_| {
            invalid(format!(
                "unknown supplemental_groups_policy {}",
                sc.supplemental_groups_policy
            ))
        })?;
    let mut additional = vec![gid];
    if policy == cri::SupplementalGroupsPolicy::Merge {
        if let Some(name) = &name {
            additional.extend(
                groups
                    .iter()
                    .flatten()
                    .filter(|g| g.members.iter().any(|m| m == name))
                    .map(|g| g.gid),
            );
        }
    }
    for &g in &sc.supplemental_groups {
        additional.push(id_from_i64(g, "supplemental group")?);
    }
    additional.sort_unstable();
    additional.dedup();
    Ok(User {
        uid,
        gid,
        additional_gids: additional,
        home: home.filter(|h| !h.is_empty()),
    })
}

#[cfg(test)]
mod tests;
