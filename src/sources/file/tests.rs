//! Unit tests for the static pod directory: scans of a temp dir as files are added, edited,
//! broken and deleted, fed through the merger; and the polling loop.

use std::fs;

use crate::sources::merge::Merger;
use crate::sources::pod_uid;

use super::*;

fn manifest(name: &str, image: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\nspec:\n  containers:\n  - name: c\n    image: {image}\n"
    )
}

fn names(pods: &[Pod]) -> Vec<String> {
    pods.iter()
        .map(|p| p.metadata.name.clone().unwrap_or_default())
        .collect()
}

fn changes(m: &mut Merger, r: &ScanResult) -> Vec<(PodOp, Vec<String>)> {
    m.merge(PodUpdate {
        op: PodOp::Set,
        pods: r.pods.clone(),
        source: FILE_SOURCE,
    })
    .into_iter()
    .map(|u| (u.op, names(&u.pods)))
    .collect()
}

fn v(s: &[&str]) -> Vec<String> {
    s.iter().map(|s| s.to_string()).collect()
}

#[test]
fn which_files_are_read() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    fs::write(d.join("a.yaml"), manifest("a", "i:1")).unwrap();
    fs::write(d.join("b.yml"), manifest("b", "i:1")).unwrap();
    let json = r#"{"apiVersion":"v1","kind":"Pod","metadata":{"name":"c"},"spec":{"containers":[{"name":"c","image":"i"}]}}"#;
    fs::write(d.join("c.json"), json).unwrap();
    fs::write(d.join(".hidden.yaml"), manifest("h", "i:1")).unwrap();
    fs::write(d.join("notes.txt"), "not a pod").unwrap();
    fs::write(d.join("a.yaml.swp"), "junk").unwrap();
    fs::write(d.join(".yaml"), "junk").unwrap();
    fs::create_dir(d.join("sub.yaml")).unwrap();
    fs::write(d.join("sub.yaml").join("s.yaml"), manifest("s", "i:1")).unwrap();

    let mut src = FileSource::new(d, "node-1", Duration::from_secs(20));
    let r = src.scan();
    assert!(r.listed);
    assert!(r.errors.is_empty(), "{:?}", r.errors);
    assert_eq!(names(&r.pods), v(&["a-node-1", "b-node-1", "c-node-1"]));
    let a = &r.pods[0];
    assert_eq!(
        a.spec.as_ref().unwrap().node_name.as_deref(),
        Some("node-1")
    );
    assert_eq!(
        a.metadata.annotations.as_ref().unwrap()[crate::sources::CONFIG_SOURCE_ANNOTATION],
        "file"
    );

    // A single file as the path.
    let mut one = FileSource::new(d.join("b.yml"), "n", Duration::from_secs(1));
    assert_eq!(names(&one.scan().pods), v(&["b-n"]));

    // A missing directory: no pods, no error; an unreadable path is not "listed".
    let mut gone = FileSource::new(d.join("nope"), "n", Duration::from_secs(1));
    let r = gone.scan();
    assert!(r.listed && r.pods.is_empty() && r.errors.is_empty());
    let mut bad = FileSource::new(d.join("notes.txt").join("x"), "n", Duration::from_secs(1));
    let r = bad.scan();
    assert!(!r.listed && r.errors.len() == 1, "{r:?}");
}

