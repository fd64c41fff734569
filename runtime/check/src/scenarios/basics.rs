//! The runtime's identity and readiness, its images, and pod sandboxes' status and listing.

use runtime::cri;

use crate::ctx::{Ctx, now_ns};
use crate::outcome::{OrFail, Step, ensure, ensure_eq};

pub async fn runtime_version_and_status(c: &Ctx<'_>) -> Step {
    let req = cri::VersionRequest::default();
    let v = c
        .call("Version", Default::default(), c.rt().version(req))
        .await?
        .or_fail("Version")?;
    ensure_eq!(
        v.runtime_api_version.as_str(),
        "v1",
        "Version's runtime_api_version"
    );
    ensure!(
        !v.runtime_name.is_empty() && !v.runtime_version.is_empty(),
        "Version names no runtime or version: {v:?}"
    );
    let st = c
        .call(
            "Status",
            Default::default(),
            c.rt().status(Default::default()),
        )
        .await?
        .or_fail("Status")?
        .status
        .or_fail("Status.status")?;
    for t in ["RuntimeReady", "NetworkReady"] {
        let cond = st.conditions.iter().find(|cond| cond.r#type == t);
        let cond = cond.or_fail(format_args!("Status's {t} condition"))?;
        if t == "RuntimeReady" {
            ensure!(cond.status, "the runtime is not ready: {cond:?}");
        }
        if !cond.status {
            ensure!(
                !cond.reason.is_empty(),
                "a false {t} condition without a reason: {cond:?}"
            );
        }
    }
    Ok(())
}

pub async fn image_status_and_list(c: &Ctx<'_>) -> Step {
    let want = &c.env.image;
    let images = c
        .call(
            "ListImages",
            Default::default(),
            c.images().list_images(Default::default()),
        )
        .await?
        .or_fail("ListImages")?
        .images;
    let listed = images.iter().find(|i| i.id == want.id);
    let listed = listed.or_fail(format_args!("ListImages: the test image {}", want.id))?;
    if let Some(tag) = &want.repo_tag {
        ensure!(
            listed.repo_tags.contains(tag),
            "ListImages: {tag} not among the image's tags: {listed:?}"
        );
    }
    // By the reference containers use, the runtime's tag (and its short docker.io forms), and
    // the id.
    let mut names = vec![want.reference.clone(), want.id.clone()];
    if let Some(tag) = &want.repo_tag {
        names.push(tag.clone());
        if let Some(short) = tag.strip_prefix("docker.io/library/") {
            names.push(short.to_string());
            if let Some(bare) = short.strip_suffix(":latest") {
                names.push(bare.to_string());
            }
        }
    }
    for name in &names {
        let img = c.image_status(name).await?;
        let img = img.or_fail(format_args!(
            "ImageStatus {name:?} found nothing; the image"
        ))?;
        ensure_eq!(img.id, want.id, "ImageStatus {name:?}'s id");
        ensure!(img.id.starts_with("sha256:"), "an image id: {img:?}");
        ensure!(img.size > 0, "ImageStatus {name:?}: no size: {img:?}");
        if let Some(tag) = &want.repo_tag {
            ensure!(img.repo_tags.contains(tag), "ImageStatus {name:?}: {img:?}");
        }
    }
    let none = c.image_status("cri-check.invalid/nothere:none").await?;
    ensure!(
        none.is_none(),
        "ImageStatus of an image nobody has: {none:?}"
    );
    Ok(())
}

pub async fn pod_sandbox_status_and_list(c: &Ctx<'_>) -> Step {
    let before = now_ns();
    let (a, cfg_a) = c.pod("alpha").await?;
    let st = c.pod_status(&a).await?;
    ensure_eq!(st.id, a, "PodSandboxStatus's id");
    ensure_eq!(
        st.state,
        cri::PodSandboxState::SandboxReady as i32,
        "a new pod's state"
    );
    ensure_eq!(st.metadata, cfg_a.metadata, "PodSandboxStatus's metadata");
    ensure!(
        st.created_at >= before - 1_000_000_000 && st.created_at <= before + 60_000_000_000,
        "created_at {} is not the pod's creation ({before})",
        st.created_at
    );
    ensure_eq!(
        st.labels.get("app").map(String::as_str),
        Some("alpha"),
        "PodSandboxStatus's label app"
    );
    ensure_eq!(
        st.annotations.get("cri-check/pod").map(String::as_str),
        Some("alpha"),
        "PodSandboxStatus's annotation"
    );
    let (z, _) = c.pod("zulu").await?;
    c.stop_pod(&z).await?.or_fail("StopPodSandbox")?;
    let st = c.pod_status(&z).await?;
    ensure_eq!(
        st.state,
        cri::PodSandboxState::SandboxNotready as i32,
        "a stopped pod's state"
    );

    let mut both = vec![a.clone(), z.clone()];
    both.sort();
    ensure_eq!(c.pods(Default::default()).await?, both, "ListPodSandbox");
    let id = |id: &str| cri::PodSandboxFilter {
        id: id.into(),
        ..Default::default()
    };
    ensure_eq!(
        c.pods(id(&a)).await?,
        vec![a.clone()],
        "ListPodSandbox by id"
    );
    // A unique id prefix, as crictl sends it.
    ensure_eq!(
        c.pods(id(&z[..12.min(z.len())])).await?,
        vec![z.clone()],
        "ListPodSandbox by id prefix"
    );
    ensure_eq!(
        c.pods(id("0000000000ff")).await?,
        Vec::<String>::new(),
        "ListPodSandbox by an unknown id"
    );
    let state = |s: cri::PodSandboxState| cri::PodSandboxFilter {
        state: Some(cri::PodSandboxStateValue { state: s as i32 }),
        ..Default::default()
    };
    ensure_eq!(
        c.pods(state(cri::PodSandboxState::SandboxReady)).await?,
        vec![a.clone()],
        "ListPodSandbox of ready pods"
    );
    ensure_eq!(
        c.pods(state(cri::PodSandboxState::SandboxNotready)).await?,
        vec![z.clone()],
        "ListPodSandbox of not-ready pods"
    );
    let labels = |pairs: &[(&str, &str)]| cri::PodSandboxFilter {
        label_selector: c.selector(pairs),
        ..Default::default()
    };
    ensure_eq!(
        c.pods(labels(&[("app", "zulu")])).await?,
        vec![z.clone()],
        "ListPodSandbox by label"
    );
    ensure_eq!(
        c.pods(labels(&[("app", "nope")])).await?,
        Vec::<String>::new(),
        "ListPodSandbox by a label nobody has"
    );
    let mut both_filters = labels(&[("app", "alpha")]);
    both_filters.state = state(cri::PodSandboxState::SandboxNotready).state;
    ensure_eq!(
        c.pods(both_filters).await?,
        Vec::<String>::new(),
        "ListPodSandbox by label and state"
    );
    Ok(())
}
