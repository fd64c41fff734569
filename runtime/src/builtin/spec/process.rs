//! The container process: command line, environment, working directory, OOM score, and stop
//! signal names.

use std::path::PathBuf;

use super::invalid;
use crate::{Result, cri};

/// `PATH` when neither the image nor the request sets one (containerd's `WithDefaultPathEnv`).
pub(super) const DEFAULT_PATH: &str =
    "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// The command line, merged like containerd (and Docker before it):
/// * CRI `command` set: `command + args` (the image's entrypoint and cmd are ignored);
/// * otherwise: image entrypoint + (CRI `args`, or the image cmd when those are empty).
pub(super) fn args(
    config: &cri::ContainerConfig,
    image: &images::ImageConfig,
) -> Result<Vec<String>> {
    let mut out = Vec::new();
    if config.command.is_empty() {
        // An entrypoint of [""] means "no entrypoint" (Docker's way to reset it).
        if !(image.entrypoint.len() == 1 && image.entrypoint.first().is_some_and(|e| e.is_empty()))
        {
            out.extend(image.entrypoint.iter().cloned());
        }
        if config.args.is_empty() {
            out.extend(image.cmd.iter().cloned());
        } else {
            out.extend(config.args.iter().cloned());
        }
    } else {
        out.extend(config.command.iter().cloned());
        out.extend(config.args.iter().cloned());
    }
    if out.is_empty() {
        return Err(invalid(
            "no command specified: the request has no command or args and the image has no \
             entrypoint or cmd",
        ));
    }
    if out.first().is_some_and(|a| a.is_empty()) {
        return Err(invalid(format!(
            "the command {out:?} starts with an empty string"
        )));
    }
    if let Some(a) = out.iter().find(|a| a.contains('\0')) {
        return Err(invalid(format!(
            "command argument {a:?} contains a NUL byte"
        )));
    }
    Ok(out)
}

fn env_key(entry: &str) -> &str {
    entry.split_once('=').map_or(entry, |(k, _)| k)
}

/// Layers `overrides` onto `base` the way containerd's `WithEnv` does: `KEY=VALUE` replaces an
/// existing `KEY` in place or is appended; a bare `KEY` removes it.
fn replace_or_append(base: &mut Vec<String>, overrides: impl IntoIterator<Item = String>) {
    for entry in overrides {
        let key = env_key(&entry).to_string();
        let pos = base.iter().position(|e| env_key(e) == key);
        match (pos, entry.contains('=')) {
            (Some(i), true) => {
                if let Some(slot) = base.get_mut(i) {
                    *slot = entry;
                }
            }
            (None, true) => base.push(entry),
            (Some(_), false) => base.retain(|e| env_key(e) != key),
            (None, false) => {}
        }
    }
}

/// The environment: a default `PATH` and `HOSTNAME`, then the image's, then the request's
/// (later ones win by key), then `HOME` from the user's passwd entry (or `/`) unless set.
pub(super) fn env(
    hostname: &str,
    image_env: &[String],
    envs: &[cri::KeyValue],
    home: Option<&str>,
) -> Result<Vec<String>> {
    let mut out = vec![DEFAULT_PATH.to_string(), format!("HOSTNAME={hostname}")];
    replace_or_append(
        &mut out,
        image_env.iter().filter(|e| !e.is_empty()).cloned(),
    );
    let mut requested = Vec::with_capacity(envs.len());
    for kv in envs {
        if kv.key.is_empty() || kv.key.contains('=') || kv.key.contains('\0') {
            return Err(invalid(format!(
                "environment variable name {:?} is invalid",
                kv.key
            )));
        }
        if kv.value.contains('\0') {
            return Err(invalid(format!(
                "environment variable {} has a value with a NUL byte",
                kv.key
            )));
        }
        requested.push(format!("{}={}", kv.key, kv.value));
    }
    replace_or_append(&mut out, requested);
    if !out.iter().any(|e| env_key(e) == "HOME") {
        out.push(format!(
            "HOME={}",
            home.filter(|h| !h.is_empty()).unwrap_or("/")
        ));
    }
    Ok(out)
}

/// The working directory: the request's, else the image's, else `/`.
pub(super) fn cwd(config: &cri::ContainerConfig, image: &images::ImageConfig) -> Result<PathBuf> {
    let (what, dir) = if !config.working_dir.is_empty() {
        ("working_dir", config.working_dir.as_str())
    } else if let Some(d) = image.working_dir.as_deref().filter(|d| !d.is_empty()) {
        ("the image's WorkingDir", d)
    } else {
        return Ok(PathBuf::from("/"));
    };
    if !dir.starts_with('/') || dir.contains('\0') {
        return Err(invalid(format!("{what} {dir:?} is not an absolute path")));
    }
    Ok(PathBuf::from(dir))
}

