//! Where one pod's start goes: the CRI calls the kubelet logic made between a pod's hand-off
//! and the status that showed it Running, recorded through the runtime seam's decorator
//! ([`runtime::Instrumented`]) while one pod at a time starts, and folded into phases:
//! - **to the sandbox**: hand-off until `RunPodSandbox` began (the worker's hand-off, the
//!   sync's preparation and its first read of the pod);
//! - **sandbox**, **image check** (`ImageStatus`), **create**, **start**: the runtime's calls;
//! - **after start**: `StartContainer` returned until the status said Running (the runtime's
//!   events or the relist, the PLEG's read, the second sync and its status);
//! - **reads**: the time of the read calls (list and status of sandboxes and containers) in
//!   the whole window, and how many there were; they overlap the phases above.
//!
//! With `BENCH_TIMELINE_DEBUG=1` each window's calls are printed to stderr (`op@ms`, the time a
//! call began after the hand-off, in the order they returned).

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use runtime::Observer;

/// The calls of one window.
#[derive(Default)]
pub struct Timeline {
    on: AtomicBool,
    calls: Mutex<Vec<Call>>,
}

#[derive(Clone, Copy)]
struct Call {
    op: &'static str,
    began: Instant,
    took: Duration,
}

impl Observer for Timeline {
    fn observe(&self, op: &'static str, took: Duration, _ok: bool) {
        if self.on.load(Ordering::Relaxed) {
            let began = Instant::now()
                .checked_sub(took)
                .unwrap_or_else(Instant::now);
            lock(&self.calls).push(Call { op, began, took });
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// One pod's start, in phases (see the module's text).
#[derive(Debug, Default, Clone, Copy)]
pub struct Breakdown {
    pub to_sandbox: Duration,
    pub sandbox: Duration,
    pub image_check: Duration,
    pub create: Duration,
    pub start: Duration,
    pub after_start: Duration,
    pub reads: Duration,
    pub read_calls: usize,
}

const READS: &[&str] = &[
    "list_podsandbox",
    "podsandbox_status",
    "list_containers",
    "container_status",
];

impl Timeline {
    /// Starts recording a new window.
    pub fn begin(&self) {
        lock(&self.calls).clear();
        self.on.store(true, Ordering::Relaxed);
    }

    /// Stops recording and folds the window from `handed` to `running` into phases; `None`
    /// when the window lacks a sandbox or a container start (the pod did not start through
    /// them).
    pub fn end(&self, handed: Instant, running: Instant) -> Option<Breakdown> {
        self.on.store(false, Ordering::Relaxed);
        let calls: Vec<Call> = lock(&self.calls)
            .drain(..)
            .filter(|c| c.began >= handed && c.began <= running)
            .collect();
        let first = |op: &str| calls.iter().find(|c| c.op == op).copied();
        let sum = |op: &str| calls.iter().filter(|c| c.op == op).map(|c| c.took).sum();
        if std::env::var_os("BENCH_TIMELINE_DEBUG").is_some() {
            let ops: Vec<String> = calls
                .iter()
                .map(|c| format!("{}@{:.1}", c.op, (c.began - handed).as_secs_f64() * 1e3))
                .collect();
            eprintln!("TIMELINE {}", ops.join(" "));
        }
        let sandbox = first("run_podsandbox")?;
        let start = first("start_container")?;
        let reads: Vec<&Call> = calls.iter().filter(|c| READS.contains(&c.op)).collect();
        Some(Breakdown {
            to_sandbox: sandbox.began.saturating_duration_since(handed),
            sandbox: sandbox.took,
            image_check: sum("image_status"),
            create: sum("create_container"),
            start: start.took,
            after_start: running.saturating_duration_since(start.began + start.took),
            reads: reads.iter().map(|c| c.took).sum(),
            read_calls: reads.len(),
        })
    }
}

/// Prints the median of each phase over `samples`.
pub fn print(samples: &[Breakdown]) {
    if samples.is_empty() {
        return;
    }
    let med = |f: &dyn Fn(&Breakdown) -> Duration| {
        let mut v: Vec<Duration> = samples.iter().map(f).collect();
        v.sort();
        v[v.len() / 2].as_secs_f64() * 1e3
    };
    let mut calls: Vec<usize> = samples.iter().map(|b| b.read_calls).collect();
    calls.sort_unstable();
    println!(
        "   {:<11} one pod, median ms: to the sandbox {:.1} | sandbox {:.1} | image check {:.1} | create {:.1} | start {:.1} | after start {:.1} | reads {:.1} in {} calls (n={})",
        "",
        med(&|b| b.to_sandbox),
        med(&|b| b.sandbox),
        med(&|b| b.image_check),
        med(&|b| b.create),
        med(&|b| b.start),
        med(&|b| b.after_start),
        med(&|b| b.reads),
        calls[calls.len() / 2],
        samples.len()
    );
}
