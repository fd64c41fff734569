//! Watch streams: newline-delimited `{"type","object"}` events after a resourceVersion,
//! filtered by selectors, with bookmarks, streaming lists, 410 after compaction, timeouts.

use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::{Body, Bytes};
use serde_json::{Value, json};
use tokio::sync::mpsc;

use super::select::Selector;
use super::store::{ApiError, Change, ChangeKind, Resource, Store};

/// Where a watch starts.
#[derive(Debug, Clone, Copy)]
pub enum Start {
    /// `resourceVersion` unset or "0": the current objects as ADDED, then changes.
    Current,
    /// `sendInitialEvents=true`: the current objects as ADDED, a BOOKMARK marking their end,
    /// then changes.
    InitialEvents,
    /// Changes after this resourceVersion.
    After(u64),
}

pub struct Watch {
    pub res: &'static Resource,
    pub namespace: Option<String>,
    pub selector: Selector,
    pub start: Start,
    pub bookmarks: bool,
    pub timeout: Option<Duration>,
}

fn line(kind: &str, object: &Value) -> Bytes {
    let mut v = serde_json::to_vec(&json!({"type": kind, "object": object})).unwrap_or_default();
    v.push(b'\n');
    Bytes::from(v)
}

impl Watch {
    fn in_scope(&self, res: &Resource, obj: &Value) -> bool {
        let ns = obj
            .pointer("/metadata/namespace")
            .and_then(Value::as_str)
            .unwrap_or("");
        res == self.res && self.namespace.as_deref().is_none_or(|n| n == ns)
    }

    /// The event this watcher sees for a change, as kube-apiserver's watch cache decides it:
    /// an object that starts matching is ADDED, one that stops matching is DELETED (its
    /// previous state at the change's resourceVersion).
    fn event(&self, ch: &Change) -> Option<Bytes> {
        if !self.in_scope(ch.res, &ch.object) {
            return None;
        }
        let now = ch.kind != ChangeKind::Deleted && self.selector.matches(self.res, &ch.object);
        let before = ch
            .old
            .as_ref()
            .is_some_and(|o| self.selector.matches(self.res, o));
        match (before, now) {
            (false, true) => Some(line("ADDED", &ch.object)),
            (true, true) => Some(line("MODIFIED", &ch.object)),
            (true, false) => {
                let mut old = ch.old.clone().unwrap_or_default();
                old["metadata"]["resourceVersion"] = json!(ch.rv.to_string());
                Some(line("DELETED", &old))
            }
            (false, false) => None,
        }
    }

    fn bookmark(&self, rv: u64, initial_end: bool) -> Bytes {
        let mut obj = json!({"kind": self.res.kind, "apiVersion": self.res.api_version(),
            "metadata": {"resourceVersion": rv.to_string()}});
        if initial_end {
            obj["metadata"]["annotations"] = json!({"k8s.io/initial-events-end": "true"});
        }
        line("BOOKMARK", &obj)
    }

    /// Registers with the store and returns the response body. The first lines (initial
    /// state or replayed history) are taken under the store lock together with the
    /// registration, so no change is lost or doubled between them.
    pub fn serve(self, store: &Mutex<Store>, bookmark_every: Duration) -> Body {
        let (first, changes, last_rv) = {
            let mut s = store.lock().unwrap_or_else(|e| e.into_inner());
            let mut first = Vec::new();
            match self.start {
                Start::After(rv) if rv < s.floor => {
                    let e =
                        ApiError::expired(format!("too old resource version: {rv} ({})", s.floor));
                    first.push(line("ERROR", &e.status()));
                    return stream(first, None, self, bookmark_every, s.rv);
                }
                Start::After(rv) => {
                    first.extend(
                        s.history
                            .iter()
                            .filter(|c| c.rv > rv)
                            .filter_map(|c| self.event(c)),
                    );
                }
                Start::Current | Start::InitialEvents => {
                    for (_, obj) in s.select(self.res, self.namespace.as_deref(), &self.selector) {
                        first.push(line("ADDED", &obj));
                    }
                    if matches!(self.start, Start::InitialEvents) {
                        first.push(self.bookmark(s.rv, true));
                    }
                }
            }
            let (tx, rx) = mpsc::unbounded_channel();
            s.watchers.push(tx);
            // A watch from a resourceVersion not written yet starts there.
            let from = match self.start {
                Start::After(rv) => rv.max(s.rv),
                _ => s.rv,
            };
            (first, rx, from)
        };
        stream(first, Some(changes), self, bookmark_every, last_rv)
    }
}

fn stream(
    first: Vec<Bytes>,
    changes: Option<mpsc::UnboundedReceiver<Arc<Change>>>,
    watch: Watch,
    bookmark_every: Duration,
    mut last_rv: u64,
) -> Body {
    let (tx, rx) = mpsc::channel::<Bytes>(64);
    tokio::spawn(async move {
        for l in first {
            if tx.send(l).await.is_err() {
                return;
            }
        }
        let Some(mut changes) = changes else { return };
        let deadline = watch.timeout.map(|t| tokio::time::Instant::now() + t);
        let timeout = async {
            match deadline {
                Some(d) => tokio::time::sleep_until(d).await,
                None => std::future::pending().await,
            }
        };
        tokio::pin!(timeout);
        let mut tick = tokio::time::interval(bookmark_every);
        tick.reset();
        loop {
            let out = tokio::select! {
                ch = changes.recv() => match ch {
                    Some(ch) => {
                        if ch.rv <= last_rv {
                            continue;
                        }
                        last_rv = ch.rv;
                        match watch.event(&ch) { Some(l) => l, None => continue }
                    }
                    None => return,
                },
                _ = tick.tick(), if watch.bookmarks => watch.bookmark(last_rv, false),
                () = &mut timeout => return,
                () = tx.closed() => return,
            };
            if tx.send(out).await.is_err() {
                return;
            }
        }
    });
    let body = futures::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|b| (Ok::<_, Infallible>(b), rx))
    });
    Body::from_stream(body)
}
