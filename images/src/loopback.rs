//! Registries on this machine: a loopback registry that does not speak TLS is spoken to in
//! plain HTTP, as containerd's fallback for local registries does.

use std::time::Duration;

use crate::types::RegistryConfig;

/// Whether `endpoint` (`host[:port]`) is this machine: `localhost` or a loopback address. A
/// registry there is spoken to over plain HTTP, as containerd does, since no certificate could
/// name it anyway.
fn is_loopback(endpoint: &str) -> bool {
    let host = match endpoint.strip_prefix('[') {
        // `[::1]:5000`
        Some(rest) => rest.split(']').next().unwrap_or(rest),
        None => match endpoint.rsplit_once(':') {
            // A bare IPv6 address has more than one colon.
            Some((h, port)) if !h.contains(':') && port.parse::<u16>().is_ok() => h,
            _ => endpoint,
        },
    };
    host.eq_ignore_ascii_case("localhost")
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

/// Whether the registry at `endpoint` (`host:port`, on loopback) answers a TLS ClientHello
/// with something other than TLS, i.e. serves plain HTTP. As containerd's fallback for local
/// registries: HTTPS is tried first, and a server that does not speak TLS is spoken to in
/// plain HTTP (a TLS server whose certificate fails verification stays a TLS error). A server
/// that cannot be reached or does not answer within 2 s counts as TLS, the default.
async fn serves_plain_http(endpoint: &str) -> bool {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    crate::pull::install_crypto_provider();
    let hello = || -> Option<Vec<u8>> {
        let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
        let config = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .ok()?
            .with_root_certificates(rustls::RootCertStore::empty())
            .with_no_client_auth();
        let name = rustls::pki_types::ServerName::try_from("localhost").ok()?;
        let mut conn = rustls::ClientConnection::new(std::sync::Arc::new(config), name).ok()?;
        let mut bytes = Vec::new();
        conn.write_tls(&mut bytes).ok()?;
        Some(bytes)
    };
    let Some(hello) = hello() else {
        return false;
    };
    let probe = async {
        let mut conn = tokio::net::TcpStream::connect(endpoint).await.ok()?;
        conn.write_all(&hello).await.ok()?;
        let mut first = [0u8; 1];
        let n = conn.read(&mut first).await.ok()?;
        // A TLS server answers with a handshake (22) or an alert (21) record.
        Some(n == 0 || !matches!(first[0], 21 | 22))
    };
    tokio::time::timeout(Duration::from_secs(2), probe)
        .await
        .ok()
        .flatten()
        .unwrap_or(false)
}

/// Whether to speak plain HTTP to `endpoint` though it is not configured as insecure: a
/// loopback registry with a port, no TLS settings in the config, that does not speak TLS.
pub(crate) async fn plain_loopback(config: &RegistryConfig, endpoint: &str) -> bool {
    let has_port = endpoint
        .rsplit_once(':')
        .is_some_and(|(_, p)| p.parse::<u16>().is_ok());
    let tls_configured = config
        .hosts
        .get(endpoint)
        .is_some_and(|h| !h.ca_pem.is_empty() || h.insecure_skip_verify);
    is_loopback(endpoint) && has_port && !tls_configured && serves_plain_http(endpoint).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::HostConfig;

    #[test]
    fn loopback_hosts() {
        for e in [
            "localhost",
            "localhost:5000",
            "127.0.0.1:5000",
            "127.3.2.1",
            "[::1]:5000",
            "::1",
        ] {
            assert!(is_loopback(e), "{e}");
        }
        for e in [
            "registry.example:5000",
            "10.0.0.1:5000",
            "[fd00::1]:443",
            "localhost.example",
        ] {
            assert!(!is_loopback(e), "{e}");
        }
    }

    /// A server on loopback that answers its first bytes with `reply`; its `host:port`.
    async fn answering(reply: &'static [u8]) -> String {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        tokio::spawn(async move {
            while let Ok((mut conn, _)) = listener.accept().await {
                let mut buf = [0u8; 512];
                let _ = conn.read(&mut buf).await;
                let _ = conn.write_all(reply).await;
            }
        });
        addr
    }

    #[tokio::test]
    async fn a_loopback_registry_is_plain_http_only_when_it_does_not_speak_tls() {
        // What Go's TLS server and any HTTP server answer to a ClientHello.
        let http = answering(b"HTTP/1.0 400 Bad Request\r\n\r\n").await;
        assert!(serves_plain_http(&http).await);
        assert!(plain_loopback(&RegistryConfig::default(), &http).await);
        // A TLS alert (record type 21): a TLS server, whatever it thought of the hello.
        let tls = answering(&[21, 3, 3, 0, 2, 2, 40]).await;
        assert!(!serves_plain_http(&tls).await);
        // Nothing listening: TLS, the default, and the pull's own error says why.
        let closed = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap().to_string()
        };
        assert!(!serves_plain_http(&closed).await);
        // TLS settings for the host keep it on TLS without asking it.
        let mut c = RegistryConfig::default();
        c.hosts.insert(
            http.clone(),
            HostConfig {
                insecure_skip_verify: true,
                ..Default::default()
            },
        );
        assert!(!plain_loopback(&c, &http).await);
    }
}
