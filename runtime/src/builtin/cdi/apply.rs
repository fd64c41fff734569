//! CDI edits applied to a container's OCI spec, as the reference implementation applies them
//! (env set or replaced by name, a device node or mount replacing the one at its path, mounts
//! sorted parents first, additional groups added), with the checks the built-in runtime needs
//! on top: see the module's doc for what is refused.

use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Component, Path, PathBuf};

use oci_spec::runtime::{
    Hook as OciHook, Hooks, LinuxDevice, LinuxDeviceCgroup, LinuxDeviceType, LinuxNamespaceType,
    Mount as OciMount, Spec,
};

use super::Error;
use super::registry::Part;
use super::spec::{DeviceNode, Hook, Mount};

/// The longest a CDI hook may run, in seconds, and what a hook without a timeout gets: hooks run
/// in the pod's sandbox process (or the container's init), which serves nothing else meanwhile.
pub const HOOK_TIMEOUT_MAX: i64 = 30;

/// Applies `parts`, in order, to `oci`.
pub fn apply(oci: &mut Spec, parts: &[Part]) -> Result<(), Error> {
    let userns = oci
        .linux()
        .as_ref()
        .and_then(|l| l.namespaces().as_ref())
        .is_some_and(|ns| ns.iter().any(|n| n.typ() == LinuxNamespaceType::User));
    for part in parts {
        Edit {
            oci: &mut *oci,
            origin: &part.origin,
            userns,
        }
        .apply(part)?;
    }
    Ok(())
}

struct Edit<'a> {
    oci: &'a mut Spec,
    origin: &'a str,
    userns: bool,
}

/// An absolute path without `..` or NUL, as a container path must be.
fn container_path(p: &str) -> Option<PathBuf> {
    let path = Path::new(p);
    (path.is_absolute()
        && !p.contains('\0')
        && !path.components().any(|c| c == Component::ParentDir))
    .then(|| path.to_path_buf())
}

