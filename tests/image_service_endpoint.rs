//! `imageServiceEndpoint`: with a remote runtime, images come from the image service endpoint
//! when it is set and different, else from the runtime's own endpoint; with the built-in runtime
//! it is refused with a reason. Two fake CRI runtimes served on unix sockets tell which one
//! answered.

use std::sync::Arc;
use std::time::Duration;

use nodelet::commands::node::open_runtime;
use nodelet::config::KubeletConfig;
use runtime::cri;
use runtime::fake::FakeRuntime;

async fn serve(path: std::path::PathBuf, fake: Arc<FakeRuntime>) {
    let p = path.clone();
    tokio::spawn(async move {
        let _ = runtime::server::serve_unix(&p, fake.clone(), fake, std::future::pending()).await;
    });
    for _ in 0..200 {
        if std::os::unix::net::UnixStream::connect(&path).is_ok() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("{} never listened", path.display());
}

async fn image_names(rt: &nodelet::kubelet::Runtime) -> Vec<String> {
    rt.images
        .list_images(cri::ListImagesRequest { filter: None })
        .await
        .expect("ListImages")
        .images
        .into_iter()
        .flat_map(|i| i.repo_tags)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn images_come_from_the_image_service_endpoint() {
    let dir = tempfile::tempdir().expect("tempdir");
    let dirs = nodelet::commands::Dirs {
        root: dir.path().to_path_buf(),
        state: None,
    };
    let (runtime_sock, image_sock) = (dir.path().join("rt.sock"), dir.path().join("img.sock"));
    let rt_fake = Arc::new(FakeRuntime::new());
    rt_fake.set_fake_images(&["runtime.example/only-on-the-runtime:1"]);
    let img_fake = Arc::new(FakeRuntime::new());
    img_fake.set_fake_images(&["images.example/only-on-the-image-service:1"]);
    serve(runtime_sock.clone(), rt_fake.clone()).await;
    serve(image_sock.clone(), img_fake.clone()).await;

    let mut cfg = KubeletConfig {
        container_runtime_endpoint: format!("unix://{}", runtime_sock.display()),
        image_service_endpoint: format!("unix://{}", image_sock.display()),
        ..Default::default()
    };
    let rt = open_runtime(&cfg, &dirs).await.expect("open");
    assert_eq!(
        image_names(&rt).await,
        ["images.example/only-on-the-image-service:1"]
    );
    rt.runtime
        .list_pod_sandbox(cri::ListPodSandboxRequest { filter: None })
        .await
        .expect("ListPodSandbox");
    assert!(rt_fake.called().iter().any(|c| c == "ListPodSandbox"));
    assert!(!img_fake.called().iter().any(|c| c == "ListPodSandbox"));

    // Without an image endpoint (or the same one), images come from the runtime.
    cfg.image_service_endpoint = String::new();
    let rt = open_runtime(&cfg, &dirs).await.expect("open");
    assert_eq!(
        image_names(&rt).await,
        ["runtime.example/only-on-the-runtime:1"]
    );

    // The built-in runtime has its own image store.
    let builtin = KubeletConfig {
        image_service_endpoint: format!("unix://{}", image_sock.display()),
        ..Default::default()
    };
    let err = open_runtime(&builtin, &dirs)
        .await
        .err()
        .expect("an image endpoint without a runtime endpoint");
    assert!(
        err.to_string().contains("needs a containerRuntimeEndpoint"),
        "{err}"
    );
}
