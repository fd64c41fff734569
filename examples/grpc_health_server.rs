//! A gRPC health checking server (`grpc.health.v1.Health`) for the tests of nodelet's gRPC
//! probes: the test image builder puts it into a test image as `/bin/grpc-health-server`.
//!
//!   grpc-health-server PORT [SERVICE=STATUS]...
//!
//! serves on `0.0.0.0:PORT` (and `[::]:PORT` when the pod has IPv6): the server as a whole
//! (service "") is SERVING; each `SERVICE=STATUS` sets a named service to `SERVING` or
//! `NOT_SERVING`.

use tonic_health::ServingStatus;

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let port: u16 = args
        .next()
        .ok_or("usage: grpc-health-server PORT [SERVICE=STATUS]...")?
        .parse()?;
    let (reporter, service) = tonic_health::server::health_reporter();
    for arg in args {
        let (name, status) = arg
            .split_once('=')
            .ok_or_else(|| format!("{arg:?}: want SERVICE=STATUS"))?;
        let status = match status {
            "SERVING" => ServingStatus::Serving,
            "NOT_SERVING" => ServingStatus::NotServing,
            other => return Err(format!("unknown status {other:?}").into()),
        };
        reporter.set_service_status(name, status).await;
    }
    let addr = std::net::SocketAddr::from(([0, 0, 0, 0], port));
    eprintln!("grpc-health-server: serving on {addr}");
    tonic::transport::Server::builder()
        .add_service(service)
        .serve(addr)
        .await?;
    Ok(())
}
