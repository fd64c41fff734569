//! The container spec hash stored in `io.kubernetes.container.hash`.
//!
//! Like upstream's `HashContainer`, the hash covers the container's JSON serialisation, so any
//! change of the spec (image, command, env, ...) changes it and [`super::actions`] restarts the
//! container; its resources are left out, since a resize changes them in place (see
//! `kubelet::allocation`). It is FNV-1a (64 bit) over the JSON bytes, rendered as 16 hex
//! digits: stable across processes and versions of nodelet as long as the serialisation of the
//! fields set is. Containers made before resources were left out carry the hash with them
//! ([`hash_matches`] accepts it while their resources are the same), so an upgraded agent does
//! not restart them.

use k8s_openapi::api::core::v1::Container;

/// The stable hash of `container`'s spec but its resources, as lowercase hex.
pub fn container_hash(container: &Container) -> String {
    if container.resources.is_none() {
        return hash_with_resources(container);
    }
    let mut c = container.clone();
    c.resources = None;
    hash_with_resources(&c)
}

/// Whether a container made with the hash `stored` was made from `container`'s spec (its
/// resources aside).
pub fn hash_matches(stored: &str, container: &Container) -> bool {
    stored == container_hash(container) || stored == hash_with_resources(container)
}

/// The hash nodelet gave containers before resources were left out.
fn hash_with_resources(container: &Container) -> String {
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

    #[test]
    fn resources_are_left_out_and_the_old_hash_still_matches() {
        use k8s_openapi::api::core::v1::ResourceRequirements;
        use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
        let plain = Container {
            name: "app".into(),
            image: Some("busybox".into()),
            ..Default::default()
        };
        let mut sized = plain.clone();
        sized.resources = Some(ResourceRequirements {
            limits: Some([("cpu".to_string(), Quantity("200m".into()))].into()),
            ..Default::default()
        });
        assert_eq!(container_hash(&plain), container_hash(&sized));
        // A container made by an older nodelet: its hash covered its resources.
        let old = hash_with_resources(&sized);
        assert_ne!(old, container_hash(&sized));
        assert!(hash_matches(&old, &sized));
        let mut resized = sized.clone();
        resized.resources = None;
        assert!(!hash_matches(&old, &resized));
        assert!(hash_matches(&container_hash(&resized), &sized));
    }
}