#[test]
fn edits_through_the_merger() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let mut src = FileSource::new(d, "n", Duration::from_secs(20));
    let mut m = Merger::new();

    fs::write(d.join("a.yaml"), manifest("a", "i:1")).unwrap();
    fs::write(d.join("b.yaml"), manifest("b", "i:1")).unwrap();
    let r = src.scan();
    assert_eq!(changes(&mut m, &r), vec![(PodOp::Add, v(&["a-n", "b-n"]))]);
    let uid_a = pod_uid(&r.pods[0]).to_string();

    // Nothing changed: the same pods (same seen time), no changes.
    let r2 = src.scan();
    assert_eq!(r2.pods, r.pods);
    assert!(changes(&mut m, &r2).is_empty());

    // Rewriting a file with the same pod (only a comment added): same UID, nothing to do.
    fs::write(d.join("a.yaml"), manifest("a", "i:1") + "# touched\n").unwrap();
    let r = src.scan();
    assert_eq!(pod_uid(&r.pods[0]), uid_a);
    assert!(changes(&mut m, &r).is_empty());

    // Editing a pod's spec changes its hash, so its UID: the old pod goes, the new one comes
    // (as upstream, where the UID is the content hash).
    fs::write(d.join("a.yaml"), manifest("a", "i:2")).unwrap();
    fs::write(d.join("c.yaml"), manifest("c", "i:1")).unwrap();
    let r = src.scan();
    assert_ne!(pod_uid(&r.pods[0]), uid_a);
    assert_eq!(
        changes(&mut m, &r),
        vec![
            (PodOp::Remove, v(&["a-n"])),
            (PodOp::Add, v(&["a-n", "c-n"]))
        ]
    );

    // A manifest with a fixed UID is updated in place.
    let fixed = manifest("f", "i:1").replace("name: f\n", "name: f\n  uid: fixed-uid\n");
    fs::write(d.join("f.yaml"), &fixed).unwrap();
    assert_eq!(
        changes(&mut m, &src.scan()),
        vec![(PodOp::Add, v(&["f-n"]))]
    );
    fs::write(d.join("f.yaml"), fixed.replace("i:1", "i:9")).unwrap();
    assert_eq!(
        changes(&mut m, &src.scan()),
        vec![(PodOp::Update, v(&["f-n"]))]
    );

    // A file becoming broken: reported, its pod removed, the others untouched.
    fs::write(
        d.join("b.yaml"),
        "apiVersion: v1\nkind: Pod\nmetadata: {name: b}\nspec: {containers: []}\n",
    )
    .unwrap();
    let r = src.scan();
    assert_eq!(r.errors.len(), 1);
    let want = format!("file {}: spec.containers", d.join("b.yaml").display());
    assert!(r.errors[0].starts_with(&want), "{:?}", r.errors);
    assert_eq!(changes(&mut m, &r), vec![(PodOp::Remove, v(&["b-n"]))]);

    // Fixed again: back.
    fs::write(d.join("b.yaml"), manifest("b", "i:1")).unwrap();
    let r = src.scan();
    assert!(r.errors.is_empty());
    assert_eq!(changes(&mut m, &r), vec![(PodOp::Add, v(&["b-n"]))]);

    // Deleted.
    fs::remove_file(d.join("c.yaml")).unwrap();
    assert_eq!(
        changes(&mut m, &src.scan()),
        vec![(PodOp::Remove, v(&["c-n"]))]
    );
    assert_eq!(names(&m.pods()).len(), 3);
}

#[test]
fn broken_manifests_beside_good_ones() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    fs::write(d.join("good.yaml"), manifest("good", "i:1")).unwrap();
    let broken = [
        (
            "1-syntax.yaml",
            "apiVersion: v1\nkind: Pod\nmetadata: {name: [\n",
            "not YAML/JSON",
        ),
        (
            "2-kind.yaml",
            "apiVersion: v1\nkind: Deployment\n",
            "kind is \"Deployment\"",
        ),
        (
            "3-name.yaml",
            &manifest("Bad_Name", "i:1"),
            "metadata.name \"Bad_Name\"",
        ),
        (
            "4-image.yaml",
            &manifest("noimage", "''"),
            "spec.containers: container \"c\" has no image",
        ),
        (
            "z-dup.yaml",
            &manifest("good", "i:2"),
            "duplicate pod default/good-n",
        ),
    ];
    for (file, text, _) in &broken {
        fs::write(d.join(file), text).unwrap();
    }
    let mut src = FileSource::new(d, "n", Duration::from_secs(20));
    let r = src.scan();
    assert_eq!(names(&r.pods), v(&["good-n"]));
    assert_eq!(r.errors.len(), broken.len(), "{:?}", r.errors);
    for ((file, _, want), got) in broken.iter().zip(&r.errors) {
        let prefix = format!("file {}: {want}", d.join(file).display());
        assert!(got.starts_with(&prefix), "got {got:?}, want {prefix:?}");
    }
}

