//! The processes of a node under benchmark and what they cost: which processes belong to the
//! built-in runtime's node (the agent and its sandbox processes) or to a containerd node
//! (containerd, its shims and their other children), their memory (PSS) and their CPU time.

use std::collections::{BTreeMap, HashMap, HashSet};

use anyhow::{Context, Result, anyhow, ensure};

/// Whose processes count: see [`group_processes`].
pub enum Kind {
    /// The runtime's root dir: sandbox processes name it on their command line. The head is
    /// this process (the agent).
    Builtin { root: String },
    /// containerd's pid and temp dir (its shims name it on their command line).
    Containerd { pid: u32, dir: String },
}

impl Kind {
    /// What the head process is called in the output.
    pub fn head(&self) -> &'static str {
        match self {
            Kind::Builtin { .. } => "agent",
            Kind::Containerd { .. } => "containerd",
        }
    }

    /// The kind of a process of the group other than the head: sandboxes; shims; pause and
    /// other shim children.
    pub fn part(&self, p: &Proc) -> &'static str {
        match self {
            Kind::Builtin { .. } => "sandboxes",
            Kind::Containerd { .. } if p.cmdline.contains("containerd-shim") => "shims",
            Kind::Containerd { .. } => "pause/other",
        }
    }
}

pub struct Proc {
    pub pid: u32,
    pub ppid: u32,
    /// NUL-separated, as in /proc/<pid>/cmdline.
    pub cmdline: String,
}

pub fn processes() -> Vec<Proc> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
            continue;
        };
        // `pid (comm) state ppid ...`; comm may hold spaces and parentheses.
        let Some(ppid) = stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().nth(1))
            .and_then(|p| p.parse().ok())
        else {
            continue;
        };
        let cmdline = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
        out.push(Proc {
            pid,
            ppid,
            cmdline: String::from_utf8_lossy(&cmdline).into_owned(),
        });
    }
    out
}

/// The processes of a backend: `group` (first the agent or containerd, then the sandbox
/// processes, or the shims and their other descendants) and `apps` (the containers' processes).
pub struct Group {
    pub group: Vec<Proc>,
    pub apps: Vec<Proc>,
}

/// The processes of `kind`'s node; `is_app` tells a container's process by its command line
/// among the shims' children (the built-in runtime's sandboxes run nothing but containers).
pub fn group_processes(kind: &Kind, is_app: impl Fn(&str) -> bool) -> Result<Group> {
    let all = processes();
    let (head, marker) = match kind {
        Kind::Builtin { root } => (std::process::id(), root.as_str()),
        Kind::Containerd { pid, dir } => (*pid, dir.as_str()),
    };
    let mut members: HashSet<u32> = all
        .iter()
        .filter(|p| p.pid == head || p.cmdline.contains(marker))
        .map(|p| p.pid)
        .collect();
    ensure!(members.contains(&head), "process {head} is gone");
    // Descendants of the sandbox processes / shims (not of the agent's or containerd's other
    // children): the containers, and for containerd the pause processes and runc.
    let mut apps = HashSet::new();
    let roots: HashSet<u32> = members.iter().copied().filter(|p| *p != head).collect();
    let mut frontier: Vec<u32> = roots.into_iter().collect();
    while let Some(parent) = frontier.pop() {
        for p in all.iter().filter(|p| p.ppid == parent) {
            if members.contains(&p.pid) || apps.contains(&p.pid) {
                continue;
            }
            if is_app(&p.cmdline) {
                apps.insert(p.pid);
            } else if matches!(kind, Kind::Containerd { .. }) {
                members.insert(p.pid);
            } else {
                apps.insert(p.pid);
            }
            frontier.push(p.pid);
        }
    }
    let mut group = Vec::new();
    let mut app_procs = Vec::new();
    for p in all {
        if p.pid == head {
            group.insert(0, p);
        } else if members.contains(&p.pid) {
            group.push(p);
        } else if apps.contains(&p.pid) {
            app_procs.push(p);
        }
    }
    Ok(Group {
        group,
        apps: app_procs,
    })
}

/// PSS in kB of the head process (agent / containerd), by kind of the others, and of the apps.
pub struct Memory {
    pub head_name: &'static str,
    pub head: u64,
    /// (kind, count, PSS kB): sandbox processes; shims; pause and other shim children.
    pub others: BTreeMap<&'static str, (usize, u64)>,
    /// Private dirty kB of the same kinds: what each process costs whatever it shares.
    pub others_dirty: BTreeMap<&'static str, u64>,
    pub apps: (usize, u64),
}

impl Memory {
    pub fn total(&self) -> u64 {
        self.head + self.others.values().map(|(_, kb)| kb).sum::<u64>()
    }

