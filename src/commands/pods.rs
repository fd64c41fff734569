//! `nodelet pods`: the pods the runtime is running, with their containers' states.

use std::process::ExitCode;

use runtime::{RuntimeService, cri};

use crate::pod::{LABEL_POD_NAME, LABEL_POD_NAMESPACE};

pub async fn run(dirs: &super::Dirs) -> anyhow::Result<ExitCode> {
    let rt = super::builtin(dirs).await?;
    let sandboxes = rt
        .list_pod_sandbox(cri::ListPodSandboxRequest { filter: None })
        .await?
        .items;
    let containers = rt
        .list_containers(cri::ListContainersRequest { filter: None })
        .await?
        .containers;
    println!("{:<40} {:<10} {:<12} CONTAINERS", "POD", "STATE", "SANDBOX");
    for sb in sandboxes {
        let name = format!(
            "{}/{}",
            sb.labels
                .get(LABEL_POD_NAMESPACE)
                .map(String::as_str)
                .unwrap_or("-"),
            sb.labels
                .get(LABEL_POD_NAME)
                .map(String::as_str)
                .unwrap_or("-")
        );
        let state = if sb.state == cri::PodSandboxState::SandboxReady as i32 {
            "Ready"
        } else {
            "NotReady"
        };
        let cs: Vec<String> = containers
            .iter()
            .filter(|c| c.pod_sandbox_id == sb.id)
            .map(|c| {
                let st = cri::ContainerState::try_from(c.state)
                    .map(|s| {
                        s.as_str_name()
                            .trim_start_matches("CONTAINER_")
                            .to_lowercase()
                    })
                    .unwrap_or_else(|_| "unknown".into());
                let name = c.metadata.as_ref().map(|m| m.name.as_str()).unwrap_or("?");
                format!("{name}={st}")
            })
            .collect();
        println!(
            "{:<40} {:<10} {:<12} {}",
            name,
            state,
            &sb.id[..sb.id.len().min(12)],
            cs.join(",")
        );
    }
    Ok(ExitCode::SUCCESS)
}
