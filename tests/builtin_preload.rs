//! The built-in runtime's image preload dir: archives (plain and zstd) imported and pinned, a
//! broken file refused naming it while the others are imported, a `*.txt` list pulled from
//! Debian's docker-registry on 127.0.0.1, nothing imported again when unchanged (also after a
//! restart), a file still being written left for the next scan, a fixed file imported once
//! it changes, images unpinned once their files are gone; and through the agent, a static pod
//! running an image that reached the node only through the preload dir.

mod common;

use std::path::Path;
use std::time::{Duration, SystemTime};

use common::containerd::registry;
use common::standalone::Standalone;
use common::*;
use runtime::builtin::BuiltinRuntime;
use runtime::{ImageService, RuntimeService, cri};

/// Writes `data` to `path`, dated 10 s ago (settled: a scan imports it at once).
fn write_settled(path: &Path, data: &[u8]) {
    std::fs::write(path, data).unwrap();
    let f = std::fs::File::options().write(true).open(path).unwrap();
    f.set_modified(SystemTime::now() - Duration::from_secs(10))
        .unwrap();
}

async fn pinned(rt: &BuiltinRuntime, reference: &str) -> Option<bool> {
    let st = rt
        .image_status(cri::ImageStatusRequest {
            image: Some(cri::ImageSpec {
                image: reference.into(),
                ..Default::default()
            }),
            verbose: false,
        })
        .await
        .unwrap();
    st.image.map(|i| i.pinned)
}

