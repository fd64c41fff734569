//! containerd's own API, where it serves better than CRI: importing image archives (the
//! preload dir of a node whose runtime is containerd) into the `k8s.io` namespace that
//! containerd's CRI plugin serves, and pinning them there. It uses the services containerd has
//! had since 1.x (Version, Content, Images, Leases), so it also works with a containerd without
//! the Transfer service (1.6): the archive is read and checked by nodelet's image crate, each
//! blob written to containerd's content store under a lease (so its garbage collector does not
//! take half an import), labelled with what it refers to (`containerd.io/gc.ref.content.*`, as
//! containerd's own importer does), then the image records created; containerd's CRI plugin
//! unpacks an image into its snapshotter when a container first uses it.
//!
//! Pinning is the `io.cri-containerd.pinned=pinned` label on the image records, which
//! containerd's CRI plugin reports as `Image.pinned` from 1.7 on.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use containerd_client::services::v1::content_client::ContentClient;
use containerd_client::services::v1::images_client::ImagesClient;
use containerd_client::services::v1::leases_client::LeasesClient;
use containerd_client::services::v1::version_client::VersionClient;
use containerd_client::services::v1::{
    CreateImageRequest, CreateRequest as CreateLeaseRequest, DeleteRequest as DeleteLeaseRequest,
    GetImageRequest, Image as ImageRecord, Info as ContentInfo, InfoRequest, UpdateImageRequest,
    UpdateRequest as UpdateContentRequest, WriteAction, WriteContentRequest,
};
use containerd_client::types::Descriptor;
use tokio::io::{AsyncReadExt, AsyncSeekExt};
use tonic::transport::Channel;

use crate::endpoint::unix_socket_path;
use crate::{Code, Error, Result};

/// The namespace containerd's CRI plugin serves.
pub const NAMESPACE: &str = "k8s.io";
/// The label containerd's CRI plugin reads as `Image.pinned` (1.7 and later).
pub const PINNED_LABEL: &str = "io.cri-containerd.pinned";
const PINNED_VALUE: &str = "pinned";
/// The label containerd's CRI plugin puts on the images it manages.
const MANAGED_LABEL: &str = "io.cri-containerd.image";
/// How much of a blob one write message carries.
const CHUNK: usize = 1 << 20;
/// How long an import's lease keeps its content if nodelet dies before removing it.
const LEASE_EXPIRY: Duration = Duration::from_secs(3600);

/// containerd's API at a socket (the same socket as its CRI service). Cheap to clone.
#[derive(Clone)]
pub struct Containerd {
    endpoint: Arc<str>,
    channel: Channel,
    timeout: Duration,
    version: Arc<str>,
}

impl std::fmt::Debug for Containerd {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Containerd")
            .field("endpoint", &self.endpoint)
            .field("version", &self.version)
            .finish()
    }
}

/// An image an import made or updated in containerd.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImportedImage {
    /// Its id (config digest), as CRI reports it.
    pub id: String,
    /// Its names (`repo:tag`).
    pub names: Vec<String>,
    /// Every image record made for it: the names and `repo@digest`s.
    pub records: Vec<String>,
}

fn status(rpc: &str, endpoint: &str, e: tonic::Status) -> Error {
    let e = super::status_error(rpc, None, e);
    Error::new(
        e.code(),
        format!("containerd at {endpoint}: {rpc}: {}", e.message()),
    )
}

