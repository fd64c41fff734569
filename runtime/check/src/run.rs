//! A run: the test image on each runtime, the selected scenarios one after another on each,
//! the bench when asked, and everything the run made removed again, also when it is
//! interrupted.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use regex::Regex;
use runtime::cri;
use tokio_util::sync::CancellationToken;

use crate::bench::{self, Bench};
use crate::ctx::{Ctx, Env, RUN_LABEL, SCENARIO_LABEL, Target, TestImage};
use crate::outcome::{Outcome, Step, Stop};
use crate::registry::ArchiveRegistry;
use crate::report::{Column, Report, Row};
use crate::scenarios::{SCENARIOS, Scenario};
use crate::{Error, Result};

/// Where the test image comes from.
#[derive(Debug, Clone)]
pub enum ImageSource {
    /// A reference each runtime pulls.
    Reference(String),
    /// An OCI or `docker save` archive, served by a registry on loopback for the run.
    Archive(PathBuf),
}

/// What to run, and how.
#[derive(Debug, Clone)]
pub struct Options {
    pub image: ImageSource,
    /// Only scenarios whose name this matches (unanchored).
    pub focus: Option<Regex>,
    /// No scenario whose name this matches (unanchored).
    pub skip: Option<Regex>,
    /// The lifecycle bench's iterations, when it runs.
    pub bench: Option<u32>,
    /// Deadline of each CRI call (stops and execs get their own timeout on top; pulls get at
    /// least 10 minutes).
    pub call_timeout: Duration,
    /// Deadline of each scenario.
    pub scenario_timeout: Duration,
    /// Pods' logs and the archive's staging go below it (removed by the caller).
    pub work_dir: PathBuf,
    /// The value of the [`RUN_LABEL`] label on everything the run makes.
    pub run_id: String,
    /// Where the archive's registry listens (default: a free port on `127.0.0.1`).
    pub registry_listen: Option<std::net::SocketAddr>,
}

/// A run id: short, and different for each run on a machine.
pub fn new_run_id() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or_default();
    let mixed = (nanos as u64) ^ (u64::from(std::process::id()) << 40);
    format!("{:010x}", mixed & 0xff_ffff_ffff)
}

impl Options {
    /// The scenarios `focus` and `skip` select, in their order.
    pub fn selected(&self) -> Vec<&'static Scenario> {
        SCENARIOS
            .iter()
            .filter(|s| self.focus.as_ref().is_none_or(|f| f.is_match(s.name)))
            .filter(|s| !self.skip.as_ref().is_some_and(|k| k.is_match(s.name)))
            .collect()
    }
}

/// Runs the selected scenarios (and the bench) on each target in turn. Stops early, cleaning
/// up, when `cancel` fires.
pub async fn run(targets: &[Target], opts: &Options, cancel: &CancellationToken) -> Result<Report> {
    let selected = opts.selected();
    let registry = match &opts.image {
        ImageSource::Reference(_) => None,
        ImageSource::Archive(path) => {
            let scratch = opts.work_dir.join("archive");
            let listen = opts
                .registry_listen
                .unwrap_or_else(|| std::net::SocketAddr::from(([127, 0, 0, 1], 0)));
            Some(ArchiveRegistry::serve(path, &scratch, listen).await?)
        }
    };
    let reference = match (&opts.image, &registry) {
        (ImageSource::Reference(r), _) => r.clone(),
        (ImageSource::Archive(path), Some(reg)) => {
            let refs = reg.references();
            let first = refs.into_iter().next();
            first.ok_or_else(|| Error::EmptyArchive(path.clone()))?
        }
        (ImageSource::Archive(path), None) => return Err(Error::EmptyArchive(path.clone())),
    };
    let mut report = Report {
        run_id: opts.run_id.clone(),
        columns: Vec::new(),
        rows: selected
            .iter()
            .map(|s| Row {
                name: s.name,
                results: Vec::new(),
            })
            .collect(),
        interrupted: false,
    };
    for target in targets {
        let column = run_target(target, opts, &reference, &selected, &mut report, cancel).await;
        report.columns.push(column);
        if cancel.is_cancelled() {
            report.interrupted = true;
            break;
        }
    }
    drop(registry);
    Ok(report)
}

