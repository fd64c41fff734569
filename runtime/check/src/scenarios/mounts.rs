//! Host directories mounted into containers: read-write and read-only, and the propagation of
//! mounts made on the host afterwards (seen with HostToContainer, not with Private).

use std::path::{Path, PathBuf};

use nix::mount::{MntFlags, MsFlags};
use runtime::cri;

use crate::ctx::Ctx;
use crate::outcome::{Step, Stop, ensure, ensure_eq};

/// A host directory made a shared mount point of its own (so that mounts below it propagate
/// to the containers' slave copies), and a tmpfs mounted below it later; both unmounted and the
/// directory removed when dropped, whatever the scenario's end.
struct SharedDir {
    dir: PathBuf,
    below: Vec<PathBuf>,
}

impl SharedDir {
    fn new(dir: PathBuf) -> Step<SharedDir> {
        let fail = |what: &str, e: &dyn std::fmt::Display| {
            Stop::Skip(format!("{what} {}: {e} (mounts need root)", dir.display()))
        };
        std::fs::create_dir_all(dir.join("sub")).map_err(|e| fail("creating", &e))?;
        let shared = SharedDir {
            dir: dir.clone(),
            below: Vec::new(),
        };
        nix::mount::mount(
            Some(&dir),
            &dir,
            None::<&str>,
            MsFlags::MS_BIND,
            None::<&str>,
        )
        .map_err(|e| fail("bind-mounting", &e))?;
        nix::mount::mount(
            None::<&str>,
            &dir,
            None::<&str>,
            MsFlags::MS_SHARED,
            None::<&str>,
        )
        .map_err(|e| fail("making shared", &e))?;
        Ok(shared)
    }

    /// Mounts a tmpfs on `sub` below the directory.
    fn mount_tmpfs(&mut self, sub: &str) -> Step<PathBuf> {
        let at = self.dir.join(sub);
        nix::mount::mount(
            Some("tmpfs"),
            &at,
            Some("tmpfs"),
            MsFlags::empty(),
            Some("size=1m"),
        )
        .map_err(|e| Stop::Fail(format!("mounting a tmpfs on {}: {e}", at.display())))?;
        self.below.push(at.clone());
        Ok(at)
    }
}

impl Drop for SharedDir {
    fn drop(&mut self) {
        for m in self.below.iter().rev().chain(std::iter::once(&self.dir)) {
            if let Err(e) = nix::mount::umount2(m, MntFlags::MNT_DETACH) {
                tracing::warn!(mount = %m.display(), "unmounting: {e}");
            }
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn mount(host: &Path, at: &str, readonly: bool, propagation: cri::MountPropagation) -> cri::Mount {
    cri::Mount {
        container_path: at.into(),
        host_path: host.to_string_lossy().into_owned(),
        readonly,
        propagation: propagation as i32,
        ..Default::default()
    }
}

pub async fn mounts_and_propagation(c: &Ctx<'_>) -> Step {
    let mut shared = SharedDir::new(c.host_dir("shared"))?;
    std::fs::write(shared.dir.join("from-host"), "hello\n")
        .map_err(|e| Stop::Fail(format!("writing in {}: {e}", shared.dir.display())))?;
    let pod = c.pod("mounts").await?;
    let run = |name: &str, readonly: bool, propagation: cri::MountPropagation| {
        let mut cfg = c.container_config(name, &["sleep", "600"]);
        cfg.mounts = vec![mount(&shared.dir, "/data", readonly, propagation)];
        cfg
    };
    let slave = c
        .run_with(
            &pod,
            run(
                "slave",
                false,
                cri::MountPropagation::PropagationHostToContainer,
            ),
        )
        .await?;
    let private = c
        .run_with(
            &pod,
            run("private", false, cri::MountPropagation::PropagationPrivate),
        )
        .await?;
    let readonly = c
        .run_with(
            &pod,
            run("readonly", true, cri::MountPropagation::PropagationPrivate),
        )
        .await?;

    let r = c.exec(&private, &["cat", "/data/from-host"]).await?;
    ensure_eq!(
        r.out,
        "hello\n",
        "a host file through a mount (stderr {:?})",
        r.err
    );
    let r = c
        .exec(&private, &["sh", "-c", "echo back > /data/from-container"])
        .await?;
    ensure_eq!(
        r.code,
        0,
        "writing through a read-write mount (stderr {:?})",
        r.err
    );
    let back = std::fs::read_to_string(shared.dir.join("from-container")).unwrap_or_default();
    ensure_eq!(back, "back\n", "the container's file, seen on the host");
    let r = c.exec(&readonly, &["touch", "/data/refused"]).await?;
    ensure!(r.code != 0, "writing through a read-only mount succeeded");
    ensure!(
        !shared.dir.join("refused").exists(),
        "a read-only mount let a file through"
    );

    // A mount made on the host now reaches the HostToContainer container only.
    let sub = shared.mount_tmpfs("sub")?;
    std::fs::write(sub.join("marker"), "mounted later\n")
        .map_err(|e| Stop::Fail(format!("writing in {}: {e}", sub.display())))?;
    let r = c.exec(&slave, &["cat", "/data/sub/marker"]).await?;
    ensure_eq!(
        (r.code, r.out.as_str()),
        (0, "mounted later\n"),
        "a host mount made after the start, through HostToContainer (stderr {:?})",
        r.err
    );
    let r = c.exec(&private, &["ls", "/data/sub"]).await?;
    ensure_eq!(
        (r.code, r.out.as_str()),
        (0, ""),
        "the same mount through Private: the empty directory below it"
    );
    Ok(())
}