impl Containerd {
    /// Connects to containerd at `endpoint` (`unix:///path` or a path) and asks its version;
    /// a socket that does not serve containerd's Version service (CRI-O, `nodelet cri serve`)
    /// is refused with `FailedPrecondition` saying so.
    pub async fn connect(endpoint: &str, timeout: Duration) -> Result<Containerd> {
        let path = unix_socket_path(endpoint)?;
        let cfg = super::RemoteConfig::new(timeout);
        let channel = super::channel(path, &cfg);
        let mut client = VersionClient::new(channel.clone());
        let req = namespaced(());
        let version = match tokio::time::timeout(timeout, client.version(req)).await {
            Err(_) => {
                return Err(Error::unavailable(format!(
                    "containerd at {endpoint}: Version did not answer within {timeout:?}"
                )));
            }
            Ok(Err(e)) if e.code() == tonic::Code::Unimplemented => {
                return Err(Error::failed_precondition(format!(
                    "{endpoint} does not serve containerd's API (containerd.services.version.v1 \
                     is not implemented): only containerd can take the preload dir's images"
                )));
            }
            Ok(Err(e)) => return Err(status("Version", endpoint, e)),
            Ok(Ok(v)) => v.into_inner().version,
        };
        Ok(Containerd {
            endpoint: endpoint.into(),
            channel,
            timeout,
            version: version.into(),
        })
    }

    /// containerd's version, as it reports it.
    pub fn version(&self) -> &str {
        &self.version
    }

    fn err(&self, rpc: &str, e: tonic::Status) -> Error {
        status(rpc, &self.endpoint, e)
    }

    /// Imports the images of `path` (an OCI layout, an OCI archive or a `docker save` tar,
    /// plain, gzip or zstd), staging it under `scratch`; with `pinned`, the image records get
    /// the pinned label. An archive that is not a valid image fails with `InvalidArgument`
    /// (its message names the file) and leaves nothing in containerd but blobs its garbage
    /// collector removes; containerd's own failures keep their codes.
    pub async fn import(
        &self,
        path: &Path,
        scratch: &Path,
        pinned: bool,
    ) -> Result<Vec<ImportedImage>> {
        let (p, s) = (path.to_path_buf(), scratch.to_path_buf());
        let archive = tokio::task::spawn_blocking(move || images::Archive::read(&p, &s))
            .await
            .map_err(|e| Error::internal(format!("reading {}: {e}", path.display())))?
            .map_err(|e| Error::invalid_argument(e.to_string()))?;
        if let Some(img) = archive.images().iter().find(|i| i.names.is_empty()) {
            return Err(Error::invalid_argument(format!(
                "{}: image {} has no name (no RepoTags, no io.containerd.image.name \
                 annotation); containerd keeps named images only",
                path.display(),
                img.id
            )));
        }
        let lease = self.create_lease().await?;
        let result = self.import_archive(&archive, &lease, pinned).await;
        if let Err(e) = self.delete_lease(&lease).await {
            tracing::warn!("image import: removing containerd lease {lease}: {e}");
        }
        result
    }

    async fn import_archive(
        &self,
        archive: &images::Archive,
        lease: &str,
        pinned: bool,
    ) -> Result<Vec<ImportedImage>> {
        let mut written = BTreeSet::new();
        let mut out = Vec::new();
        for img in archive.images() {
            for blob in &img.blobs {
                if written.insert(blob.digest.clone()) {
                    let file = archive
                        .blob_path(&blob.digest)
                        .map_err(|e| Error::internal(e.to_string()))?;
                    self.put_blob(blob, &file, lease).await?;
                }
            }
            let records: Vec<String> = img.names.iter().chain(&img.repo_digests).cloned().collect();
            for name in &records {
                self.put_image(name, &img.target, pinned).await?;
            }
            out.push(ImportedImage {
                id: img.id.clone(),
                names: img.names.clone(),
                records,
            });
        }
        Ok(out)
    }

    async fn create_lease(&self) -> Result<String> {
        let now = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap_or_default();
        let id = format!("nodelet-import-{}", now.as_nanos());
        let expire = chrono::Utc::now()
            + chrono::Duration::from_std(LEASE_EXPIRY).unwrap_or(chrono::Duration::hours(1));
        let req = CreateLeaseRequest {
            id: id.clone(),
            labels: [(
                "containerd.io/gc.expire".to_string(),
                expire.to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
            )]
            .into(),
        };
        let mut client = LeasesClient::new(self.channel.clone());
        self.deadline("Leases.Create", client.create(namespaced(req)))
            .await?;
        Ok(id)
    }

