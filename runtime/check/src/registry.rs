//! A read-only OCI distribution registry on loopback serving the images of one archive, so that
//! every runtime of a run pulls the test image the way it pulls any other, with no network
//! beyond this machine. Only what a pull needs is answered: the API version check, manifests
//! by tag or digest and blobs, each with `GET` and `HEAD`; anything else is refused as the
//! distribution spec says (404 with an error body, 405 for writes).

use axum::body::Body;
use axum::http::{HeaderValue, Method, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use images::{Archive, ArchiveImage};
use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use tokio::task::JoinHandle;

/// Why the archive's registry could not start.
#[derive(Debug, thiserror::Error)]
pub enum RegistryError {
    #[error("reading the image archive {path}: {source}")]
    Read {
        path: PathBuf,
        source: images::Error,
    },
    #[error("starting the archive's registry on {0}: {1}")]
    Bind(SocketAddr, std::io::Error),
    #[error("reading the image archive {0}: the reading task failed")]
    Task(PathBuf),
}

/// The registry: alive until dropped.
pub struct ArchiveRegistry {
    addr: SocketAddr,
    references: Vec<String>,
    server: JoinHandle<()>,
}

/// What one repository of the registry holds.
#[derive(Default)]
struct Repository {
    /// Tag to the digest of the manifest or index it names.
    tags: BTreeMap<String, String>,
    /// Every digest the repository's images hold.
    digests: BTreeSet<String>,
}

struct Served {
    archive: Archive,
    repositories: BTreeMap<String, Repository>,
    /// Media types of the blobs that are manifests or indexes.
    media_types: BTreeMap<String, String>,
}

impl ArchiveRegistry {
    /// Reads `archive` (staging under `scratch`) and serves its images on `listen`
    /// (`127.0.0.1:0` for a free port on loopback).
    pub async fn serve(
        archive: &Path,
        scratch: &Path,
        listen: SocketAddr,
    ) -> Result<ArchiveRegistry, RegistryError> {
        let (path, scratch_dir) = (archive.to_path_buf(), scratch.to_path_buf());
        let read = tokio::task::spawn_blocking(move || Archive::read(&path, &scratch_dir))
            .await
            .map_err(|_| RegistryError::Task(archive.to_path_buf()))?
            .map_err(|source| RegistryError::Read {
                path: archive.to_path_buf(),
                source,
            })?;
        let listener = tokio::net::TcpListener::bind(listen)
            .await
            .map_err(|e| RegistryError::Bind(listen, e))?;
        let addr = listener
            .local_addr()
            .map_err(|e| RegistryError::Bind(listen, e))?;
        let mut served = Served {
            archive: read,
            repositories: BTreeMap::new(),
            media_types: BTreeMap::new(),
        };
        let mut references = Vec::new();
        let images: Vec<ArchiveImage> = served.archive.images().to_vec();
        for (n, image) in images.iter().enumerate() {
            let mut names: Vec<(String, String)> =
                image.names.iter().filter_map(|n| split_name(n)).collect();
            if names.is_empty() {
                names.push((format!("cri-check/image-{n}"), "latest".into()));
            }
            for (repo, tag) in names {
                let entry = served.repositories.entry(repo.clone()).or_default();
                entry.tags.insert(tag.clone(), image.target.digest.clone());
                entry
                    .digests
                    .extend(image.blobs.iter().map(|b| b.digest.clone()));
                references.push(format!("{addr}/{repo}:{tag}"));
            }
            for blob in &image.blobs {
                if blob.media_type.contains("manifest") || blob.media_type.contains("index") {
                    served
                        .media_types
                        .insert(blob.digest.clone(), blob.media_type.clone());
                }
            }
        }
        let served = Arc::new(served);
        let app = axum::Router::new().fallback(move |method: Method, uri: Uri| {
            let served = served.clone();
            async move { answer(&served, &method, uri.path()).await }
        });
        let server = tokio::spawn(async move {
            if let Err(e) = axum::serve(listener, app).await {
                tracing::warn!(error = %e, "the archive's registry stopped");
            }
        });
        Ok(ArchiveRegistry {
            addr,
            references,
            server,
        })
    }

    /// `127.0.0.1:<port>`.
    pub fn host(&self) -> String {
        self.addr.to_string()
    }

    /// A reference per name of each image, e.g. `127.0.0.1:41234/library/busybox:latest`.
    pub fn references(&self) -> Vec<String> {
        self.references.clone()
    }
}

impl Drop for ArchiveRegistry {
    fn drop(&mut self) {
        self.server.abort();
    }
}

/// `docker.io/library/busybox:latest` → (`library/busybox`, `latest`); the registry part of a
/// name is dropped (this registry stands for every one).
fn split_name(name: &str) -> Option<(String, String)> {
    let (repo, tag) = name.rsplit_once(':').filter(|(_, t)| !t.contains('/'))?;
    let path = match repo.split_once('/') {
        Some((first, rest))
            if first.contains('.') || first.contains(':') || first == "localhost" =>
        {
            rest
        }
        _ => repo,
    };
    Some((path.to_string(), tag.to_string()))
}

async fn answer(served: &Served, method: &Method, path: &str) -> Response {
    if method != Method::GET && method != Method::HEAD {
        return error(
            StatusCode::METHOD_NOT_ALLOWED,
            "UNSUPPORTED",
            "this registry is read-only",
        );
    }
    let Some(rest) = path.strip_prefix("/v2/") else {
        return error(StatusCode::NOT_FOUND, "NOT_FOUND", "not a registry path");
    };
    if rest.is_empty() {
        let mut r = axum::Json(serde_json::json!({})).into_response();
        r.headers_mut().insert(
            "Docker-Distribution-API-Version",
            HeaderValue::from_static("registry/2.0"),
        );
        return r;
    }
    let (repo, kind, reference) = match rest.rsplitn(3, '/').collect::<Vec<_>>()[..] {
        [reference, kind, repo] => (repo, kind, reference),
        _ => return error(StatusCode::NOT_FOUND, "NAME_UNKNOWN", "no such repository"),
    };
    let Some(repository) = served.repositories.get(repo) else {
        return error(StatusCode::NOT_FOUND, "NAME_UNKNOWN", "no such repository");
    };
    let (digest, code) = match kind {
        "manifests" if reference.contains(':') => (Some(reference), "MANIFEST_UNKNOWN"),
        "manifests" => (
            repository.tags.get(reference).map(String::as_str),
            "MANIFEST_UNKNOWN",
        ),
        "blobs" => (Some(reference), "BLOB_UNKNOWN"),
        _ => return error(StatusCode::NOT_FOUND, "NOT_FOUND", "not a registry path"),
    };
    let Some(digest) = digest.filter(|d| repository.digests.contains(*d)) else {
        return error(StatusCode::NOT_FOUND, code, "unknown to this registry");
    };
    let media_type = match kind {
        "manifests" => match served.media_types.get(digest) {
            Some(m) => m.as_str(),
            None => return error(StatusCode::NOT_FOUND, code, "not a manifest"),
        },
        _ => "application/octet-stream",
    };
    let Ok(file_path) = served.archive.blob_path(digest) else {
        return error(StatusCode::NOT_FOUND, code, "unknown to this registry");
    };
    let file = match tokio::fs::File::open(&file_path).await {
        Ok(f) => f,
        Err(e) => {
            return error(
                StatusCode::INTERNAL_SERVER_ERROR,
                "UNKNOWN",
                &format!("opening the blob: {e}"),
            );
        }
    };
    let size = match file.metadata().await {
        Ok(m) => m.len(),
        Err(e) => {
            return error(
                StatusCode::INTERNAL_SERVER_ERROR,
                "UNKNOWN",
                &format!("reading the blob: {e}"),
            );
        }
    };
    let body = if method == Method::HEAD {
        Body::empty()
    } else {
        Body::from_stream(tokio_util::io::ReaderStream::new(file))
    };
    let mut r = Response::new(body);
    let h = r.headers_mut();
    if let Ok(v) = HeaderValue::from_str(media_type) {
        h.insert(header::CONTENT_TYPE, v);
    }
    h.insert(header::CONTENT_LENGTH, HeaderValue::from(size));
    if let Ok(v) = HeaderValue::from_str(digest) {
        h.insert("Docker-Content-Digest", v);
    }
    r
}

fn error(status: StatusCode, code: &str, message: &str) -> Response {
    let body = serde_json::json!({"errors": [{"code": code, "message": message}]});
    (status, axum::Json(body)).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_lose_their_registry() {
        let cases = [
            (
                "docker.io/library/busybox:latest",
                "library/busybox",
                "latest",
            ),
            ("busybox:1.36", "busybox", "1.36"),
            ("localhost:5000/a/b:c", "a/b", "c"),
            ("team/app:v1", "team/app", "v1"),
        ];
        for (name, repo, tag) in cases {
            assert_eq!(
                split_name(name),
                Some((repo.to_string(), tag.to_string())),
                "{name}"
            );
        }
        assert_eq!(split_name("localhost:5000/untagged"), None);
    }
}
