//! The CRI scenario suite and lifecycle bench behind `nodelet cri check`: any runtime that
//! speaks CRI v1 (containerd, CRI-O, `nodelet cri serve`, or a runtime in this process behind
//! the runtime traits), held to one set of scenarios and timed the same way, side by side.
//!
//! A run ([`run`]) takes the test image onto each runtime (pulled by reference, or from an
//! archive served by a registry of its own on loopback, [`registry`]), runs the selected
//! [`SCENARIOS`] one after another on each, then the bench, and removes everything it made:
//! every sandbox and container carries the label [`RUN_LABEL`] with the run's id, and an image
//! the run pulled is removed again. A scenario's failure is a report line, never a panic; every
//! call has a deadline.

mod bench;
mod ctx;
mod outcome;
pub mod registry;
mod report;
mod run;
mod scenarios;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

pub use bench::{Bench, Memory, OPERATIONS};
pub use ctx::{Ctx, Env, RUN_LABEL, SCENARIO_LABEL, Target, TestImage};
pub use outcome::{Outcome, Step, Stop};
pub use report::{Column, Report, Row};
pub use run::{ImageSource, Options, cleanup, new_run_id, run};
pub use scenarios::{SCENARIOS, Scenario, scenario};

/// What keeps a run from starting.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("connecting to {endpoint}: {source}")]
    Connect {
        endpoint: String,
        source: runtime::Error,
    },
    #[error(transparent)]
    Registry(#[from] registry::RegistryError),
    #[error("the image archive {0} holds no image")]
    EmptyArchive(PathBuf),
}

pub type Result<T> = std::result::Result<T, Error>;

/// The runtime at `endpoint` (a unix socket, `unix:///path` or a path), with its image service
/// at `image_endpoint` when that is another socket.
pub async fn connect(
    endpoint: &str,
    image_endpoint: Option<&str>,
    timeout: Duration,
) -> Result<Target> {
    let rt = runtime::remote::connect(endpoint, timeout)
        .await
        .map_err(|source| Error::Connect {
            endpoint: endpoint.into(),
            source,
        })?;
    let rt = Arc::new(rt);
    let images: Arc<dyn runtime::ImageService> =
        match image_endpoint {
            None => rt.clone(),
            Some(ie) => Arc::new(runtime::remote::connect(ie, timeout).await.map_err(
                |source| Error::Connect {
                    endpoint: ie.into(),
                    source,
                },
            )?),
        };
    let socket = PathBuf::from(endpoint.strip_prefix("unix://").unwrap_or(endpoint));
    Ok(Target {
        endpoint: endpoint.into(),
        rt,
        images,
        socket: Some(socket),
    })
}
