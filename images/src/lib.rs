//! images crate (skeleton; filled in by issue #2).
