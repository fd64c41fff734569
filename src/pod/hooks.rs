//! Lifecycle hooks (upstream `pkg/kubelet/lifecycle/handlers.go`): `postStart` right after a
//! container started, `preStop` before its stop signal. A hook is an exec in the container
//! (through the runtime's ExecSync), an HTTP GET from the kubelet to the pod (any answer
//! passes; only a failure to get one fails the hook, as upstream) or a sleep.

use std::time::Duration;

use k8s_openapi::api::core::v1::{Container, LifecycleHandler, Pod};
use runtime::RuntimeService;

use crate::prober::http;

/// The pod as upstream's messages name it: `name_namespace(uid)`.
fn pod_desc(pod: &Pod) -> String {
    crate::model::PodRef::of(pod).desc()
}

/// Runs `handler` for the container `container_id` of `pod`; the error is the message of the
/// `FailedPostStartHook`/`FailedPreStopHook` event.
pub async fn run(
    rt: &dyn RuntimeService,
    pod: &Pod,
    container: &Container,
    container_id: &str,
    handler: &LifecycleHandler,
    pod_ip: &str,
) -> Result<(), String> {
    let name = &container.name;
    if let Some(e) = &handler.exec {
        let cmd = e.command.clone().unwrap_or_default();
        let failed = |err: String, out: &str| {
            format!(
                "Exec lifecycle hook ([{}]) for Container {name:?} in Pod {:?} failed - error: {err}, message: {out:?}",
                cmd.join(" "),
                pod_desc(pod)
            )
        };
        return match crate::prober::exec(rt, container_id, &cmd, None).await {
            Ok((0, _)) => Ok(()),
            Ok((code, out)) => Err(failed(
                format!("command '{}' exited with {code}: {out}", cmd.join(" ")),
                &out,
            )),
            Err(why) => Err(failed(why.unwrap_or_else(|| "timed out".into()), "")),
        };
    }
    if let Some(h) = &handler.http_get {
        let path = h.path.clone().unwrap_or_default();
        let failed = |err: String| {
            format!(
                "HTTP lifecycle hook ({path}) for Container {name:?} in Pod {:?} failed - error: {err}",
                pod_desc(pod)
            )
        };
        let req = http::Request::for_action(h, container, pod_ip, "lifecycle").map_err(failed)?;
        return http::get(&req).await.map(|_| ()).map_err(failed);
    }
    if let Some(s) = &handler.sleep {
        let secs = u64::try_from(s.seconds).unwrap_or(0);
        tokio::time::sleep(Duration::from_secs(secs)).await;
        return Ok(());
    }
    Err(format!(
        "Cannot run handler: {} lifecycle hook of Container {name:?} in Pod {:?}: only exec, httpGet and sleep are supported",
        if handler.tcp_socket.is_some() {
            "a tcpSocket"
        } else {
            "an empty"
        },
        pod_desc(pod)
    ))
}
