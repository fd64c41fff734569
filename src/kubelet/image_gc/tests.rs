//! The collector over the fake runtime (the same CRI calls a remote runtime gets), the image
//! filesystem's space given by each test.

use std::sync::atomic::{AtomicU64, Ordering};

use runtime::fake::{FAKE_IMAGE_SIZE, FakeRuntime};

use super::*;

/// The image filesystem's capacity: a hundred images, so a percent is one image.
const CAP: u64 = 100 * FAKE_IMAGE_SIZE;

struct Env {
    fake: Arc<FakeRuntime>,
    dir: tempfile::TempDir,
    /// Available bytes of the image filesystem.
    available: Arc<AtomicU64>,
}

impl Env {
    fn new(images: &[&str]) -> Env {
        let fake = Arc::new(FakeRuntime::new());
        fake.set_fake_images(images);
        Env {
            fake,
            dir: tempfile::tempdir().unwrap(),
            available: Arc::new(AtomicU64::new(CAP)),
        }
    }

    fn gc(&self, policy: ImageGcConfig) -> ImageGc {
        let available = self.available.clone();
        ImageGc::new(
            self.fake.clone(),
            self.fake.clone(),
            policy,
            self.dir.path().join("image-gc.json"),
        )
        .with_space(move |_| Ok((CAP, available.load(Ordering::SeqCst))))
    }

    /// Makes a container of image `image` (in a sandbox of its own): the image is in use.
    async fn container_of(&self, image: &str) -> String {
        let sandbox = self
            .fake
            .run_pod_sandbox(cri::RunPodSandboxRequest {
                config: Some(cri::PodSandboxConfig {
                    metadata: Some(cri::PodSandboxMetadata {
                        name: format!("p-{image}"),
                        uid: format!("u-{image}"),
                        namespace: "default".into(),
                        attempt: 0,
                    }),
                    ..Default::default()
                }),
                runtime_handler: String::new(),
            })
            .await
            .unwrap()
            .pod_sandbox_id;
        self.fake
            .create_container(cri::CreateContainerRequest {
                pod_sandbox_id: sandbox,
                config: Some(cri::ContainerConfig {
                    metadata: Some(cri::ContainerMetadata {
                        name: "c".into(),
                        attempt: 0,
                    }),
                    image: Some(cri::ImageSpec {
                        image: image.into(),
                        ..Default::default()
                    }),
                    ..Default::default()
                }),
                sandbox_config: None,
            })
            .await
            .unwrap()
            .container_id
    }

    async fn remove_container(&self, id: &str) {
        self.fake
            .remove_container(cri::RemoveContainerRequest {
                container_id: id.to_string(),
            })
            .await
            .unwrap();
    }

    fn names(&self) -> Vec<String> {
        let mut names: Vec<String> = self
            .fake
            .images()
            .iter()
            .map(|i| {
                i.repo_tags[0]
                    .trim_start_matches("docker.io/library/")
                    .to_string()
            })
            .collect();
        names.sort();
        names
    }

    fn id(&self, name: &str) -> String {
        self.fake
            .images()
            .iter()
            .find(|i| i.repo_tags[0] == name || i.repo_tags[0].ends_with(&format!("/{name}")))
            .map(|i| i.id.clone())
            .unwrap()
    }
}

fn policy(high: u8, low: u8) -> ImageGcConfig {
    ImageGcConfig {
        high_threshold_percent: high,
        low_threshold_percent: low,
        minimum_age: Duration::ZERO,
        maximum_age: None,
    }
}

fn at(secs: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_secs(1_700_000_000 + secs)
}

/// Sets the filesystem so that reaching `low`% wants `images` images' size freed (and usage
/// is at least `low` + 1%).
fn over_by(env: &Env, low: u64, images: f64) {
    let target = CAP * (100 - low) / 100;
    let want = (FAKE_IMAGE_SIZE as f64 * images) as u64;
    env.available.store(target - want, Ordering::SeqCst);
}

/// The fake's image id for a reference (its digest of the normalised name).
fn id_of(name: &str) -> String {
    let fake = FakeRuntime::new();
    fake.set_fake_images(&[name]);
    fake.images()[0].id.clone()
}

#[tokio::test]
async fn least_recently_used_go_first_never_in_use_or_pinned_ones() {
    let env = Env::new(&["a:1", "b:1", "c:1", "d:1", "e:1"]);
    env.fake.set_image_pinned("d:1", true);
    let gc = env.gc(policy(51, 50));
    // b used at 10, then e at 20 (its container kept: still in use); a and c never used.
    let b = env.container_of("b:1").await;
    let _e = env.container_of("e:1").await;
    gc.collect(at(10)).await.unwrap();
    env.remove_container(&b).await;
    // Under the high threshold: nothing goes.
    let report = gc.collect(at(20)).await.unwrap();
    assert_eq!(report, Report::default());
    assert_eq!(env.names(), ["a:1", "b:1", "c:1", "d:1", "e:1"]);

    // Over it, wanting two and a half images: the never used a and c, then b; never d
    // (pinned) or e (in use).
    over_by(&env, 50, 2.5);
    let report = gc.collect(at(30)).await.unwrap();
    let (a, b, c) = (id_of("a:1"), id_of("b:1"), id_of("c:1"));
    assert_eq!(report.removed, [a, c, b]);
    assert_eq!(env.names(), ["d:1", "e:1"]);
    assert_eq!(report.freed, 3 * FAKE_IMAGE_SIZE);
}

