//! Small helpers the whole kubelet crate uses, with no knowledge of pods, nodes or the API:
//! a poison-tolerant lock, Go's duration notation, `$(VAR)` expansion, resource quantities and
//! the mount table.
//! A leaf: it imports nothing from the rest of the crate.

mod duration;
mod expand;
mod mountinfo;
pub mod quantity;

pub use duration::go_duration;
pub use expand::{MissingVars, expand, expand_all};
pub use mountinfo::{mounts_under, unescape_octal};

use std::sync::{Mutex, MutexGuard};

/// Locks `m`, taking the data of a lock a panicking holder poisoned: every lock in the
/// kubelet guards data that stays consistent between statements, so a panic elsewhere must
/// not stop the node.
pub fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}
