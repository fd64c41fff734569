//! Tests of [`super::build_lease`].

use super::*;

fn at(secs: i64) -> Timestamp {
    Timestamp::from_second(1_800_000_000 + secs).unwrap()
}

fn node(uid: Option<&str>) -> Node {
    Node {
        metadata: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
            name: Some("node-a".into()),
            uid: uid.map(Into::into),
            ..Default::default()
        },
        ..Default::default()
    }
}

#[test]
fn new_lease_without_node() {
    let lease = build_lease(None, "node-a", 40, None, at(0));
    let got = serde_json::to_value(&lease).unwrap();
    assert_eq!(
        got,
        serde_json::json!({
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": "node-a", "namespace": "kube-node-lease"},
            "spec": {
                "holderIdentity": "node-a",
                "leaseDurationSeconds": 40,
                "renewTime": "2027-01-15T08:00:00.000000Z",
            },
        })
    );
}

#[test]
fn owner_reference_once_the_node_uid_is_known() {
    // A Node without a UID (not registered yet) gives no owner.
    let lease = build_lease(None, "node-a", 40, Some(&node(None)), at(0));
    assert_eq!(lease.metadata.owner_references, None);
    let lease = build_lease(Some(&lease), "node-a", 40, Some(&node(Some("u-1"))), at(10));
    let owners = lease.metadata.owner_references.clone().unwrap();
    assert_eq!(
        owners,
        [OwnerReference {
            api_version: "v1".into(),
            kind: "Node".into(),
            name: "node-a".into(),
            uid: "u-1".into(),
            ..Default::default()
        }]
    );
    // An existing owner is left alone (a re-created Node does not steal it).
    let again = build_lease(Some(&lease), "node-a", 40, Some(&node(Some("u-2"))), at(20));
    assert_eq!(again.metadata.owner_references.unwrap(), owners);
}

#[test]
fn renewal_keeps_the_base_and_moves_renew_time() {
    let mut base = build_lease(None, "node-a", 40, None, at(0));
    base.metadata.resource_version = Some("17".into());
    base.metadata.uid = Some("lease-uid".into());
    let spec = base.spec.as_mut().unwrap();
    spec.holder_identity = Some("someone-else".into());
    spec.lease_transitions = Some(3);
    let renewed = build_lease(Some(&base), "node-a", 20, None, at(10));
    assert_eq!(renewed.metadata.resource_version.as_deref(), Some("17"));
    assert_eq!(renewed.metadata.uid.as_deref(), Some("lease-uid"));
    let spec = renewed.spec.unwrap();
    assert_eq!(spec.holder_identity.as_deref(), Some("node-a"));
    assert_eq!(spec.lease_duration_seconds, Some(20));
    assert_eq!(spec.lease_transitions, Some(3));
    assert_eq!(spec.renew_time, Some(MicroTime(at(10))));
}

#[test]
fn renewed_every_quarter_duration() {
    assert_eq!(renew_interval(40), Duration::from_secs(10));
    assert_eq!(renew_interval(2), Duration::from_millis(500));
    assert_eq!(renew_interval(1), Duration::from_millis(250));
}