#[tokio::test]
async fn the_order_follows_last_use_and_outlives_a_restart() {
    let env = Env::new(&["a:1", "b:1", "c:1"]);
    let (a, b) = (env.id("a:1"), env.id("b:1"));
    {
        let gc = env.gc(policy(51, 50));
        // a in use at 10, c at 20; b never.
        let ca = env.container_of("a:1").await;
        gc.collect(at(10)).await.unwrap();
        env.remove_container(&ca).await;
        let cc = env.container_of("c:1").await;
        gc.collect(at(20)).await.unwrap();
        env.remove_container(&cc).await;
    }
    // A new collector (the kubelet restarted) reads the records back.
    let gc = env.gc(policy(51, 50));
    over_by(&env, 50, 1.5);
    let report = gc.collect(at(30)).await.unwrap();
    assert_eq!(
        report.removed,
        [b.clone(), a.clone()],
        "never used, then least recently used"
    );
    assert_eq!(env.names(), ["c:1"]);
}

#[tokio::test]
async fn too_little_to_free_says_so_as_upstream() {
    let env = Env::new(&["a:1", "b:1"]);
    let _b = env.container_of("b:1").await;
    let gc = env.gc(policy(21, 20));
    over_by(&env, 20, 3.0);
    let err = gc.collect(at(0)).await.unwrap_err();
    assert_eq!(
        err.to_string(),
        format!(
            "Failed to garbage collect required amount of images. Attempted to free {} bytes, \
             but only found {} bytes eligible to free.",
            3 * FAKE_IMAGE_SIZE,
            FAKE_IMAGE_SIZE
        )
    );
    assert_eq!(env.names(), ["b:1"], "what could go went");
}

#[tokio::test]
async fn minimum_and_maximum_ages() {
    let env = Env::new(&["a:1", "b:1"]);
    let gc = env.gc(ImageGcConfig {
        minimum_age: Duration::from_secs(60),
        maximum_age: Some(Duration::from_secs(300)),
        ..policy(51, 50)
    });
    // Seen at 0; a in use at 100.
    gc.collect(at(0)).await.unwrap();
    let ca = env.container_of("a:1").await;
    gc.collect(at(100)).await.unwrap();
    env.remove_container(&ca).await;
    // Over the threshold at 30, both are too young.
    over_by(&env, 50, 2.0);
    let fresh = env.gc(ImageGcConfig {
        minimum_age: Duration::from_secs(60),
        ..policy(51, 50)
    });
    assert!(matches!(
        fresh.collect(at(30)).await,
        Err(Error::NotEnough { freed: 0, .. })
    ));
    env.available.store(CAP, Ordering::SeqCst);
    // Unused for more than 300 s: b (seen at 0) at 301, a (used at 100) only at 401.
    let report = gc.collect(at(301)).await.unwrap();
    assert_eq!(report.removed, [id_of("b:1")]);
    assert_eq!(env.names(), ["a:1"]);
    assert!(gc.collect(at(400)).await.unwrap().removed.is_empty());
    assert_eq!(gc.collect(at(401)).await.unwrap().removed.len(), 1);
    assert!(env.names().is_empty());
}

#[tokio::test]
async fn high_threshold_100_turns_collection_by_usage_off() {
    let env = Env::new(&["a:1"]);
    let gc = env.gc(policy(100, 0));
    env.available.store(0, Ordering::SeqCst);
    assert_eq!(gc.collect(at(0)).await.unwrap(), Report::default());
    assert_eq!(env.names(), ["a:1"]);
}

#[tokio::test]
async fn the_runtimes_sandbox_image_is_kept_though_not_pinned() {
    let env = Env::new(&["a:1", "pause:3.9"]);
    env.fake.set_status_info(
        [(
            "config".to_string(),
            r#"{"sandboxImage":"pause:3.9"}"#.to_string(),
        )]
        .into(),
    );
    let gc = env.gc(policy(51, 50));
    over_by(&env, 50, 2.0);
    let err = gc.collect(at(0)).await.unwrap_err();
    assert!(matches!(err, Error::NotEnough { .. }), "{err}");
    assert_eq!(env.names(), ["pause:3.9"]);
}

#[test]
fn references_normalize_as_runtimes_list_them() {
    assert_eq!(normalize("pause:3.9"), "docker.io/library/pause:3.9");
    assert_eq!(normalize("me/app:1"), "docker.io/me/app:1");
    assert_eq!(
        normalize("registry.k8s.io/pause:3.9"),
        "registry.k8s.io/pause:3.9"
    );
    assert_eq!(normalize("localhost:5000/x:1"), "localhost:5000/x:1");
}