#[tokio::test]
async fn run_polls_and_sends_snapshots() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().to_path_buf();
    fs::write(d.join("a.yaml"), manifest("a", "i:1")).unwrap();
    let (tx, mut rx) = tokio::sync::mpsc::channel(8);
    let src = FileSource::new(&d, "n", Duration::from_millis(50));
    let task = tokio::spawn(src.run(tx));
    let recv = async |rx: &mut tokio::sync::mpsc::Receiver<PodUpdate>| {
        tokio::time::timeout(Duration::from_secs(10), rx.recv())
            .await
            .expect("an update in time")
            .expect("the source is running")
    };
    let first = recv(&mut rx).await;
    assert_eq!((first.op, first.source), (PodOp::Set, FILE_SOURCE));
    assert_eq!(names(&first.pods), v(&["a-n"]));

    // Unchanged: nothing more is sent; a new file: a new snapshot.
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(rx.try_recv().is_err());
    fs::write(d.join("b.yaml"), manifest("b", "i:1")).unwrap();
    let next = recv(&mut rx).await;
    assert_eq!(names(&next.pods), v(&["a-n", "b-n"]));

    // Two removals may be seen by one scan or by two.
    fs::remove_file(d.join("a.yaml")).unwrap();
    fs::remove_file(d.join("b.yaml")).unwrap();
    while !recv(&mut rx).await.pods.is_empty() {}

    // The loop ends when the receiver goes.
    drop(rx);
    tokio::time::timeout(Duration::from_secs(10), task)
        .await
        .expect("run returns")
        .unwrap();
}

#[tokio::test]
async fn inotify_reports_changes_long_before_the_next_poll() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().to_path_buf();
    let (tx, mut rx) = tokio::sync::mpsc::channel(8);
    let (problems_tx, mut problems) = tokio::sync::mpsc::unbounded_channel();
    // Polling once an hour: only inotify can bring the changes within the test.
    let src = FileSource::new(&d, "n", Duration::from_secs(3600)).report_to(problems_tx);
    let _task = tokio::spawn(src.run(tx));
    let recv = async |rx: &mut tokio::sync::mpsc::Receiver<PodUpdate>| {
        tokio::time::timeout(Duration::from_secs(10), rx.recv())
            .await
            .expect("an update before the next poll")
            .expect("the source is running")
    };
    assert!(recv(&mut rx).await.pods.is_empty());
    fs::write(d.join("a.yaml"), manifest("a", "i:1")).unwrap();
    assert_eq!(names(&recv(&mut rx).await.pods), v(&["a-n"]));
    fs::write(d.join("a.yaml"), manifest("a", "i:2")).unwrap();
    let edited = recv(&mut rx).await;
    assert_eq!(
        edited.pods[0].spec.as_ref().unwrap().containers[0]
            .image
            .as_deref(),
        Some("i:2")
    );
    // A broken manifest is reported on the problems channel; the good pod stays.
    fs::write(d.join("b.yaml"), "kind: Pod\nmetadata: {name: [x\n").unwrap();
    loop {
        let problem = tokio::time::timeout(Duration::from_secs(10), problems.recv())
            .await
            .expect("a problem report about b.yaml")
            .unwrap();
        if problem.contains("b.yaml") {
            break;
        }
    }
    fs::remove_file(d.join("a.yaml")).unwrap();
    assert!(recv(&mut rx).await.pods.is_empty());
}

#[test]
fn a_file_being_written_keeps_its_pod() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().to_path_buf();
    let mut src = FileSource::new(&d, "n", Duration::from_secs(1));
    fs::write(d.join("a.yaml"), manifest("a", "i:1")).unwrap();
    let before = src.scan();
    assert_eq!(names(&before.pods), v(&["a-n"]));
    // Truncated for a rewrite: the pod stays, nothing is reported.
    fs::write(d.join("a.yaml"), "").unwrap();
    let during = src.scan();
    assert_eq!(during.pods, before.pods);
    assert!(during.errors.is_empty(), "{:?}", during.errors);
    // An empty file never seen with content gives no pod and no error.
    fs::write(d.join("new.yaml"), "").unwrap();
    let r = src.scan();
    assert_eq!(names(&r.pods), v(&["a-n"]));
    assert!(r.errors.is_empty());
}
