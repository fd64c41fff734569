//! Lifecycle hooks (upstream `pkg/kubelet/lifecycle/handlers.go`): `postStart` right after a
//! container started, `preStop` before its stop signal. A hook is an exec in the container
//! (through the runtime's ExecSync), an HTTP GET from the kubelet to the pod (any answer
//! passes; only a failure to get one fails the hook, as upstream) or a sleep.

use std::time::Duration;

use k8s_openapi::api::core::v1::{Container, LifecycleHandler, Pod};
use runtime::RuntimeService;

use crate::prober::http;

/// Why a hook failed, worded as upstream's handler runner words it. The message becomes the
/// container's status message (`PostStartHookError`); it may hold what the hook printed, so
/// events and logs never carry it.
#[derive(Debug, thiserror::Error)]
pub enum HookError {
    #[error(
        "Exec lifecycle hook ([{command}]) for Container {container:?} in Pod {pod:?} failed - \
         error: {error}, message: {output:?}"
    )]
    Exec {
        command: String,
        container: String,
        pod: String,
        /// Why the command failed (its exit code and output, or the runtime's error).
        error: String,
        output: String,
    },
    #[error(
        "HTTP lifecycle hook ({path}) for Container {container:?} in Pod {pod:?} failed - \
         error: {source}"
    )]
    Http {
        path: String,
        container: String,
        pod: String,
        #[source]
        source: http::HttpError,
    },
    #[error(
        "Cannot run handler: {what} lifecycle hook of Container {container:?} in Pod {pod:?}: \
         only exec, httpGet and sleep are supported"
    )]
    Unsupported {
        what: &'static str,
        container: String,
        pod: String,
    },
}

/// Runs `handler` for the container `container_id` of `pod`.
pub async fn run(
    rt: &dyn RuntimeService,
    pod: &Pod,
    container: &Container,
    container_id: &str,
    handler: &LifecycleHandler,
    pod_ip: &str,
) -> Result<(), HookError> {
    let container_name = container.name.clone();
    let pod_name = crate::model::PodRef::of(pod).desc();
    if let Some(e) = &handler.exec {
        let cmd = e.command.clone().unwrap_or_default();
        let command = cmd.join(" ");
        let (error, output) = match crate::prober::exec(rt, container_id, &cmd, None).await {
            Ok((0, _)) => return Ok(()),
            Ok((code, out)) => (
                format!("command '{command}' exited with {code}: {out}"),
                out,
            ),
            Err(why) => (why.unwrap_or_else(|| "timed out".into()), String::new()),
        };
        return Err(HookError::Exec {
            command,
            container: container_name,
            pod: pod_name,
            error,
            output,
        });
    }
    if let Some(h) = &handler.http_get {
        let failed = |source| HookError::Http {
            path: h.path.clone().unwrap_or_default(),
            container: container_name.clone(),
            pod: pod_name.clone(),
            source,
        };
        let req = http::Request::for_action(h, container, pod_ip, "lifecycle").map_err(failed)?;
        return http::get(&req).await.map(|_| ()).map_err(failed);
    }
    if let Some(s) = &handler.sleep {
        let secs = u64::try_from(s.seconds).unwrap_or(0);
        tokio::time::sleep(Duration::from_secs(secs)).await;
        return Ok(());
    }
    let what = if handler.tcp_socket.is_some() {
        "a tcpSocket"
    } else {
        "an empty"
    };
    Err(HookError::Unsupported {
        what,
        container: container_name,
        pod: pod_name,
    })
}
