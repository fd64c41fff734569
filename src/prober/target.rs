//! Where a probe or a hook reaches a container from the kubelet: its port (a number or a named
//! port of the container), `host:port`, and the words upstream uses for a failed connect.

use k8s_openapi::api::core::v1::Container;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

/// Why a probe's or hook's port names no port of the container.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PortError {
    /// A name none of the container's ports has.
    #[error("couldn't find port: {name} in {container}")]
    Unknown { name: String, container: String },
    /// A number that is no port.
    #[error("invalid port number: {0}")]
    Invalid(i32),
}

/// The port a probe or hook names: a number, or the name of one of the container's ports.
pub fn resolve_port(port: &IntOrString, c: &Container) -> Result<u16, PortError> {
    let n = match port {
        IntOrString::Int(n) => *n,
        IntOrString::String(name) => {
            if let Ok(n) = name.parse::<i32>() {
                n
            } else {
                c.ports
                    .iter()
                    .flatten()
                    .find(|p| p.name.as_deref() == Some(name.as_str()))
                    .map(|p| p.container_port)
                    .ok_or_else(|| PortError::Unknown {
                        name: name.clone(),
                        container: c.name.clone(),
                    })?
            }
        }
    };
    u16::try_from(n)
        .ok()
        .filter(|n| *n > 0)
        .ok_or(PortError::Invalid(n))
}

/// `host:port`, with brackets around an IPv6 address.
pub fn join_host_port(host: &str, port: u16) -> String {
    if host.contains(':') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}

/// An I/O error as Go's net package words the common ones (`connection refused`, ...).
pub fn io_text(e: &std::io::Error) -> String {
    match e.kind() {
        std::io::ErrorKind::ConnectionRefused => "connection refused".into(),
        std::io::ErrorKind::ConnectionReset => "connection reset by peer".into(),
        _ => {
            // "Network is unreachable (os error 101)" -> "network is unreachable"
            let s = e.to_string();
            let s = s.split(" (os error").next().unwrap_or(&s).to_string();
            let mut c = s.chars();
            match c.next() {
                Some(f) => f.to_lowercase().chain(c).collect(),
                None => s,
            }
        }
    }
}
