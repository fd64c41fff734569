//! Helpers the benchmarks share: the machine's load, the root check, statistics, cleaning up
//! what a run left behind (mounts, cgroups), and the processes of a node with their memory and
//! CPU time ([`procs`]), a built-in runtime's node: its image, pod network, removing its pods
//! ([`node`]).
#![allow(dead_code)]

pub mod node;
pub mod procs;
pub mod soak;

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, ensure};

/// The load average (1, 5, 15 minutes) as /proc/loadavg gives it.
pub fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "?".into())
}

/// When the built-in runtime re-executed this bench binary as a sandbox process
/// (`<binary> __sandbox STATE_DIR`): runs it and gives its exit code. Call it first in `main`,
/// before anything starts a thread.
pub fn run_sandbox_if_asked() -> Option<std::process::ExitCode> {
    use runtime::builtin::SANDBOX_SUBCOMMAND;
    let args: Vec<std::ffi::OsString> = std::env::args_os().collect();
    if args.get(1).is_none_or(|a| a != SANDBOX_SUBCOMMAND) {
        return None;
    }
    let Some(dir) = args.get(2) else {
        eprintln!("usage: {SANDBOX_SUBCOMMAND} STATE_DIR");
        return Some(std::process::ExitCode::from(2));
    };
    nodelet::logging::init_sandbox();
    let code = runtime::builtin::sandbox_main(Path::new(dir));
    Some(std::process::ExitCode::from(
        u8::try_from(code).unwrap_or(1),
    ))
}

/// Whether `main` goes on to bench `name` (what its SKIP line says it does): `cargo bench`
/// passes `--bench`, `cargo test --benches` does not (and must not run it), and the benches
/// need root. Prints why not.
pub fn bench_run(name: &str, what: &str) -> bool {
    if !std::env::args().any(|a| a == "--bench") {
        println!("benches/{name}.rs: not a benchmark run; use `cargo bench --bench {name}`");
        return false;
    }
    if !is_root() {
        println!("SKIP (needs root): {what}");
        return false;
    }
    true
}

/// A positive count from environment variable `name`; `default` when it is not set.
pub fn env_count(name: &str, default: usize) -> Result<usize> {
    match std::env::var(name) {
        Err(_) => Ok(default),
        Ok(s) => s
            .trim()
            .parse::<usize>()
            .ok()
            .filter(|n| *n > 0)
            .ok_or_else(|| anyhow::anyhow!("{name} must be a positive integer, not {s:?}")),
    }
}

/// Logs to stderr as `NODELET_LOG` says (warnings by default).
pub fn init_logging() {
    let filter = tracing_subscriber::EnvFilter::try_from_env("NODELET_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn,libcgroups=error"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .try_init();
}

/// Runs `bench` on a multi-thread tokio runtime: success, or its error printed and a failure.
pub fn run_bench(bench: impl std::future::Future<Output = Result<()>>) -> std::process::ExitCode {
    let result = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting tokio")
        .and_then(|tokio| tokio.block_on(bench));
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

/// True when this process runs as root.
pub fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status").is_ok_and(|s| {
        s.lines()
            .find(|l| l.starts_with("Uid:"))
            .is_some_and(|l| l.split_whitespace().nth(2) == Some("0"))
    })
}

/// Lazily unmounts whatever is still mounted under `dir`, deepest first.
pub fn unmount_under(dir: &Path) -> Result<()> {
    let info = std::fs::read_to_string("/proc/self/mountinfo").context("reading mountinfo")?;
    let mut points: Vec<PathBuf> = info
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .map(unescape_mountinfo)
        .map(PathBuf::from)
        .filter(|p| p.starts_with(dir))
        .collect();
    points.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
    points.dedup();
    for p in points {
        eprintln!("cleanup: unmounting leftover {}", p.display());
        let st = Command::new("umount")
            .arg("-l")
            .arg(&p)
            .status()
            .with_context(|| format!("running umount -l {}", p.display()))?;
        ensure!(st.success(), "umount -l {} failed ({st})", p.display());
    }
    Ok(())
}

/// mountinfo escapes space, tab, newline and backslash as `\ooo`.
fn unescape_mountinfo(s: &str) -> String {
    s.replace("\\040", " ")
        .replace("\\011", "\t")
        .replace("\\012", "\n")
        .replace("\\134", "\\")
}

/// Removes `cgroup` (absolute, cgroupfs style) and every cgroup below it, in every hierarchy
/// mounted under /sys/fs/cgroup (or in the unified hierarchy mounted there).
pub fn remove_cgroup(cgroup: &str) -> Result<()> {
    let rel = cgroup.trim_start_matches('/');
    ensure!(!rel.is_empty(), "refusing to remove the root cgroup");
    let base = Path::new("/sys/fs/cgroup");
    let mut dirs = vec![base.join(rel)];
    let hierarchies =
        std::fs::read_dir(base).with_context(|| format!("listing {}", base.display()))?;
    for h in hierarchies.flatten() {
        if h.file_type().is_ok_and(|t| t.is_dir()) {
            dirs.push(h.path().join(rel));
        }
    }
    let mut first = None;
    for dir in dirs.iter().filter(|d| d.is_dir()) {
        if let Err(e) = remove_cgroup_dir(dir) {
            first.get_or_insert(e);
        }
    }
    match first {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

pub fn remove_cgroup_dir(dir: &Path) -> Result<()> {
    let entries = std::fs::read_dir(dir).with_context(|| format!("listing {}", dir.display()))?;
    for entry in entries.flatten() {
        if entry.file_type().is_ok_and(|t| t.is_dir()) {
            remove_cgroup_dir(&entry.path())?;
        }
    }
    std::fs::remove_dir(dir).with_context(|| format!("removing cgroup {}", dir.display()))
}

/// Median, 90th and 99th percentiles (nearest rank) and minimum of samples, in ms.
pub struct Stats {
    pub median: f64,
    pub p90: f64,
    pub p99: f64,
    pub min: f64,
    pub n: usize,
}

pub fn stats(samples: &[std::time::Duration]) -> Stats {
    let mut ms: Vec<f64> = samples.iter().map(|d| d.as_secs_f64() * 1e3).collect();
    ms.sort_by(f64::total_cmp);
    let n = ms.len();
    if n == 0 {
        return Stats {
            median: f64::NAN,
            p90: f64::NAN,
            p99: f64::NAN,
            min: f64::NAN,
            n,
        };
    }
    let rank = |q: f64| ms[((q * n as f64).ceil() as usize).clamp(1, n) - 1];
    Stats {
        median: median_sorted(&ms),
        p90: rank(0.9),
        p99: rank(0.99),
        min: ms[0],
        n,
    }
}

/// The median of sorted values (NaN for none).
pub fn median_sorted(v: &[f64]) -> f64 {
    let n = v.len();
    if n == 0 {
        f64::NAN
    } else if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}