/// The container's `oom_score_adj`: the requested one (only when the request has resources,
/// like containerd), within [-1000, 1000], and never below `floor`, our own: lowering a score
/// below the writer's needs CAP_SYS_RESOURCE, which nodelet cannot count on (containerd's
/// `restrict_oom_score_adj`, always on here).
/// The first clamp is a warning (once per process: it holds for every container after it).
pub(super) fn oom_score_adj(config: &cri::ContainerConfig, floor: Option<i32>) -> Option<i32> {
    static WARNED: std::sync::Once = std::sync::Once::new();
    let resources = config.linux.as_ref()?.resources.as_ref()?;
    let adj = i32::try_from(resources.oom_score_adj.clamp(-1000, 1000)).unwrap_or(0);
    Some(match floor {
        Some(f) if adj < f => {
            WARNED.call_once(|| {
                tracing::warn!(
                    requested = adj,
                    own = f,
                    "containers' oom_score_adj is kept at the runtime's own or above: lowering \
                     it below needs CAP_SYS_RESOURCE"
                );
            });
            f
        }
        _ => adj,
    })
}

/// Linux signal numbers by name (x86_64 and aarch64 agree), without the `SIG` prefix.
const SIGNALS: &[(&str, i32)] = &[
    ("HUP", 1),
    ("INT", 2),
    ("QUIT", 3),
    ("ILL", 4),
    ("TRAP", 5),
    ("ABRT", 6),
    ("IOT", 6),
    ("BUS", 7),
    ("FPE", 8),
    ("KILL", 9),
    ("USR1", 10),
    ("SEGV", 11),
    ("USR2", 12),
    ("PIPE", 13),
    ("ALRM", 14),
    ("TERM", 15),
    ("STKFLT", 16),
    ("CHLD", 17),
    ("CLD", 17),
    ("CONT", 18),
    ("STOP", 19),
    ("TSTP", 20),
    ("TTIN", 21),
    ("TTOU", 22),
    ("URG", 23),
    ("XCPU", 24),
    ("XFSZ", 25),
    ("VTALRM", 26),
    ("PROF", 27),
    ("WINCH", 28),
    ("IO", 29),
    ("POLL", 29),
    ("PWR", 30),
    ("SYS", 31),
];

/// glibc's SIGRTMIN and SIGRTMAX (the kernel's 32 and 33 are taken by the C library).
const SIGRTMIN: i32 = 34;
const SIGRTMAX: i32 = 64;

