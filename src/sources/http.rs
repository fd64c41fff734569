//! The static pod URL (`staticPodURL`): polled with a plain HTTP/1.1 GET (`http://` only; no
//! TLS, no custom headers yet) at start and every `httpCheckFrequency`. The body is one Pod, a
//! `PodList` or a `v1` `List` of Pods, in JSON or YAML; the pods get the static pod defaults
//! with source `http`. As upstream, a response that fails (status other than 200, a decoding
//! error, any invalid pod) changes nothing: the previous pods stay. An empty body means no
//! pods (upstream sends an empty set too, and logs an error).

use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::mpsc::Sender;

use super::{Error, HTTP_SOURCE, PodOp, PodUpdate, pod};

/// Largest body accepted.
const MAX_RESPONSE: u64 = 16 << 20;
/// Deadline of one GET.
const TIMEOUT: Duration = Duration::from_secs(30);

/// The static pod URL source.
#[derive(Debug)]
pub struct HttpSource {
    url: String,
    node_name: String,
    check_every: Duration,
    /// The last body and the pods it gave, so an unchanged body keeps its pods' seen times.
    last: Option<(Vec<u8>, Vec<Pod>)>,
    /// Where new errors are also sent (the kubelet records them as events).
    problems: Option<tokio::sync::mpsc::UnboundedSender<String>>,
}

impl HttpSource {
    pub fn new(
        url: impl Into<String>,
        node_name: impl Into<String>,
        check_every: Duration,
    ) -> Self {
        HttpSource {
            url: url.into(),
            node_name: node_name.into(),
            check_every,
            last: None,
            problems: None,
        }
    }

    /// Also sends each new error to `tx`.
    pub fn report_to(mut self, tx: tokio::sync::mpsc::UnboundedSender<String>) -> Self {
        self.problems = Some(tx);
        self
    }

    /// Fetches and decodes the URL once: the defaulted, valid pods, or why not.
    pub async fn fetch(&mut self) -> Result<Vec<Pod>, Error> {
        let at_url = |source| Error::Url {
            url: self.url.clone(),
            source: Box::new(source),
        };
        let body = tokio::time::timeout(TIMEOUT, get(&self.url))
            .await
            .unwrap_or(Err(Error::Timeout(TIMEOUT)))
            .map_err(at_url)?;
        if let Some((last, pods)) = &self.last {
            if *last == body {
                return Ok(pods.clone());
            }
        }
        let pods = self.decode(&body).map_err(at_url)?;
        self.last = Some((body, pods.clone()));
        Ok(pods)
    }

    /// Fetches now and every `check_every`, sending each pod set that differs from the last
    /// one sent as a [`PodOp::Set`] from source `http`; failures are logged. Returns when the
    /// receiver is gone.
    pub async fn run(mut self, tx: Sender<PodUpdate>) {
        let mut interval = tokio::time::interval(self.check_every);
        interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut sent: Option<Vec<Pod>> = None;
        let mut last_error = String::new();
        loop {
            tokio::select! {
                _ = interval.tick() => {}
                _ = tx.closed() => return,
            }
            let pods = match self.fetch().await {
                Ok(pods) => pods,
                Err(e) => {
                    let e = e.to_string();
                    tracing::warn!("static pod URL: {e}");
                    if let Some(tx) = self.problems.as_ref().filter(|_| e != last_error) {
                        let _ = tx.send(format!("static pod URL: {e}"));
                    }
                    last_error = e;
                    continue;
                }
            };
            last_error.clear();
            if sent.as_ref() == Some(&pods) {
                continue;
            }
            sent = Some(pods.clone());
            let update = PodUpdate {
                op: PodOp::Set,
                pods,
                source: HTTP_SOURCE,
            };
            if tx.send(update).await.is_err() {
                return;
            }
        }
    }

