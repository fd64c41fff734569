//! PullImage through the built-in runtime's `ImageService`, from Debian's docker-registry on
//! 127.0.0.1: plain pulls of an insecure registry, pulls through a mirror, the errors for a
//! missing tag and an unreachable registry, and a container run from the pulled image.

mod common;
#[path = "../images/tests/common/mod.rs"]
#[allow(dead_code)]
mod registry;

use common::*;
use runtime::builtin::BuiltinRuntime;
use runtime::{Code, ImageService, cri};

fn spec(image: &str) -> Option<cri::ImageSpec> {
    Some(cri::ImageSpec {
        image: image.into(),
        ..Default::default()
    })
}

#[tokio::test(flavor = "multi_thread")]
async fn pull_run_mirror_and_errors() {
    if !root_or_skip("pull_run_mirror_and_errors") {
        return;
    }
    let Some(reg) = registry::start_registry() else {
        return;
    };
    let client = registry::push_client(&reg.host);
    let config_digest = registry::push_archive(
        &client,
        &busybox_archive(),
        &reg.host,
        "library/busybox",
        "1.0",
    )
    .await;

    let root = tempfile::Builder::new().prefix("nl").tempdir().unwrap();
    let cgroup_root = format!("/nodelet-e2e-pull-{}", std::process::id());
    let mut cfg = config(root.path(), &cgroup_root);
    cfg.registry.insecure = vec![reg.host.clone()];
    let rt = BuiltinRuntime::new(cfg.clone()).await.unwrap();

    let reference = format!("{}/library/busybox:1.0", reg.host);
    let image_ref = rt
        .pull_image(cri::PullImageRequest {
            image: spec(&reference),
            auth: None,
            sandbox_config: None,
        })
        .await
        .expect("pull")
        .image_ref;
    assert_eq!(image_ref, config_digest, "PullImage returns the image id");
    let st = rt
        .image_status(cri::ImageStatusRequest {
            image: spec(&reference),
            verbose: false,
        })
        .await
        .unwrap();
    let img = st.image.expect("pulled image is present");
    assert!(img.repo_tags.contains(&reference));
    assert!(img.repo_digests.iter().any(|d| d.contains("@sha256:")));

    // The pulled image runs.
    let node = Node {
        rt,
        root,
        cgroup_root,
    };
    let sb = node.sandbox("pulled").await;
    let mut c = container_config("c", &["sh", "-c", "echo pulled-ok"]);
    c.image = spec(&reference);
    let id = node.container_with(&sb, c).await;
    let s = node.wait_exited(&id).await;
    assert_eq!(s.exit_code, 0);
    let recs = log_records(std::path::Path::new(&s.log_path));
    assert!(recs.iter().any(|r| r.2 == "pulled-ok"), "{recs:?}");

    // A missing tag is NotFound and changes nothing.
    let before = node
        .rt
        .list_images(cri::ListImagesRequest { filter: None })
        .await
        .unwrap()
        .images
        .len();
    let err = node
        .rt
        .pull_image(cri::PullImageRequest {
            image: spec(&format!("{}/library/busybox:nope", reg.host)),
            auth: None,
            sandbox_config: None,
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::NotFound, "{err}");
    let after = node
        .rt
        .list_images(cri::ListImagesRequest { filter: None })
        .await
        .unwrap()
        .images
        .len();
    assert_eq!(before, after);

    // An unreachable registry is Unavailable.
    let dead = format!("127.0.0.1:{}", registry::free_port());
    let mut cfg2 = config(node.root.path(), &node.cgroup_root);
    cfg2.registry.insecure = vec![dead.clone()];
    let rt2 = BuiltinRuntime::new(cfg2).await.unwrap();
    let err = rt2
        .pull_image(cri::PullImageRequest {
            image: spec(&format!("{dead}/x/y:1")),
            auth: None,
            sandbox_config: None,
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::Unavailable, "{err}");

    // A mirror for docker.io serves short names.
    let mirror_root = tempfile::Builder::new().prefix("nl").tempdir().unwrap();
    let mut cfg3 = config(mirror_root.path(), &node.cgroup_root);
    cfg3.registry.insecure = vec![reg.host.clone()];
    cfg3.registry
        .mirrors
        .insert("docker.io".into(), vec![reg.host.clone()]);
    let rt3 = BuiltinRuntime::new(cfg3).await.unwrap();
    let id3 = rt3
        .pull_image(cri::PullImageRequest {
            image: spec("busybox:1.0"),
            auth: None,
            sandbox_config: None,
        })
        .await
        .expect("pull through mirror")
        .image_ref;
    assert_eq!(id3, config_digest);
    let st = rt3
        .image_status(cri::ImageStatusRequest {
            image: spec("docker.io/library/busybox:1.0"),
            verbose: false,
        })
        .await
        .unwrap();
    assert!(st.image.is_some());
    node.teardown().await;
}