    async fn delete_lease(&self, id: &str) -> Result<()> {
        let req = DeleteLeaseRequest {
            id: id.to_string(),
            sync: false,
        };
        let mut client = LeasesClient::new(self.channel.clone());
        self.deadline("Leases.Delete", client.delete(namespaced(req)))
            .await
            .map(|_| ())
    }

    async fn deadline<T>(
        &self,
        rpc: &str,
        call: impl Future<Output = std::result::Result<tonic::Response<T>, tonic::Status>>,
    ) -> Result<T> {
        match tokio::time::timeout(self.timeout, call).await {
            Err(_) => Err(Error::deadline_exceeded(format!(
                "containerd at {}: {rpc} did not answer within {:?}",
                self.endpoint, self.timeout
            ))),
            Ok(Err(e)) => Err(self.err(rpc, e)),
            Ok(Ok(r)) => Ok(r.into_inner()),
        }
    }

    /// Writes one blob (unless containerd has it) with the labels naming its children; a blob
    /// containerd already has gets the labels added.
    async fn put_blob(&self, blob: &images::ArchiveBlob, file: &Path, lease: &str) -> Result<()> {
        let labels = gc_labels(blob);
        let mut content = ContentClient::new(self.channel.clone());
        let info = InfoRequest {
            digest: blob.digest.clone(),
        };
        match tokio::time::timeout(self.timeout, content.info(leased(info, lease))).await {
            Err(_) => {
                return Err(Error::deadline_exceeded(format!(
                    "containerd at {}: Content.Info did not answer within {:?}",
                    self.endpoint, self.timeout
                )));
            }
            Ok(Ok(_)) if labels.is_empty() => return Ok(()),
            Ok(Ok(_)) => {
                let req = UpdateContentRequest {
                    info: Some(ContentInfo {
                        digest: blob.digest.clone(),
                        labels: labels.clone().into_iter().collect(),
                        ..Default::default()
                    }),
                    update_mask: Some(prost_types::FieldMask {
                        paths: labels.keys().map(|k| format!("labels.{k}")).collect(),
                    }),
                };
                self.deadline("Content.Update", content.update(leased(req, lease)))
                    .await?;
                return Ok(());
            }
            Ok(Err(e)) if e.code() == tonic::Code::NotFound => {}
            Ok(Err(e)) => return Err(self.err("Content.Info", e)),
        }
        self.write_blob(blob, file, lease, labels).await
    }

