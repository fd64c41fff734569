//! The static pod URL (`staticPodURL`): not implemented yet.