fn names(list: &[String]) -> Vec<&str> {
    list.iter().map(String::as_str).collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn the_preload_dir_imports_pins_and_unpins() {
    if !root_or_skip("the_preload_dir_imports_pins_and_unpins") {
        return;
    }
    let Some(reg) = registry::start_registry() else {
        return;
    };
    let client = registry::push_client(&reg.host);
    registry::push_archive(
        &client,
        &busybox_archive(),
        &reg.host,
        "library/listed",
        "1.0",
    )
    .await;
    let listed = format!("{}/library/listed:1.0", reg.host);
    let busybox = "docker.io/library/busybox:latest";

    let root = tempfile::Builder::new().prefix("nl").tempdir().unwrap();
    let cgroup_root = format!("/nodelet-e2e-preload-{}", std::process::id());
    let mut cfg = config(root.path(), &cgroup_root);
    cfg.registry.insecure = vec![reg.host.clone()];
    let rt = BuiltinRuntime::new(cfg).await.unwrap();
    let dir = root.path().join("images-preload");
    std::fs::create_dir_all(&dir).unwrap();
    let archive = std::fs::read(busybox_archive()).unwrap();
    write_settled(&dir.join("busybox.tar"), &archive);
    let zst = zstd::stream::encode_all(&archive[..], 3).unwrap();
    write_settled(&dir.join("busybox-again.tar.zst"), &zst);
    write_settled(&dir.join("broken.tar"), b"not an image archive");
    write_settled(
        &dir.join("images.txt"),
        format!("# pulled when the registry answers\n{listed}\n").as_bytes(),
    );

    let mut preload = rt.preload(&dir);
    let scan = preload.scan().await;
    let imported: Vec<&str> = scan.imported.iter().map(|(f, _)| f.as_str()).collect();
    assert_eq!(
        imported,
        ["busybox-again.tar.zst", "busybox.tar", "images.txt"],
        "{scan:?}"
    );
    assert!(
        scan.imported[1].1.contains(&busybox.to_string()),
        "{scan:?}"
    );
    assert_eq!(names(&scan.imported[2].1), [listed.as_str()]);
    assert_eq!(scan.failed.len(), 1, "{scan:?}");
    assert_eq!(scan.failed[0].0, "broken.tar");
    assert!(scan.failed[0].1.contains("broken.tar"), "{scan:?}");
    assert_eq!(pinned(&rt, busybox).await, Some(true));
    assert_eq!(pinned(&rt, &listed).await, Some(true));

    // Nothing changed: nothing imported again, the broken file not tried again.
    let scan = preload.scan().await;
    assert!(scan.imported.is_empty(), "{scan:?}");
    assert_eq!(
        names(&scan.unchanged),
        ["busybox-again.tar.zst", "busybox.tar", "images.txt"]
    );
    assert_eq!(scan.failed.len(), 1);
    // After a restart too (the record is in the root dir).
    drop(preload);
    let mut preload = rt.preload(&dir);
    let scan = preload.scan().await;
    assert!(scan.imported.is_empty(), "{scan:?}");
    assert_eq!(scan.unchanged.len(), 3, "{scan:?}");

    // A file still being written waits for the next scan; a fixed file is imported.
    std::fs::write(dir.join("fresh.tar"), &archive).unwrap();
    write_settled(&dir.join("broken.tar"), &archive);
    let scan = preload.scan().await;
    assert_eq!(names(&scan.settling), ["fresh.tar"]);
    let imported: Vec<&str> = scan.imported.iter().map(|(f, _)| f.as_str()).collect();
    assert_eq!(imported, ["broken.tar"]);
    assert!(scan.failed.is_empty(), "{scan:?}");
    std::fs::remove_file(dir.join("fresh.tar")).unwrap();

    // The archives gone: the image stays pinned while a file still brings it (the list's
    // image is the same busybox, pushed under another name), and is unpinned with the last.
    std::fs::remove_file(dir.join("busybox.tar")).unwrap();
    std::fs::remove_file(dir.join("busybox-again.tar.zst")).unwrap();
    let scan = preload.scan().await;
    assert_eq!(
        names(&scan.removed),
        ["busybox-again.tar.zst", "busybox.tar"]
    );
    assert_eq!(
        pinned(&rt, busybox).await,
        Some(true),
        "broken.tar brings it"
    );
    std::fs::remove_file(dir.join("broken.tar")).unwrap();
    let scan = preload.scan().await;
    assert_eq!(names(&scan.removed), ["broken.tar"]);
    assert_eq!(
        pinned(&rt, &listed).await,
        Some(true),
        "images.txt brings it"
    );
    std::fs::remove_file(dir.join("images.txt")).unwrap();
    let scan = preload.scan().await;
    assert_eq!(names(&scan.removed), ["images.txt"]);
    assert_eq!(pinned(&rt, busybox).await, Some(false));
    remove_cgroup_root(&cgroup_root);
}

/// The agent imports `<root-dir>/images-preload` at start, before any pod syncs: a static pod
/// whose image is only there (pull policy Never) runs at its first sync, never waiting in
/// ErrImageNeverPull.
#[tokio::test(flavor = "multi_thread")]
async fn a_static_pod_runs_an_image_from_the_preload_dir() {
    if !root_or_skip("a_static_pod_runs_an_image_from_the_preload_dir") {
        return;
    }
    let node = Standalone::new("");
    let dir = node.root.join("images-preload");
    std::fs::create_dir_all(&dir).unwrap();
    write_settled(
        &dir.join("grpc-health.tar"),
        &std::fs::read(grpc_health_archive()).unwrap(),
    );
    std::fs::write(
        node.manifests.join("preloaded.yaml"),
        format!(
            "apiVersion: v1\nkind: Pod\nmetadata:\n  name: preloaded\nspec:\n  \
             terminationGracePeriodSeconds: 1\n  containers:\n  - name: main\n    image: {GRPC_HEALTH}\n    \
             imagePullPolicy: Never\n    command: [\"sh\", \"-c\", \"test -x /bin/grpc-health-server && sleep 3600\"]\n"
        ),
    )
    .unwrap();
    let log_path = node.root.with_file_name("agent.log");
    let log = std::fs::File::create(&log_path).unwrap();
    let _agent = KillOnDrop(
        node.command(&[])
            .env("NODELET_LOG", "info")
            .stderr(log)
            .spawn()
            .unwrap(),
    );
    let mut running = false;
    for _ in 0..300 {
        let rt = node.runtime().await;
        let list = rt
            .list_containers(cri::ListContainersRequest { filter: None })
            .await
            .unwrap();
        if list
            .containers
            .iter()
            .any(|c| c.state == cri::ContainerState::ContainerRunning as i32)
        {
            running = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(running, "the preloaded image's pod never ran");
    let rt = node.runtime().await;
    assert_eq!(pinned(&rt, GRPC_HEALTH).await, Some(true));
    let log = std::fs::read_to_string(&log_path).unwrap();
    assert!(
        log.contains("image preload: imported"),
        "no import logged:\n{log}"
    );
    // A log file gets plain lines, no terminal colours.
    assert!(!log.contains('\x1b'), "colour codes in a log file:\n{log}");
    assert!(
        !log.contains("ErrImageNeverPull"),
        "the pod synced before its image was imported:\n{log}"
    );
}