    async fn write_blob(
        &self,
        blob: &images::ArchiveBlob,
        file: &Path,
        lease: &str,
        labels: BTreeMap<String, String>,
    ) -> Result<()> {
        let io = |e: std::io::Error| Error::internal(format!("reading {}: {e}", file.display()));
        let mut f = tokio::fs::File::open(file).await.map_err(io)?;
        let (tx, rx) = tokio::sync::mpsc::channel::<WriteContentRequest>(1);
        let mut content = ContentClient::new(self.channel.clone());
        let stream = tokio_stream::wrappers::ReceiverStream::new(rx);
        let reference = format!("nodelet-import-{}", blob.digest);
        let total = blob.size as i64;
        let base = WriteContentRequest {
            r#ref: reference,
            total,
            expected: blob.digest.clone(),
            ..Default::default()
        };
        let send = |req: WriteContentRequest| {
            let tx = tx.clone();
            async move {
                tx.send(req)
                    .await
                    .map_err(|_| Error::unavailable("containerd closed the content write"))
            }
        };
        // Stat first: a write an earlier import left unfinished goes on where it stopped.
        send(WriteContentRequest {
            action: WriteAction::Stat as i32,
            ..base.clone()
        })
        .await?;
        let mut responses = self
            .deadline("Content.Write", content.write(leased(stream, lease)))
            .await?;
        let mut next = async || -> Result<containerd_client::services::v1::WriteContentResponse> {
            match tokio::time::timeout(self.timeout, responses.message()).await {
                Err(_) => Err(Error::deadline_exceeded(format!(
                    "containerd at {}: Content.Write did not answer within {:?}",
                    self.endpoint, self.timeout
                ))),
                Ok(Err(e)) => Err(self.err("Content.Write", e)),
                Ok(Ok(None)) => Err(Error::unavailable(format!(
                    "containerd at {}: Content.Write ended early",
                    self.endpoint
                ))),
                Ok(Ok(Some(r))) => Ok(r),
            }
        };
        let mut offset = next().await?.offset.clamp(0, total);
        f.seek(std::io::SeekFrom::Start(offset as u64))
            .await
            .map_err(io)?;
        let mut buf = vec![0u8; CHUNK];
        while offset < total {
            let n = f.read(&mut buf).await.map_err(io)?;
            if n == 0 {
                return Err(Error::internal(format!(
                    "{} ended at {offset} of {total} bytes",
                    file.display()
                )));
            }
            send(WriteContentRequest {
                action: WriteAction::Write as i32,
                offset,
                data: buf[..n].to_vec(),
                ..base.clone()
            })
            .await?;
            offset += n as i64;
            next().await?;
        }
        send(WriteContentRequest {
            action: WriteAction::Commit as i32,
            offset,
            labels: labels.into_iter().collect(),
            ..base.clone()
        })
        .await?;
        match next().await {
            Ok(r) if r.digest == blob.digest || r.digest.is_empty() => Ok(()),
            Ok(r) => Err(Error::internal(format!(
                "containerd at {}: committed {} as {}",
                self.endpoint, blob.digest, r.digest
            ))),
            // Another import committed it meanwhile.
            Err(e) if e.code() == Code::AlreadyExists => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// Creates or updates the image record `name` to point at `target`.
    async fn put_image(
        &self,
        name: &str,
        target: &images::ArchiveBlob,
        pinned: bool,
    ) -> Result<()> {
        let mut labels = BTreeMap::from([(MANAGED_LABEL.to_string(), "managed".to_string())]);
        if pinned {
            labels.insert(PINNED_LABEL.to_string(), PINNED_VALUE.to_string());
        }
        let image = ImageRecord {
            name: name.to_string(),
            labels: labels.clone().into_iter().collect(),
            target: Some(Descriptor {
                media_type: target.media_type.clone(),
                digest: target.digest.clone(),
                size: target.size as i64,
                ..Default::default()
            }),
            ..Default::default()
        };
        let mut client = ImagesClient::new(self.channel.clone());
        let create = CreateImageRequest {
            image: Some(image.clone()),
            ..Default::default()
        };
        match tokio::time::timeout(self.timeout, client.create(namespaced(create))).await {
            Ok(Ok(_)) => return Ok(()),
            Ok(Err(e)) if e.code() == tonic::Code::AlreadyExists => {}
            Ok(Err(e)) => return Err(self.err("Images.Create", e)),
            Err(_) => {
                return Err(Error::deadline_exceeded(format!(
                    "containerd at {}: Images.Create did not answer within {:?}",
                    self.endpoint, self.timeout
                )));
            }
        }
        let mut paths = vec!["target".to_string()];
        paths.extend(labels.keys().map(|k| format!("labels.{k}")));
        let update = UpdateImageRequest {
            image: Some(image),
            update_mask: Some(prost_types::FieldMask { paths }),
            ..Default::default()
        };
        self.deadline("Images.Update", client.update(namespaced(update)))
            .await
            .map(|_| ())
    }

    /// Sets or clears the pinned label of the image record `name`; `false` when containerd
    /// has no such record.
    pub async fn set_pinned(&self, name: &str, pinned: bool) -> Result<bool> {
        let mut client = ImagesClient::new(self.channel.clone());
        let get = GetImageRequest {
            name: name.to_string(),
        };
        match tokio::time::timeout(self.timeout, client.get(namespaced(get))).await {
            Ok(Ok(_)) => {}
            Ok(Err(e)) if e.code() == tonic::Code::NotFound => return Ok(false),
            Ok(Err(e)) => return Err(self.err("Images.Get", e)),
            Err(_) => {
                return Err(Error::deadline_exceeded(format!(
                    "containerd at {}: Images.Get did not answer within {:?}",
                    self.endpoint, self.timeout
                )));
            }
        }
        let mut labels = std::collections::HashMap::new();
        if pinned {
            labels.insert(PINNED_LABEL.to_string(), PINNED_VALUE.to_string());
        }
        let update = UpdateImageRequest {
            image: Some(ImageRecord {
                name: name.to_string(),
                labels,
                ..Default::default()
            }),
            update_mask: Some(prost_types::FieldMask {
                paths: vec![format!("labels.{PINNED_LABEL}")],
            }),
            ..Default::default()
        };
        match self
            .deadline("Images.Update", client.update(namespaced(update)))
            .await
        {
            Ok(_) => Ok(true),
            Err(e) if e.code() == Code::NotFound => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Whether the image record `name` carries the pinned label.
    pub async fn is_pinned(&self, name: &str) -> Result<Option<bool>> {
        let mut client = ImagesClient::new(self.channel.clone());
        let get = GetImageRequest {
            name: name.to_string(),
        };
        match self
            .deadline("Images.Get", client.get(namespaced(get)))
            .await
        {
            Ok(r) => Ok(r.image.map(|i| {
                i.labels
                    .get(PINNED_LABEL)
                    .is_some_and(|v| v == PINNED_VALUE)
            })),
            Err(e) if e.code() == Code::NotFound => Ok(None),
            Err(e) => Err(e),
        }
    }
}

/// containerd's garbage-collection labels naming a blob's children, as its importer sets them.
fn gc_labels(blob: &images::ArchiveBlob) -> BTreeMap<String, String> {
    let mut labels = BTreeMap::new();
    let (mut manifests, mut layers) = (0, 0);
    for (kind, digest) in &blob.children {
        let key = match kind {
            images::ChildKind::Config => "containerd.io/gc.ref.content.config".to_string(),
            images::ChildKind::Layer => {
                layers += 1;
                format!("containerd.io/gc.ref.content.l.{}", layers - 1)
            }
            images::ChildKind::Manifest => {
                manifests += 1;
                format!("containerd.io/gc.ref.content.m.{}", manifests - 1)
            }
        };
        labels.insert(key, digest.clone());
    }
    labels
}

/// A request in the CRI plugin's namespace.
fn namespaced<T>(msg: T) -> tonic::Request<T> {
    let mut req = tonic::Request::new(msg);
    req.metadata_mut().insert(
        "containerd-namespace",
        tonic::metadata::MetadataValue::from_static(NAMESPACE),
    );
    req
}

/// A request in the CRI plugin's namespace, under `lease`.
fn leased<T>(msg: T, lease: &str) -> tonic::Request<T> {
    let mut req = namespaced(msg);
    if let Ok(v) = tonic::metadata::MetadataValue::try_from(lease) {
        req.metadata_mut().insert("containerd-lease", v);
    }
    req
}

/// The scratch dir an import stages in, under a root dir.
pub fn scratch_dir(root_dir: &Path) -> PathBuf {
    root_dir.join("containerd-import")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gc_labels_follow_containerds_naming() {
        let blob = images::ArchiveBlob {
            digest: "sha256:m".into(),
            size: 1,
            media_type: "x".into(),
            children: vec![
                (images::ChildKind::Config, "sha256:c".into()),
                (images::ChildKind::Layer, "sha256:l0".into()),
                (images::ChildKind::Layer, "sha256:l1".into()),
            ],
        };
        let labels = gc_labels(&blob);
        assert_eq!(labels["containerd.io/gc.ref.content.config"], "sha256:c");
        assert_eq!(labels["containerd.io/gc.ref.content.l.0"], "sha256:l0");
        assert_eq!(labels["containerd.io/gc.ref.content.l.1"], "sha256:l1");
        assert_eq!(labels.len(), 3);
        let index = images::ArchiveBlob {
            children: vec![(images::ChildKind::Manifest, "sha256:m".into())],
            ..blob
        };
        assert_eq!(
            gc_labels(&index),
            BTreeMap::from([("containerd.io/gc.ref.content.m.0".into(), "sha256:m".into())])
        );
    }
}
