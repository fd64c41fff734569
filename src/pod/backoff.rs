//! CrashLoopBackOff: the per-container restart delay.
//!
//! Same semantics as upstream's `flowcontrol.Backoff` as the kubelet uses it: a container key
//! (pod UID, container name and the hash of its spec, so a changed container starts afresh)
//! has no delay until its first restart; each restart
//! ([`Backoff::record_restart`]) sets the delay to the initial value (10 s) or doubles it, up to
//! the maximum (5 min). A container that has not been restarted for twice the maximum (10 min,
//! i.e. it ran that long) starts again from the initial delay, and such entries are dropped by
//! [`Backoff::gc`]. While `now - last_finished < delay` the container is in back-off and
//! [`Backoff::next_start`] says how long is left. Time is passed in (`SystemTime`) so tests use
//! a fake clock.

use std::collections::HashMap;
use std::time::{Duration, SystemTime};

/// Upstream's initial CrashLoopBackOff delay.
pub const INITIAL: Duration = Duration::from_secs(10);
/// Upstream's maximum CrashLoopBackOff delay.
pub const MAX: Duration = Duration::from_secs(300);

#[derive(Debug, Clone, Copy)]
struct Entry {
    delay: Duration,
    last_update: SystemTime,
}

/// The back-off state of every container key.
#[derive(Debug, Clone)]
pub struct Backoff {
    initial: Duration,
    max: Duration,
    entries: HashMap<String, Entry>,
}

impl Default for Backoff {
    fn default() -> Self {
        Self::new(INITIAL, MAX)
    }
}

/// The key of a container: pod UID, container name and spec hash (upstream's stable key).
pub fn key(pod_uid: &str, container: &str, hash: &str) -> String {
    format!("{pod_uid}/{container}/{hash}")
}

impl Backoff {
    /// A back-off starting at `initial` and doubling up to `max`.
    pub fn new(initial: Duration, max: Duration) -> Self {
        Backoff {
            initial,
            max: max.max(initial),
            entries: HashMap::new(),
        }
    }

    fn expired(&self, e: &Entry, now: SystemTime) -> bool {
        now.duration_since(e.last_update).unwrap_or_default() > self.max * 2
    }

    /// The current delay of `key`, if it has one that has not expired.
    pub fn delay(&self, key: &str, now: SystemTime) -> Option<Duration> {
        self.entries
            .get(key)
            .filter(|e| !self.expired(e, now))
            .map(|e| e.delay)
    }

    /// How long until the container `key`, which finished at `last_finished`, may start again;
    /// `None` when it may start now.
    pub fn next_start(
        &self,
        key: &str,
        last_finished: SystemTime,
        now: SystemTime,
    ) -> Option<Duration> {
        let delay = self.delay(key, now)?;
        let since = now.duration_since(last_finished).unwrap_or_default();
        (since < delay).then(|| delay - since)
    }

    /// How long is left of the delay `key` got at its last [`record_restart`](Self::record_restart)
    /// (a failed image pull: its back-off runs from the failure).
    pub fn remaining(&self, key: &str, now: SystemTime) -> Option<Duration> {
        let e = self.entries.get(key).filter(|e| !self.expired(e, now))?;
        let since = now.duration_since(e.last_update).unwrap_or_default();
        (since < e.delay).then(|| e.delay - since)
    }

    /// Records a restart of `key` at `now`: the first sets the initial delay, later ones double
    /// it up to the maximum; after an expiry the initial delay again.
    pub fn record_restart(&mut self, key: &str, now: SystemTime) {
        let delay = match self.entries.get(key) {
            Some(e) if !self.expired(e, now) => (e.delay * 2).min(self.max),
            _ => self.initial,
        };
        self.entries.insert(
            key.to_string(),
            Entry {
                delay,
                last_update: now,
            },
        );
    }

    /// Forgets `key` (the pod was deleted).
    pub fn reset(&mut self, key: &str) {
        self.entries.remove(key);
    }

    /// Forgets every key of the pod `pod_uid`.
    pub fn forget_pod(&mut self, pod_uid: &str) {
        let prefix = format!("{pod_uid}/");
        self.entries.retain(|k, _| !k.starts_with(&prefix));
    }

    /// Drops the entries not updated for twice the maximum delay.
    pub fn gc(&mut self, now: SystemTime) {
        let max2 = self.max * 2;
        self.entries
            .retain(|_, e| now.duration_since(e.last_update).unwrap_or_default() <= max2);
    }

    /// The number of keys with an entry.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether no key has an entry.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::UNIX_EPOCH;

    fn t(secs: u64) -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(1_000_000 + secs)
    }

    #[test]
    fn doubles_up_to_max() {
        let mut b = Backoff::default();
        let k = key("uid", "app", "h1");
        assert_eq!(
            b.next_start(&k, t(0), t(0)),
            None,
            "no delay before the first restart"
        );
        let mut delays = vec![];
        for i in 0..7 {
            b.record_restart(&k, t(i));
            delays.push(b.delay(&k, t(i)).map(|d| d.as_secs()));
        }
        let want = [10, 20, 40, 80, 160, 300, 300].map(Some);
        assert_eq!(delays, want);
    }

    #[test]
    fn next_start_table() {
        let mut b = Backoff::new(Duration::from_secs(10), Duration::from_secs(40));
        let k = key("uid", "app", "h1");
        b.record_restart(&k, t(0)); // delay 10s
        // (finished, now, want remaining)
        let cases = [
            (t(5), t(5), Some(10)),
            (t(5), t(9), Some(6)),
            (t(5), t(15), None),
            (t(5), t(30), None),
            // expired: more than 2*max since the last restart
            (t(81), t(81), None),
        ];
        for (finished, now, want) in cases {
            assert_eq!(
                b.next_start(&k, finished, now).map(|d| d.as_secs()),
                want,
                "finished {finished:?} now {now:?}"
            );
        }
        assert_eq!(b.next_start("other", t(5), t(5)), None);
    }

    #[test]
    fn resets_after_running_long_and_gc() {
        let mut b = Backoff::new(Duration::from_secs(10), Duration::from_secs(300));
        let k = key("uid", "app", "h1");
        b.record_restart(&k, t(0));
        b.record_restart(&k, t(10));
        assert_eq!(b.delay(&k, t(10)), Some(Duration::from_secs(20)));
        // Ran for more than 10 minutes: back to the initial delay.
        b.record_restart(&k, t(10 + 601));
        assert_eq!(b.delay(&k, t(611)), Some(Duration::from_secs(10)));
        b.gc(t(611 + 600));
        assert_eq!(b.len(), 1);
        b.gc(t(611 + 601));
        assert!(b.is_empty());
        b.record_restart(&k, t(0));
        b.reset(&k);
        assert!(b.is_empty());
    }
}