impl Edit<'_> {
    fn error(&self, reason: impl Into<String>) -> Error {
        Error::Edit {
            origin: self.origin.to_string(),
            reason: reason.into(),
        }
    }

    fn refuse(&self, what: impl Into<String>) -> Error {
        Error::Refused {
            origin: self.origin.to_string(),
            what: what.into(),
        }
    }

    fn apply(&mut self, part: &Part) -> Result<(), Error> {
        let e = &part.edits;
        if e.intel_rdt.is_some() {
            return Err(self.refuse(
                "intelRdt (a resctrl class of service) is not supported by nodelet's built-in \
                 runtime",
            ));
        }
        self.env(&e.env)?;
        for d in &e.device_nodes {
            self.device_node(d)?;
        }
        for m in &e.mounts {
            self.mount(m)?;
        }
        if !e.mounts.is_empty() {
            // Parents before what is mounted below them (the order stays among equals).
            if let Some(mounts) = self.oci.mounts_mut() {
                mounts.sort_by_key(|m| m.destination().components().count());
            }
        }
        for h in &e.hooks {
            self.hook(h)?;
        }
        self.additional_gids(&e.additional_gids);
        Ok(())
    }

    /// Each `NAME=value` replaces `NAME` in place or is appended.
    fn env(&mut self, env: &[String]) -> Result<(), Error> {
        if env.is_empty() {
            return Ok(());
        }
        if let Some(bad) = env.iter().find(|e| e.contains('\0')) {
            return Err(self.error(format!("env {bad:?} contains a NUL byte")));
        }
        let Some(process) = self.oci.process_mut() else {
            return Ok(());
        };
        let mut out = process.env().clone().unwrap_or_default();
        for entry in env {
            let key = entry.split_once('=').map_or(entry.as_str(), |(k, _)| k);
            match out
                .iter_mut()
                .find(|e| e.split_once('=').map_or(e.as_str(), |(k, _)| k) == key)
            {
                Some(slot) => slot.clone_from(entry),
                None => out.push(entry.clone()),
            }
        }
        process.set_env(Some(out));
        Ok(())
    }

    fn device_node(&mut self, d: &DeviceNode) -> Result<(), Error> {
        let path = container_path(&d.path)
            .filter(|p| p.starts_with("/dev"))
            .ok_or_else(|| {
                self.error(format!(
                    "device node path {:?} must be an absolute path under /dev without \"..\" (the \
                     runtime creates device nodes only there)",
                    d.path
                ))
            })?;
        let host = if d.host_path.is_empty() {
            d.path.as_str()
        } else {
            d.host_path.as_str()
        };
        if !host.starts_with('/') || host.contains('\0') {
            return Err(self.error(format!(
                "device node {:?}: hostPath {host:?} must be an absolute path",
                d.path
            )));
        }
        if self.userns && Path::new(host) != path {
            return Err(self.refuse(format!(
                "device node {:?} from host path {host:?}: in a pod user namespace a device node is \
                 bound from the same path on the host, so its hostPath must be its path",
                d.path
            )));
        }
        let filled = self.fill(d, host)?;
        let mut dev = oci_spec::runtime::LinuxDeviceBuilder::default()
            .path(path.clone())
            .typ(filled.typ)
            .major(filled.major)
            .minor(filled.minor)
            .build()
            .map_err(|e| self.error(format!("device node {:?}: {e}", d.path)))?;
        dev.set_file_mode(filled.file_mode);
        let user = self.oci.process().as_ref().map(|p| p.user().clone());
        dev.set_uid(d.uid.or(user.as_ref().map(|u| u.uid()).filter(|u| *u > 0)));
        dev.set_gid(d.gid.or(user.as_ref().map(|u| u.gid()).filter(|g| *g > 0)));
        let access = match d.permissions.as_str() {
            "" => Some("rwm"),
            "none" => None,
            p => Some(p),
        };
        let rule_type = match filled.typ {
            LinuxDeviceType::B => Some(LinuxDeviceType::B),
            LinuxDeviceType::C | LinuxDeviceType::U => Some(LinuxDeviceType::C),
            _ => None,
        };
        let linux = self.oci.linux_mut().get_or_insert_with(Default::default);
        let mut devices: Vec<LinuxDevice> = linux.devices().clone().unwrap_or_default();
        devices.retain(|x| x.path() != &path);
        devices.push(dev);
        linux.set_devices(Some(devices));
        if let (Some(access), Some(typ)) = (access, rule_type) {
            let mut rule = LinuxDeviceCgroup::default();
            rule.set_allow(true);
            rule.set_typ(Some(typ));
            rule.set_major(Some(filled.major));
            rule.set_minor(Some(filled.minor));
            rule.set_access(Some(access.to_string()));
            let resources = linux.resources_mut().get_or_insert_with(Default::default);
            let mut rules = resources.devices().clone().unwrap_or_default();
            rules.push(rule);
            resources.set_devices(Some(rules));
        }
        Ok(())
    }

    /// The node's type, numbers and mode, what the spec leaves out read from the host's node
    /// (not following a final symlink), as the reference implementation does.
    fn fill(&self, d: &DeviceNode, host: &str) -> Result<Filled, Error> {
        let minimal = !d.typ.is_empty() && (d.major != 0 || d.typ == "p");
        let mut f = Filled {
            typ: device_type(&d.typ),
            major: d.major,
            minor: d.minor,
            file_mode: d.file_mode.map(|m| m & 0o777),
        };
        let meta = match std::fs::symlink_metadata(host) {
            Ok(m) => m,
            Err(_) if minimal => return Ok(f),
            Err(e) => {
                return Err(self.error(format!(
                    "device node {:?}: host device {host:?}: {e}",
                    d.path
                )));
            }
        };
        f.file_mode = f.file_mode.or(Some(meta.mode() & 0o777));
        if minimal {
            return Ok(f);
        }
        let ft = meta.file_type();
        let (host_type, letter) = if ft.is_block_device() {
            (LinuxDeviceType::B, "b")
        } else if ft.is_char_device() {
            (LinuxDeviceType::C, "c")
        } else if ft.is_fifo() {
            (LinuxDeviceType::P, "p")
        } else {
            return Err(self.error(format!(
                "device node {:?}: host path {host:?} is not a device node",
                d.path
            )));
        };
        if d.typ.is_empty() {
            f.typ = host_type;
        } else if d.typ != letter && !(d.typ == "u" && letter == "c") {
            return Err(self.error(format!(
                "device node {:?}: type {:?}, but host path {host:?} is of type {letter:?}",
                d.path, d.typ
            )));
        }
        if letter != "p" && d.major == 0 {
            f.major = nix::sys::stat::major(meta.rdev()) as i64;
            f.minor = nix::sys::stat::minor(meta.rdev()) as i64;
        }
        Ok(f)
    }

    fn mount(&mut self, m: &Mount) -> Result<(), Error> {
        let dest = container_path(&m.container_path).ok_or_else(|| {
            self.error(format!(
                "mount containerPath {:?} must be an absolute path without \"..\"",
                m.container_path
            ))
        })?;
        let mut options = m.options.clone();
        let is_bind = m.typ == "bind" || options.iter().any(|o| o == "bind" || o == "rbind");
        let typ = match (m.typ.as_str(), is_bind) {
            ("", true) => "bind".to_string(),
            ("", false) => {
                return Err(self.error(format!(
                    "mount {:?} -> {:?} is neither a bind mount (option bind or rbind) nor of a \
                     type",
                    m.host_path, m.container_path
                )));
            }
            (t, _) => t.to_string(),
        };
        if is_bind {
            let source = Path::new(&m.host_path);
            if !source.is_absolute() || m.host_path.contains('\0') {
                return Err(self.error(format!(
                    "mount hostPath {:?} must be an absolute path",
                    m.host_path
                )));
            }
            // Unlike a CRI mount's, a missing source is not made: it is the spec's to provide.
            if let Err(e) = std::fs::metadata(source) {
                return Err(self.error(format!(
                    "mount {:?} -> {:?}: the host path: {e}",
                    m.host_path, m.container_path
                )));
            }
            if !options.iter().any(|o| o == "bind" || o == "rbind") {
                options.push("bind".to_string());
            }
        }
        let mut mount = OciMount::default();
        mount.set_destination(dest.clone());
        mount.set_typ(Some(typ));
        mount.set_source(Some(PathBuf::from(&m.host_path)));
        mount.set_options(Some(options));
        let mut mounts = self.oci.mounts().clone().unwrap_or_default();
        mounts.retain(|x| x.destination() != &dest);
        mounts.push(mount);
        self.oci.set_mounts(Some(mounts));
        Ok(())
    }

    fn hook(&mut self, h: &Hook) -> Result<(), Error> {
        let name = h.hook_name.as_str();
        if name == "poststart" {
            return Err(self.refuse(format!(
                "poststart hook {:?}: not run by nodelet's built-in runtime (a failing poststart \
                 hook would fail StartContainer with the container already running)",
                h.path
            )));
        }
        if !h.path.starts_with('/') || h.path.contains('\0') {
            return Err(self.error(format!(
                "{name} hook path {:?} must be an absolute path",
                h.path
            )));
        }
        // A startContainer hook runs in the container: its path is the container's.
        if name != "startContainer" && !Path::new(&h.path).is_file() {
            return Err(self.error(format!(
                "{name} hook {:?} is not a file on the host",
                h.path
            )));
        }
        let timeout = match h.timeout {
            Some(t) if t <= 0 => {
                return Err(self.error(format!(
                    "{name} hook {:?}: timeout {t} must be greater than zero",
                    h.path
                )));
            }
            Some(t) => t.min(HOOK_TIMEOUT_MAX),
            None => HOOK_TIMEOUT_MAX,
        };
        let mut hook = OciHook::default();
        hook.set_path(PathBuf::from(&h.path));
        hook.set_args((!h.args.is_empty()).then(|| h.args.clone()));
        hook.set_env((!h.env.is_empty()).then(|| h.env.clone()));
        hook.set_timeout(Some(timeout));
        let hooks = self.oci.hooks_mut().get_or_insert_with(Hooks::default);
        let list = match name {
            // libcontainer runs the (deprecated) prestart hooks right before the createRuntime
            // ones, in the same place.
            "prestart" | "createRuntime" => hooks.create_runtime_mut(),
            "createContainer" => hooks.create_container_mut(),
            "startContainer" => hooks.start_container_mut(),
            "poststop" => hooks.poststop_mut(),
            other => {
                return Err(self.error(format!("unknown hook name {other:?}")));
            }
        };
        list.get_or_insert_with(Vec::new).push(hook);
        Ok(())
    }

    /// Added to the process's groups; 0 is ignored, as CDI says.
    fn additional_gids(&mut self, gids: &[u32]) {
        let Some(process) = self.oci.process_mut() else {
            return;
        };
        let user = process.user_mut();
        let mut groups = user.additional_gids().clone().unwrap_or_default();
        for g in gids.iter().copied().filter(|g| *g != 0) {
            if !groups.contains(&g) {
                groups.push(g);
            }
        }
        if !groups.is_empty() {
            user.set_additional_gids(Some(groups));
        }
    }
}

/// A device node's type and numbers, filled in.
struct Filled {
    typ: LinuxDeviceType,
    major: i64,
    minor: i64,
    file_mode: Option<u32>,
}

fn device_type(t: &str) -> LinuxDeviceType {
    match t {
        "b" => LinuxDeviceType::B,
        "u" => LinuxDeviceType::U,
        "p" => LinuxDeviceType::P,
        _ => LinuxDeviceType::C,
    }
}
