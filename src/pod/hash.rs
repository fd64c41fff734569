//! The container spec hash stored in `io.kubernetes.container.hash`.
//!
//! Like upstream's `HashContainer`, the hash covers the container's JSON serialisation, so any
//! change of the spec (image, command, env, ...) changes it and [`super::actions`] restarts the
//! container. It is FNV-1a (64 bit) over the JSON bytes, rendered as 16 hex digits: stable across
//! processes and versions of nodelet as long as the serialisation of the fields set is.

use k8s_openapi::api::core::v1::Container;

/// The stable hash of `container`'s spec, as lowercase hex.
pub fn container_hash(container: &Container) -> String {
    // Serialising a k8s-openapi object cannot fail (no maps with non-string keys); fall back to
    // the Debug form rather than panicking should it ever.
    let bytes =
        serde_json::to_vec(container).unwrap_or_else(|_| format!("{container:?}").into_bytes());
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in bytes {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    format!("{h:016x}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stable_and_sensitive() {
        let a = Container {
            name: "app".into(),
            image: Some("busybox".into()),
            ..Default::default()
        };
        let mut b = a.clone();
        assert_eq!(container_hash(&a), container_hash(&b));
        assert_eq!(container_hash(&a).len(), 16);
        b.image = Some("busybox:1.36".into());
        assert_ne!(container_hash(&a), container_hash(&b));
    }
}