    pub fn print(&self, name: &str) {
        let mut parts = vec![format!("{} {:.1}", self.head_name, mib(self.head))];
        for (kind, (count, kb)) in &self.others {
            parts.push(format!(
                "{count} {kind} {:.1} ({:.2} each)",
                mib(*kb),
                mib(*kb) / (*count).max(1) as f64
            ));
        }
        println!(
            "   {name:<11} memory PSS {:>6.1} MiB = {}; containers' own processes: {} with {:.1} MiB (not counted)",
            mib(self.total()),
            parts.join(" + "),
            self.apps.0,
            mib(self.apps.1)
        );
    }
}

/// The PSS of `procs` (from [`group_processes`] of `kind`).
pub fn memory(kind: &Kind, procs: &Group) -> Memory {
    let mut mem = Memory {
        head_name: kind.head(),
        head: 0,
        others: BTreeMap::new(),
        others_dirty: BTreeMap::new(),
        apps: (0, 0),
    };
    for (i, p) in procs.group.iter().enumerate() {
        // A process may exit between the listing and the read (a runc call): skip it.
        let Ok(kb) = pss(p.pid) else { continue };
        if i == 0 {
            mem.head = kb;
            continue;
        }
        let e = mem.others.entry(kind.part(p)).or_default();
        e.0 += 1;
        e.1 += kb;
        if let Ok(dirty) = rollup_kb(p.pid, "Private_Dirty:") {
            *mem.others_dirty.entry(kind.part(p)).or_default() += dirty;
        }
    }
    for p in &procs.apps {
        if let Ok(kb) = pss(p.pid) {
            mem.apps.0 += 1;
            mem.apps.1 += kb;
        }
    }
    mem
}

/// PSS in kB from /proc/<pid>/smaps_rollup.
pub fn pss(pid: u32) -> Result<u64> {
    rollup_kb(pid, "Pss:")
}

/// One `field:` (with its colon) of /proc/<pid>/smaps_rollup, in kB.
pub fn rollup_kb(pid: u32, field: &str) -> Result<u64> {
    let path = format!("/proc/{pid}/smaps_rollup");
    let text = std::fs::read_to_string(&path).with_context(|| format!("reading {path}"))?;
    text.lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .ok_or_else(|| anyhow!("no {field} in {path}"))
}

pub fn mib(kb: u64) -> f64 {
    kb as f64 / 1024.0
}

/// CPU time of a process in clock ticks from /proc/<pid>/stat: utime + stime of all its
/// threads, plus cutime + cstime (the children it waited for, such as runc or an exec'd
/// command). `None` when it is gone.
pub fn cpu_ticks(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // After `(comm)`: state is field 3; utime, stime, cutime, cstime are fields 14 to 17.
    let rest = stat.rsplit_once(')')?.1;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let field = |n: usize| fields.get(n - 3).and_then(|v| v.parse::<i64>().ok());
    let sum = field(14)? + field(15)? + field(16)? + field(17)?;
    u64::try_from(sum).ok()
}

/// Clock ticks per second (`sysconf(_SC_CLK_TCK)`): the `AT_CLKTCK` entry of this process's
/// auxiliary vector (pairs of native words), 100 when it cannot be read.
pub fn clock_ticks() -> u64 {
    const AT_CLKTCK: u64 = 17;
    const WORD: usize = std::mem::size_of::<usize>();
    let auxv = std::fs::read("/proc/self/auxv").unwrap_or_default();
    let word = |c: &[u8]| {
        let mut b = [0u8; 8];
        b[..WORD].copy_from_slice(c);
        u64::from_ne_bytes(b)
    };
    auxv.chunks_exact(2 * WORD)
        .find(|e| word(&e[..WORD]) == AT_CLKTCK)
        .map(|e| word(&e[WORD..]))
        .filter(|t| *t > 0)
        .unwrap_or(100)
}

/// CPU ticks of each process by pid.
pub fn cpu_snapshot<'a>(procs: impl IntoIterator<Item = &'a Proc>) -> HashMap<u32, u64> {
    procs
        .into_iter()
        .filter_map(|p| Some((p.pid, cpu_ticks(p.pid)?)))
        .collect()
}

/// The ticks `pid` used between two snapshots: the difference when it is in both, everything
/// when it started in between (a pid seen only at the start is gone: its time went to its
/// parent's cutime, or is lost when the parent is not counted).
pub fn cpu_used(before: &HashMap<u32, u64>, after: &HashMap<u32, u64>, pid: u32) -> u64 {
    match (before.get(&pid), after.get(&pid)) {
        (Some(b), Some(a)) => a.saturating_sub(*b),
        (None, Some(a)) => *a,
        _ => 0,
    }
}

/// Busy and total jiffies of the whole machine (the `cpu` line of /proc/stat).
pub fn machine_ticks() -> Option<(u64, u64)> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    let line = stat.lines().find(|l| l.starts_with("cpu "))?;
    let v: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .filter_map(|x| x.parse().ok())
        .collect();
    // user nice system idle iowait irq softirq steal [guest guest_nice, already in user]
    let total: u64 = v.iter().take(8).sum();
    let idle = v.get(3).copied().unwrap_or(0) + v.get(4).copied().unwrap_or(0);
    Some((total - idle, total))
}
