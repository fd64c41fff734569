//! The endpoints monitoring scrapes: `/metrics` (the kubelet's own, with the running pods and
//! containers counted at the scrape), `/metrics/probes`, `/metrics/resource` ([`resource`]),
//! `/metrics/cadvisor` ([`cadvisor`]) and `/stats/summary` ([`summary`]).

use std::sync::Arc;

use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use runtime::cri;

use super::{Ctx, cadvisor, json, resource, summary, text};

const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// `/metrics`: the kubelet's metrics; the running pods and containers counted from the
/// runtime at the scrape.
pub(super) async fn metrics_handler(State(ctx): State<Arc<Ctx>>) -> Response {
    let m = crate::metrics::get();
    let rt = ctx.deps.rt.as_ref();
    if let Ok(l) = rt
        .list_pod_sandbox(cri::ListPodSandboxRequest {
            filter: Some(cri::PodSandboxFilter {
                state: Some(cri::PodSandboxStateValue {
                    state: cri::PodSandboxState::SandboxReady as i32,
                }),
                ..Default::default()
            }),
        })
        .await
    {
        m.running_pods
            .set(i64::try_from(l.items.len()).unwrap_or(i64::MAX));
    }
    if let Ok(l) = rt
        .list_containers(cri::ListContainersRequest { filter: None })
        .await
    {
        let mut counts: std::collections::BTreeMap<&str, i64> = [
            ("created", 0),
            ("running", 0),
            ("exited", 0),
            ("unknown", 0),
        ]
        .into();
        for c in &l.containers {
            let state = match cri::ContainerState::try_from(c.state) {
                Ok(cri::ContainerState::ContainerCreated) => "created",
                Ok(cri::ContainerState::ContainerRunning) => "running",
                Ok(cri::ContainerState::ContainerExited) => "exited",
                _ => "unknown",
            };
            *counts.entry(state).or_default() += 1;
        }
        for (state, n) in counts {
            m.running_containers
                .get_or_create(&crate::metrics::ContainerState {
                    container_state: state.to_string(),
                })
                .set(n);
        }
    }
    (
        StatusCode::OK,
        [(header::CONTENT_TYPE, OPENMETRICS)],
        m.encode(),
    )
        .into_response()
}

/// `/metrics/resource`: what metrics-server reads ([`resource`]).
pub(super) async fn resource_metrics_handler(State(ctx): State<Arc<Ctx>>) -> Response {
    let body = resource::render(ctx.deps.rt.as_ref()).await;
    (
        StatusCode::OK,
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        body,
    )
        .into_response()
}

/// `/metrics/cadvisor`: the containers' usage by cAdvisor's names ([`cadvisor`]).
pub(super) async fn cadvisor_metrics_handler(State(ctx): State<Arc<Ctx>>) -> Response {
    let body = cadvisor::render(ctx.deps.rt.as_ref()).await;
    (
        StatusCode::OK,
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        body,
    )
        .into_response()
}

/// `/stats/summary`: the Summary API ([`summary`]).
pub(super) async fn summary_handler(State(ctx): State<Arc<Ctx>>) -> Response {
    let src = summary::Sources {
        node_name: &ctx.deps.node_name,
        root_dir: &ctx.deps.root_dir,
        pod_logs_dir: &ctx.deps.pod_logs_dir,
        pods_dir: &ctx.deps.root_dir.join("pods"),
    };
    match summary::summary(&src, ctx.deps.rt.as_ref(), ctx.deps.images.as_ref()).await {
        Ok(s) => json(&s),
        Err(e) => text(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("failed to get summary stats: {e}"),
        ),
    }
}

/// `/metrics/probes`: `prober_probe_total`.
pub(super) async fn probe_metrics_handler() -> Response {
    let body = crate::metrics::get().encode_probes();
    (StatusCode::OK, [(header::CONTENT_TYPE, OPENMETRICS)], body).into_response()
}
