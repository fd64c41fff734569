//! The CRI contract's idempotence: stopping and removing what is already stopped, removed or
//! was never there succeeds (critest's Idempotence specs; the kubelet retries these calls).

use runtime::cri;

use crate::ctx::Ctx;
use crate::outcome::{OrFail, Step, ensure};

/// Fails unless `r` is a success, naming the call and what it was given.
fn succeeds(what: &str, r: runtime::Result<()>) -> Step {
    match r {
        Ok(()) => Ok(()),
        Err(e) => Err(crate::outcome::Stop::Fail(format!(
            "{what}: must succeed, got {e}"
        ))),
    }
}

pub async fn idempotence_of_stopped_and_removed(c: &Ctx<'_>) -> Step {
    let pod = c.pod("again").await?;
    let id = c.run(&pod, "c", &["sleep", "600"]).await?;
    c.stop_container(&id, 0).await?.or_fail("StopContainer")?;
    succeeds(
        "StopContainer of a stopped container",
        c.stop_container(&id, 0).await?,
    )?;
    c.remove_container(&id).await?.or_fail("RemoveContainer")?;
    succeeds(
        "RemoveContainer of a removed container",
        c.remove_container(&id).await?,
    )?;
    succeeds(
        "StopContainer of a removed container",
        c.stop_container(&id, 0).await?,
    )?;
    c.stop_pod(&pod.0).await?.or_fail("StopPodSandbox")?;
    succeeds("StopPodSandbox of a stopped pod", c.stop_pod(&pod.0).await?)?;
    c.remove_pod(&pod.0).await?.or_fail("RemovePodSandbox")?;
    succeeds(
        "RemovePodSandbox of a removed pod",
        c.remove_pod(&pod.0).await?,
    )?;
    succeeds("StopPodSandbox of a removed pod", c.stop_pod(&pod.0).await?)?;
    let left = c.pods(Default::default()).await?;
    ensure!(
        left.is_empty(),
        "pods left after RemovePodSandbox: {left:?}"
    );
    Ok(())
}

pub async fn idempotence_of_unknown_ids(c: &Ctx<'_>) -> Step {
    let unknown = "6d9e2b4c-1f3a-4c8e-9b7d-5a0e3f2c1b9d";
    succeeds(
        "StopPodSandbox of an unknown id",
        c.stop_pod(unknown).await?,
    )?;
    succeeds(
        "StopContainer of an unknown id",
        c.stop_container(unknown, 0).await?,
    )?;
    succeeds(
        "RemovePodSandbox of an unknown id",
        c.remove_pod(unknown).await?,
    )?;
    succeeds(
        "RemoveContainer of an unknown id",
        c.remove_container(unknown).await?,
    )?;
    let fake_image = "0".repeat(64);
    for _ in 0..2 {
        let req = cri::RemoveImageRequest {
            image: Some(cri::ImageSpec {
                image: fake_image.clone(),
                ..Default::default()
            }),
        };
        let r = c
            .call(
                "RemoveImage",
                Default::default(),
                c.images().remove_image(req),
            )
            .await?;
        succeeds("RemoveImage of an unknown image", r.map(drop))?;
    }
    Ok(())
}