/// Parses a stop signal as images and Docker write it: `"SIGTERM"`, `"TERM"`, `"15"`,
/// `"SIGRTMIN+3"`, case-insensitively. `None` if it names no Linux signal.
pub fn parse_signal(s: &str) -> Option<i32> {
    let s = s.trim();
    if let Ok(n) = s.parse::<i32>() {
        return (1..=SIGRTMAX).contains(&n).then_some(n);
    }
    let upper = s.to_ascii_uppercase();
    let name = upper.strip_prefix("SIG").unwrap_or(&upper);
    if let Some((_, n)) = SIGNALS.iter().find(|(k, _)| *k == name) {
        return Some(*n);
    }
    let rt = |base: i32, rest: &str, sign: i32| -> Option<i32> {
        if !rest.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        let off = if rest.is_empty() {
            0
        } else {
            rest.parse::<i32>().ok()?
        };
        let n = base.checked_add(sign.checked_mul(off)?)?;
        (SIGRTMIN..=SIGRTMAX).contains(&n).then_some(n)
    };
    if let Some(rest) = name.strip_prefix("RTMIN") {
        return match rest.strip_prefix('+') {
            Some(r) if !r.is_empty() => rt(SIGRTMIN, r, 1),
            None if rest.is_empty() => Some(SIGRTMIN),
            _ => None,
        };
    }
    if let Some(rest) = name.strip_prefix("RTMAX") {
        return match rest.strip_prefix('-') {
            Some(r) if !r.is_empty() => rt(SIGRTMAX, r, -1),
            None if rest.is_empty() => Some(SIGRTMAX),
            _ => None,
        };
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(command: &[&str], args: &[&str]) -> cri::ContainerConfig {
        cri::ContainerConfig {
            command: command.iter().map(|s| s.to_string()).collect(),
            args: args.iter().map(|s| s.to_string()).collect(),
            ..Default::default()
        }
    }

    fn img(entrypoint: &[&str], cmd: &[&str]) -> images::ImageConfig {
        images::ImageConfig {
            entrypoint: entrypoint.iter().map(|s| s.to_string()).collect(),
            cmd: cmd.iter().map(|s| s.to_string()).collect(),
            ..Default::default()
        }
    }

    #[test]
    fn command_and_args_merge_like_containerd() {
        #[allow(clippy::type_complexity)]
        let cases: &[(&[&str], &[&str], &[&str], &[&str], &[&str])] = &[
            // (cri command, cri args, image entrypoint, image cmd, expected)
            (&[], &[], &["/ep"], &["c1", "c2"], &["/ep", "c1", "c2"]),
            (&[], &["a1"], &["/ep"], &["c1"], &["/ep", "a1"]),
            (&["/cmd"], &[], &["/ep"], &["c1"], &["/cmd"]),
            (
                &["/cmd"],
                &["a1", "a2"],
                &["/ep"],
                &["c1"],
                &["/cmd", "a1", "a2"],
            ),
            (&[], &[], &[], &["/bin/sh"], &["/bin/sh"]),
            (&[], &["/bin/true"], &[], &["/bin/sh"], &["/bin/true"]),
            (&[], &[], &[""], &["/bin/sh", "-c"], &["/bin/sh", "-c"]),
        ];
        for (command, args_, ep, cmd, want) in cases {
            let got = args(&cfg(command, args_), &img(ep, cmd)).unwrap();
            assert_eq!(
                got, *want,
                "command {command:?} args {args_:?} ep {ep:?} cmd {cmd:?}"
            );
        }
    }

    #[test]
    fn no_command_at_all_is_invalid() {
        let err = args(&cfg(&[], &[]), &img(&[], &[])).unwrap_err();
        assert_eq!(err.code(), crate::Code::InvalidArgument);
        assert!(err.message().contains("no command specified"), "{err}");
        assert!(args(&cfg(&[""], &[]), &img(&[], &[])).is_err());
    }

    fn kv(k: &str, v: &str) -> cri::KeyValue {
        cri::KeyValue {
            key: k.into(),
            value: v.into(),
        }
    }

    #[test]
    fn env_layers_defaults_image_and_request() {
        let image_env = vec!["PATH=/img/bin".to_string(), "A=img".into(), "B=img".into()];
        let got = env(
            "pod",
            &image_env,
            &[kv("B", "cri"), kv("C", "")],
            Some("/home/u"),
        )
        .unwrap();
        assert_eq!(
            got,
            [
                "PATH=/img/bin",
                "HOSTNAME=pod",
                "A=img",
                "B=cri",
                "C=",
                "HOME=/home/u"
            ]
        );
        // HOME from the request or the image wins over passwd; "/" without either.
        let got = env("h", &["HOME=/img".into()], &[], Some("/home/u")).unwrap();
        assert!(got.contains(&"HOME=/img".to_string()), "{got:?}");
        let got = env("h", &[], &[kv("HOME", "/cri")], None).unwrap();
        assert_eq!(got.last().map(String::as_str), Some("HOME=/cri"));
        let got = env("h", &[], &[], None).unwrap();
        assert_eq!(got, [DEFAULT_PATH, "HOSTNAME=h", "HOME=/"]);
        // A bare KEY in the image removes the default.
        let got = env("h", &["HOSTNAME".into()], &[], None).unwrap();
        assert_eq!(got, [DEFAULT_PATH, "HOME=/"]);
        for bad in ["", "A=B", "A\0"] {
            assert!(env("h", &[], &[kv(bad, "x")], None).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn working_dir_precedence() {
        let mut c = cfg(&["/x"], &[]);
        let mut i = img(&[], &[]);
        assert_eq!(cwd(&c, &i).unwrap(), PathBuf::from("/"));
        i.working_dir = Some("/img".into());
        assert_eq!(cwd(&c, &i).unwrap(), PathBuf::from("/img"));
        c.working_dir = "/cri".into();
        assert_eq!(cwd(&c, &i).unwrap(), PathBuf::from("/cri"));
        c.working_dir = "rel".into();
        let err = cwd(&c, &i).unwrap_err();
        assert!(err.message().contains("working_dir \"rel\""), "{err}");
    }

    #[test]
    fn oom_score_adj_is_clamped_to_our_own() {
        let with = |adj: i64| cri::ContainerConfig {
            linux: Some(cri::LinuxContainerConfig {
                resources: Some(cri::LinuxContainerResources {
                    oom_score_adj: adj,
                    ..Default::default()
                }),
                security_context: None,
            }),
            ..Default::default()
        };
        let cases = [
            (with(-998), Some(0), Some(0)),
            (with(-998), Some(-999), Some(-998)),
            (with(1000), Some(0), Some(1000)),
            (with(5000), None, Some(1000)),
            (with(i64::MIN), None, Some(-1000)),
            (with(500), Some(600), Some(600)),
            (cri::ContainerConfig::default(), Some(0), None),
        ];
        for (c, floor, want) in cases {
            assert_eq!(oom_score_adj(&c, floor), want, "{c:?} floor {floor:?}");
        }
    }

    #[test]
    fn signals_parse() {
        let cases = [
            ("SIGTERM", Some(15)),
            ("TERM", Some(15)),
            ("sigterm", Some(15)),
            ("15", Some(15)),
            (" SIGKILL ", Some(9)),
            ("SIGQUIT", Some(3)),
            ("SIGWINCH", Some(28)),
            ("SIGUSR1", Some(10)),
            ("SIGRTMIN", Some(34)),
            ("SIGRTMIN+3", Some(37)),
            ("RTMAX-1", Some(63)),
            ("SIGRTMAX", Some(64)),
            ("SIGRTMIN+31", None),
            ("SIGRTMIN+", None),
            ("SIGRTMIN++3", None),
            ("RTMAX--1", None),
            ("SIGRTMINX", None),
            ("64", Some(64)),
            ("65", None),
            ("0", None),
            ("-9", None),
            ("", None),
            ("SIG", None),
            ("SIGFOO", None),
        ];
        for (s, want) in cases {
            assert_eq!(parse_signal(s), want, "{s:?}");
        }
    }
}