async fn run_target(
    target: &Target,
    opts: &Options,
    reference: &str,
    selected: &[&'static Scenario],
    report: &mut Report,
    cancel: &CancellationToken,
) -> Column {
    let mut column = Column {
        endpoint: target.endpoint.clone(),
        runtime: String::new(),
        bench: None,
        setup_error: None,
    };
    let version = tokio::time::timeout(opts.call_timeout, target.rt.version(Default::default()));
    match version.await {
        Ok(Ok(v)) => column.runtime = format!("{} {}", v.runtime_name, v.runtime_version),
        Ok(Err(e)) => column.setup_error = Some(format!("Version: {e}")),
        Err(_) => column.setup_error = Some("Version did not answer".into()),
    }
    let prepared = match &column.setup_error {
        Some(_) => None,
        None => match prepare(target, opts, reference).await {
            Ok(p) => Some(p),
            Err(Stop::Fail(e) | Stop::Skip(e)) => {
                column.setup_error = Some(e);
                None
            }
        },
    };
    let Some((env, pulled)) = prepared else {
        let why = column.setup_error.clone().unwrap_or_default();
        for row in &mut report.rows {
            row.results.push(Outcome::Fail(format!("not run: {why}")));
        }
        return column;
    };
    for (i, scenario) in selected.iter().enumerate() {
        if cancel.is_cancelled() {
            report.rows[i]
                .results
                .push(Outcome::Skip("interrupted".into()));
            continue;
        }
        let ctx = Ctx {
            target,
            env: &env,
            scenario: scenario.name,
        };
        let began = Instant::now();
        let outcome = tokio::select! {
            r = tokio::time::timeout(opts.scenario_timeout, scenario.run(&ctx)) => match r {
                Ok(step) => Outcome::from(step),
                Err(_) => Outcome::Fail(format!(
                    "the scenario did not end within {:?}", opts.scenario_timeout
                )),
            },
            () = cancel.cancelled() => Outcome::Skip("interrupted".into()),
        };
        tracing::info!(
            endpoint = %target.endpoint,
            scenario = scenario.name,
            took = ?began.elapsed(),
            "{}{}{}",
            outcome.status(),
            if outcome.message().is_empty() { "" } else { ": " },
            outcome.message()
        );
        for e in cleanup(target, &env.run_id, Some(scenario.name), opts.call_timeout).await {
            tracing::warn!(endpoint = %target.endpoint, scenario = scenario.name, "cleanup: {e}");
        }
        report.rows[i].results.push(outcome);
    }
    if let Some(iterations) = opts.bench
        && !cancel.is_cancelled()
    {
        let bench = tokio::select! {
            b = bench::run(target, &env, iterations) => b,
            () = cancel.cancelled() => Bench::failed("interrupted"),
        };
        column.bench = Some(bench);
        for e in cleanup(target, &env.run_id, None, opts.call_timeout).await {
            tracing::warn!(endpoint = %target.endpoint, "cleanup after the bench: {e}");
        }
    }
    if pulled {
        let req = cri::RemoveImageRequest {
            image: Some(cri::ImageSpec {
                image: env.image.id.clone(),
                ..Default::default()
            }),
        };
        let removed = tokio::time::timeout(opts.call_timeout, target.images.remove_image(req));
        match removed.await {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => {
                tracing::warn!(endpoint = %target.endpoint, "removing the test image: {e}")
            }
            Err(_) => {
                tracing::warn!(endpoint = %target.endpoint, "removing the test image: no answer")
            }
        }
    }
    column
}

/// The run's environment on `target`, and whether the run pulled the image (and so removes it
/// at the end).
async fn prepare(target: &Target, opts: &Options, reference: &str) -> Step<(Env, bool)> {
    let status = tokio::time::timeout(opts.call_timeout, target.rt.status(Default::default()))
        .await
        .map_err(|_| Stop::Fail("Status did not answer".into()))?
        .map_err(|e| Stop::Fail(format!("Status: {e}")))?;
    let conditions = status.status.map(|s| s.conditions).unwrap_or_default();
    let network = conditions.iter().find(|c| c.r#type == "NetworkReady");
    let no_pod_network = match network {
        Some(c) if c.status => None,
        Some(c) => Some(format!(
            "the runtime's network is not ready ({}: {})",
            c.reason, c.message
        )),
        None => Some("the runtime reports no NetworkReady condition".into()),
    };
    let status_of = |image: String| {
        let req = cri::ImageStatusRequest {
            image: Some(cri::ImageSpec {
                image,
                ..Default::default()
            }),
            verbose: false,
        };
        tokio::time::timeout(opts.call_timeout, target.images.image_status(req))
    };
    let found = status_of(reference.into())
        .await
        .map_err(|_| Stop::Fail("ImageStatus did not answer".into()))?
        .map_err(|e| Stop::Fail(format!("ImageStatus {reference}: {e}")))?;
    let mut pulled = false;
    let image = match found.image {
        Some(image) => image,
        None => {
            // An image the runtime already holds under other names is the user's: pulling it
            // only adds the run's name, and removing it would take theirs too.
            let listed = tokio::time::timeout(
                opts.call_timeout,
                target.images.list_images(Default::default()),
            )
            .await
            .map_err(|_| Stop::Fail("ListImages did not answer".into()))?
            .map_err(|e| Stop::Fail(format!("ListImages: {e}")))?;
            let held: std::collections::BTreeSet<String> =
                listed.images.into_iter().map(|i| i.id).collect();
            let req = cri::PullImageRequest {
                image: Some(cri::ImageSpec {
                    image: reference.into(),
                    ..Default::default()
                }),
                auth: None,
                sandbox_config: None,
            };
            let deadline = opts.call_timeout.max(Duration::from_secs(600));
            tokio::time::timeout(deadline, target.images.pull_image(req))
                .await
                .map_err(|_| {
                    Stop::Fail(format!(
                        "PullImage {reference} did not end within {deadline:?}"
                    ))
                })?
                .map_err(|e| Stop::Fail(format!("PullImage {reference}: {e}")))?;
            let found = status_of(reference.into())
                .await
                .map_err(|_| Stop::Fail("ImageStatus did not answer".into()))?
                .map_err(|e| Stop::Fail(format!("ImageStatus {reference}: {e}")))?;
            let image = found.image.ok_or_else(|| {
                Stop::Fail(format!(
                    "ImageStatus {reference} finds nothing after its pull"
                ))
            })?;
            pulled = !held.contains(&image.id);
            if !pulled {
                tracing::info!(
                    endpoint = %target.endpoint,
                    image = %image.id,
                    "the test image was already there under other names: it stays, with the name {reference}"
                );
            }
            image
        }
    };
    let repo_tag = image
        .repo_tags
        .iter()
        .find(|t| *t == reference || t.ends_with(&format!("/{reference}")))
        .or_else(|| {
            let with_latest = format!("{reference}:latest");
            image
                .repo_tags
                .iter()
                .find(|t| **t == with_latest || t.ends_with(&format!("/{with_latest}")))
        })
        .cloned();
    let env = Env {
        run_id: opts.run_id.clone(),
        image: TestImage {
            reference: reference.into(),
            id: image.id,
            repo_tag,
        },
        log_root: opts.work_dir.join("logs").join(sanitize(&target.endpoint)),
        host_root: opts.work_dir.join("host").join(sanitize(&target.endpoint)),
        no_pod_network,
        call_timeout: opts.call_timeout,
    };
    Ok((env, pulled))
}

/// `endpoint` as one path component.
fn sanitize(endpoint: &str) -> String {
    endpoint
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect()
}

/// Stops and removes every sandbox and container of the run (of one scenario when given) on
/// `target`; what could not be removed, in words.
pub async fn cleanup(
    target: &Target,
    run_id: &str,
    scenario: Option<&str>,
    timeout: Duration,
) -> Vec<String> {
    let mut selector =
        std::collections::HashMap::from([(RUN_LABEL.to_string(), run_id.to_string())]);
    if let Some(s) = scenario {
        selector.insert(SCENARIO_LABEL.into(), s.into());
    }
    let mut errors = Vec::new();
    let rt = &target.rt;
    let req = cri::ListPodSandboxRequest {
        filter: Some(cri::PodSandboxFilter {
            label_selector: selector.clone(),
            ..Default::default()
        }),
    };
    match tokio::time::timeout(timeout, rt.list_pod_sandbox(req)).await {
        Ok(Ok(r)) => {
            for pod in r.items {
                let stop = cri::StopPodSandboxRequest {
                    pod_sandbox_id: pod.id.clone(),
                };
                let remove = cri::RemovePodSandboxRequest {
                    pod_sandbox_id: pod.id.clone(),
                };
                let r = async {
                    rt.stop_pod_sandbox(stop).await?;
                    rt.remove_pod_sandbox(remove).await
                };
                match tokio::time::timeout(timeout * 2, r).await {
                    Ok(Ok(_)) => {}
                    Ok(Err(e)) => errors.push(format!("removing pod {}: {e}", pod.id)),
                    Err(_) => errors.push(format!("removing pod {}: no answer", pod.id)),
                }
            }
        }
        Ok(Err(e)) => errors.push(format!("ListPodSandbox: {e}")),
        Err(_) => errors.push("ListPodSandbox: no answer".into()),
    }
    let req = cri::ListContainersRequest {
        filter: Some(cri::ContainerFilter {
            label_selector: selector,
            ..Default::default()
        }),
    };
    match tokio::time::timeout(timeout, rt.list_containers(req)).await {
        Ok(Ok(r)) => {
            for c in r.containers {
                let stop = cri::StopContainerRequest {
                    container_id: c.id.clone(),
                    timeout: 0,
                };
                let remove = cri::RemoveContainerRequest {
                    container_id: c.id.clone(),
                };
                let r = async {
                    rt.stop_container(stop).await?;
                    rt.remove_container(remove).await
                };
                match tokio::time::timeout(timeout * 2, r).await {
                    Ok(Ok(_)) => {}
                    Ok(Err(e)) => errors.push(format!("removing container {}: {e}", c.id)),
                    Err(_) => errors.push(format!("removing container {}: no answer", c.id)),
                }
            }
        }
        Ok(Err(e)) => errors.push(format!("ListContainers: {e}")),
        Err(_) => errors.push("ListContainers: no answer".into()),
    }
    errors
}
