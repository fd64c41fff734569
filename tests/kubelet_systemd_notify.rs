//! systemd's `Type=notify` protocol, as a unit with `Type=notify` and `WatchdogSec=` runs the
//! agent: a `NOTIFY_SOCKET` the test binds receives `STATUS=` lines while the standalone node
//! starts, `READY=1` once its static pods' source was seen, `WATCHDOG=1` every half of
//! `WATCHDOG_USEC` while it is healthy, and `STOPPING=1` when SIGTERM stops it.

mod common;

use std::os::unix::net::UnixDatagram;
use std::time::{Duration, Instant};

use common::standalone::Standalone;
use common::*;

const MANIFEST: &str = "apiVersion: v1\nkind: Pod\nmetadata:\n  name: web\nspec:\n  \
    terminationGracePeriodSeconds: 1\n  containers:\n  - name: main\n    image: \
    docker.io/library/busybox:latest\n    imagePullPolicy: Never\n    command: [\"sleep\", \"3600\"]\n";

/// The datagrams received within `secs` until one satisfies `until` (returned last).
fn receive_until(sock: &UnixDatagram, secs: u64, until: impl Fn(&str) -> bool) -> Vec<String> {
    let deadline = Instant::now() + Duration::from_secs(secs);
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    while Instant::now() < deadline {
        let Ok(n) = sock.recv(&mut buf) else {
            continue;
        };
        let msg = String::from_utf8_lossy(&buf[..n]).into_owned();
        let done = until(&msg);
        got.push(msg);
        if done {
            return got;
        }
    }
    panic!("not received within {secs} s; got {got:?}");
}

#[test]
fn ready_watchdog_and_stopping_reach_the_notify_socket() {
    if !root_or_skip("ready_watchdog_and_stopping_reach_the_notify_socket") {
        return;
    }
    let node = Standalone::new("");
    std::fs::write(node.manifests.join("web.yaml"), MANIFEST).unwrap();
    let socket = node.dir.path().join("notify.sock");
    let sock = UnixDatagram::bind(&socket).unwrap();
    sock.set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    let mut cmd = node.command(&[]);
    // A watchdog of 0.6 s: a WATCHDOG=1 every 0.3 s.
    cmd.env("NOTIFY_SOCKET", &socket)
        .env("WATCHDOG_USEC", "600000");
    let mut agent = KillOnDrop(cmd.spawn().expect("start nodelet"));

    let before_ready = receive_until(&sock, 60, |m| m.contains("READY=1"));
    let ready = before_ready.last().unwrap();
    assert!(ready.contains("STATUS=node e2e-node ready"), "{ready}");
    let statuses: Vec<&String> = before_ready
        .iter()
        .filter(|m| m.starts_with("STATUS="))
        .collect();
    assert!(
        statuses.iter().any(|m| m.contains("STATUS=starting")),
        "{before_ready:?}"
    );
    assert!(
        statuses
            .iter()
            .any(|m| m.contains("admitting the static pods")),
        "{before_ready:?}"
    );

    // Healthy: the watchdog is fed every 0.3 s.
    let start = Instant::now();
    let mut watchdogs = 0;
    while start.elapsed() < Duration::from_secs(2) {
        let mut buf = [0u8; 512];
        if let Ok(n) = sock.recv(&mut buf)
            && String::from_utf8_lossy(&buf[..n]).contains("WATCHDOG=1")
        {
            watchdogs += 1;
        }
    }
    assert!((4..=9).contains(&watchdogs), "{watchdogs} in 2 s");

    // SIGTERM: STOPPING=1 (pods keep running), then the agent exits cleanly.
    let pid = nix::unistd::Pid::from_raw(agent.0.id() as i32);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).unwrap();
    let stopping = receive_until(&sock, 20, |m| m.contains("STOPPING=1"));
    let last = stopping.last().unwrap();
    assert!(
        last.contains("STATUS=stopping; pods keep running"),
        "{last}"
    );
    let deadline = Instant::now() + Duration::from_secs(20);
    let status = loop {
        if let Some(s) = agent.0.try_wait().unwrap() {
            break s;
        }
        assert!(Instant::now() < deadline, "the agent did not exit");
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(status.success(), "{status:?}");
}