    /// The pods of a body, defaulted and valid. The errors do not name the URL.
    fn decode(&self, body: &[u8]) -> Result<Vec<Pod>, Error> {
        let url = &self.url;
        let text = std::str::from_utf8(body).map_err(Error::NotUtf8)?;
        if text.trim().is_empty() {
            tracing::warn!("static pod URL {url}: empty response, no pods");
            return Ok(Vec::new());
        }
        let value: Value = serde_norway::from_str(text).map_err(Error::NotYaml)?;
        let kind = value.get("kind").and_then(Value::as_str).unwrap_or("");
        let items = match kind {
            "PodList" | "List" => {
                let Some(Value::Array(items)) = value.get("items") else {
                    let kind = kind.to_string();
                    return Err(Error::ListWithoutItems { kind });
                };
                let mut items = items.clone();
                for item in &mut items {
                    // PodList items usually carry no kind and apiVersion.
                    if let (Value::Object(m), "PodList") = (&mut *item, kind) {
                        m.entry("kind").or_insert_with(|| "Pod".into());
                        m.entry("apiVersion").or_insert_with(|| "v1".into());
                    }
                }
                if value.get("apiVersion").and_then(Value::as_str) != Some("v1") {
                    let kind = kind.to_string();
                    return Err(Error::ListApiVersion { kind });
                }
                items
            }
            _ => vec![value],
        };
        let seen = chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Nanos, true);
        let mut pods = Vec::with_capacity(items.len());
        for (index, item) in items.into_iter().enumerate() {
            let what = |e| Error::Item {
                index,
                source: Box::new(e),
            };
            let mut p = pod::decode_value(item).map_err(what)?;
            pod::validate(&p).map_err(what)?;
            pod::apply_defaults(&mut p, url, &self.node_name, HTTP_SOURCE, &seen);
            pod::validate(&p).map_err(what)?;
            pods.push(p);
        }
        Ok(pods)
    }
}

/// GET `url` (`http://host[:port][/path]`): the body of a 200 answer. The errors do not name
/// the URL.
async fn get(url: &str) -> Result<Vec<u8>, Error> {
    let rest = url
        .strip_prefix("http://")
        .ok_or(Error::UnsupportedScheme)?;
    let (authority, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, "/"),
    };
    if authority.is_empty() || authority.contains('@') {
        return Err(Error::InvalidHost);
    }
    let addr = if authority
        .rsplit(':')
        .next()
        .is_some_and(|p| p.parse::<u16>().is_ok())
        && !authority.ends_with(']')
    {
        authority.to_string()
    } else {
        format!("{authority}:80")
    };
    let mut stream = tokio::net::TcpStream::connect(&addr)
        .await
        .map_err(Error::Connect)?;
    let request = format!(
        "GET {path} HTTP/1.1\r\nHost: {authority}\r\nAccept: application/json, application/yaml, */*\r\nUser-Agent: nodelet\r\nConnection: close\r\n\r\n"
    );
    stream
        .write_all(request.as_bytes())
        .await
        .map_err(Error::SendRequest)?;
    let mut response = Vec::new();
    (&mut stream)
        .take(MAX_RESPONSE + 64 * 1024)
        .read_to_end(&mut response)
        .await
        .map_err(Error::ReadResponse)?;
    parse_response(&response)
}

/// The body of a complete HTTP/1.x response with status 200 (identity, Content-Length or
/// chunked).
fn parse_response(response: &[u8]) -> Result<Vec<u8>, Error> {
    let end = response
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or(Error::IncompleteResponse)?;
    let head = String::from_utf8_lossy(&response[..end]);
    let body = &response[end + 4..];
    let mut lines = head.split("\r\n");
    let status_line = lines.next().unwrap_or("");
    let status = status_line.split_whitespace().nth(1).unwrap_or("");
    if status != "200" {
        return Err(Error::Status(status_line.trim().to_string()));
    }
    let mut chunked = false;
    let mut length = None;
    for line in lines {
        let Some((name, value)) = line.split_once(':') else {
            continue;
        };
        let (name, value) = (name.trim().to_ascii_lowercase(), value.trim());
        if name == "transfer-encoding" && value.to_ascii_lowercase().contains("chunked") {
            chunked = true;
        } else if name == "content-length" {
            length = Some(
                value
                    .parse::<usize>()
                    .map_err(|_| Error::BadContentLength)?,
            );
        }
    }
    let body = if chunked {
        dechunk(body)?
    } else if let Some(n) = length {
        body.get(..n).ok_or(Error::TruncatedBody)?.to_vec()
    } else {
        body.to_vec()
    };
    if body.len() as u64 > MAX_RESPONSE {
        return Err(Error::BodyTooLarge(MAX_RESPONSE));
    }
    Ok(body)
}

fn dechunk(mut data: &[u8]) -> Result<Vec<u8>, Error> {
    let mut out = Vec::new();
    loop {
        let eol = data
            .windows(2)
            .position(|w| w == b"\r\n")
            .ok_or(Error::TruncatedChunk)?;
        let size_text = String::from_utf8_lossy(&data[..eol]);
        let size_text = size_text.split(';').next().unwrap_or("").trim();
        let size = usize::from_str_radix(size_text, 16).map_err(|_| Error::BadChunkSize)?;
        data = &data[eol + 2..];
        if size == 0 {
            return Ok(out);
        }
        out.extend_from_slice(data.get(..size).ok_or(Error::TruncatedChunk)?);
        data = data.get(size + 2..).ok_or(Error::TruncatedChunk)?;
    }
}

#[cfg(test)]
mod tests;
