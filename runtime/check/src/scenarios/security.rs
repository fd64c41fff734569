//! The container's security context: user and groups, capabilities, no_new_privs, seccomp,
//! a read-only root filesystem, masked and read-only paths.

use runtime::cri;

use crate::ctx::Ctx;
use crate::outcome::{Step, ensure, ensure_eq};

/// A container `name` running `sleep 600` with the security context `sc`.
async fn run(c: &Ctx<'_>, name: &str, sc: cri::LinuxContainerSecurityContext) -> Step<String> {
    let pod = c.pod(name).await?;
    let mut cfg = c.container_config(name, &["sleep", "600"]);
    cfg.linux = Some(cri::LinuxContainerConfig {
        security_context: Some(sc),
        ..Default::default()
    });
    c.run_with(&pod, cfg).await
}

/// The value of `field` in `/proc/self/status` as the container sees it.
async fn status_field(c: &Ctx<'_>, id: &str, field: &str) -> Step<String> {
    let r = c
        .exec(id, &["grep", &format!("^{field}:"), "/proc/self/status"])
        .await?;
    ensure_eq!(
        r.code,
        0,
        "reading {field} in /proc/self/status (stderr {:?})",
        r.err
    );
    Ok(r.out
        .split_once(':')
        .map(|(_, v)| v.trim().to_string())
        .unwrap_or_default())
}

pub async fn user_and_groups(c: &Ctx<'_>) -> Step {
    let sc = cri::LinuxContainerSecurityContext {
        run_as_user: Some(cri::Int64Value { value: 1234 }),
        run_as_group: Some(cri::Int64Value { value: 2345 }),
        supplemental_groups: vec![3456, 4567],
        ..Default::default()
    };
    let id = run(c, "ids", sc).await?;
    let r = c.exec(&id, &["sh", "-c", "id -u; id -g; id -G"]).await?;
    let lines: Vec<&str> = r.out.lines().collect();
    ensure_eq!(lines.first().copied(), Some("1234"), "the container's uid");
    ensure_eq!(lines.get(1).copied(), Some("2345"), "the container's gid");
    let groups: Vec<&str> = lines
        .get(2)
        .map(|l| l.split(' ').collect())
        .unwrap_or_default();
    for g in ["2345", "3456", "4567"] {
        ensure!(
            groups.contains(&g),
            "group {g} missing from `id -G`: {groups:?}"
        );
    }
    // An exec runs as the container's user too.
    let r = c.exec(&id, &["id", "-u"]).await?;
    ensure_eq!(r.out.trim(), "1234", "an exec's uid");
    Ok(())
}

pub async fn capabilities(c: &Ctx<'_>) -> Step {
    let sc = cri::LinuxContainerSecurityContext {
        capabilities: Some(cri::Capability {
            drop_capabilities: vec!["ALL".into()],
            add_capabilities: vec!["NET_RAW".into(), "KILL".into()],
            ..Default::default()
        }),
        ..Default::default()
    };
    let id = run(c, "caps", sc).await?;
    // CAP_KILL is bit 5, CAP_NET_RAW bit 13.
    let want = format!("{:016x}", (1u64 << 5) | (1u64 << 13));
    ensure_eq!(
        status_field(c, &id, "CapEff").await?,
        want,
        "effective capabilities after dropping ALL and adding NET_RAW and KILL"
    );
    ensure_eq!(
        status_field(c, &id, "CapBnd").await?,
        want,
        "the bounding set"
    );
    let r = c.exec(&id, &["chown", "1:1", "/tmp"]).await?;
    ensure!(r.code != 0, "chown succeeded without CAP_CHOWN");
    Ok(())
}

pub async fn no_new_privs_and_seccomp(c: &Ctx<'_>) -> Step {
    let confined = cri::LinuxContainerSecurityContext {
        no_new_privs: true,
        seccomp: Some(cri::SecurityProfile {
            profile_type: cri::security_profile::ProfileType::RuntimeDefault as i32,
            localhost_ref: String::new(),
        }),
        ..Default::default()
    };
    let id = run(c, "confined", confined).await?;
    ensure_eq!(status_field(c, &id, "NoNewPrivs").await?, "1", "NoNewPrivs");
    ensure_eq!(
        status_field(c, &id, "Seccomp").await?,
        "2",
        "Seccomp mode (2: filtering) under RuntimeDefault"
    );
    let unconfined = cri::LinuxContainerSecurityContext {
        seccomp: Some(cri::SecurityProfile {
            profile_type: cri::security_profile::ProfileType::Unconfined as i32,
            localhost_ref: String::new(),
        }),
        ..Default::default()
    };
    let id = run(c, "unconfined", unconfined).await?;
    ensure_eq!(
        status_field(c, &id, "Seccomp").await?,
        "0",
        "Seccomp mode when Unconfined"
    );
    ensure_eq!(
        status_field(c, &id, "NoNewPrivs").await?,
        "0",
        "NoNewPrivs by default"
    );
    Ok(())
}

pub async fn read_only_rootfs_masked_and_read_only_paths(c: &Ctx<'_>) -> Step {
    let sc = cri::LinuxContainerSecurityContext {
        readonly_rootfs: true,
        ..Default::default()
    };
    let id = run(c, "readonly", sc).await?;
    let r = c.exec(&id, &["touch", "/new-file"]).await?;
    ensure!(
        r.code != 0,
        "writing to a read-only root filesystem succeeded"
    );

    // Masked and read-only paths on a writable root; a masked path that does not exist
    // (`/proc/scsi` on most machines) is no error, as with the kubelet's defaults.
    let sc = cri::LinuxContainerSecurityContext {
        masked_paths: vec!["/proc/timer_list".into(), "/proc/scsi".into()],
        readonly_paths: vec!["/tmp".into()],
        ..Default::default()
    };
    let id = run(c, "masked", sc).await?;
    let r = c
        .exec(&id, &["sh", "-c", "wc -c < /proc/timer_list"])
        .await?;
    ensure_eq!(
        (r.code, r.out.trim()),
        (0, "0"),
        "a masked file reads empty (stderr {:?})",
        r.err
    );
    let r = c.exec(&id, &["touch", "/tmp/new-file"]).await?;
    ensure!(r.code != 0, "writing below a read-only path succeeded");
    let r = c.exec(&id, &["touch", "/new-file"]).await?;
    ensure_eq!(
        r.code,
        0,
        "writing to the root filesystem (stderr {:?})",
        r.err
    );

    // With other paths masked and read-only, the same files are there and writable (a
    // runtime may mask more than it is told when told nothing: the lists are never empty).
    let sc = cri::LinuxContainerSecurityContext {
        masked_paths: vec!["/proc/kcore".into()],
        readonly_paths: vec!["/proc/sysrq-trigger".into()],
        ..Default::default()
    };
    let id = run(c, "plain", sc).await?;
    let r = c
        .exec(
            &id,
            &["sh", "-c", "wc -c < /proc/timer_list; touch /tmp/new-file"],
        )
        .await?;
    let size: u64 = r.out.trim().parse().unwrap_or(0);
    ensure!(
        r.code == 0 && size > 0,
        "an unmasked /proc/timer_list and a writable /tmp: {r:?}"
    );
    Ok(())
}
