//! [`ImageService`] for [`FakeRuntime`].
//!
//! Nothing is downloaded. An image is a record whose id is a deterministic
//! fake digest (`"sha256:"` + 64 hex characters) of its normalised reference,
//! so pulling the same reference twice yields the same id. References are
//! normalised only by adding `:latest` to a reference with neither tag nor
//! digest (no registry or `library/` defaulting). An image is found by its
//! id (with or without `sha256:`), by a repo tag or by a repo digest.

use std::hash::{DefaultHasher, Hash, Hasher};

use super::{FAKE_IMAGE_SIZE, FakeRuntime, now_ns};
use crate::cri;
use crate::error::{Error, Result};
use crate::service::ImageService;

/// The mount point reported by `ImageFsInfo`.
pub const FAKE_IMAGE_FS_MOUNTPOINT: &str = "/var/lib/fake-runtime/images";

#[async_trait::async_trait]
impl ImageService for FakeRuntime {
    async fn list_images(&self, req: cri::ListImagesRequest) -> Result<cri::ListImagesResponse> {
        let st = self.begin("ListImages")?;
        let wanted = req
            .filter
            .and_then(|f| f.image)
            .map(|spec| spec.image)
            .unwrap_or_default();
        let images = st
            .images
            .iter()
            .filter(|img| wanted.is_empty() || matches(img, &wanted))
            .cloned()
            .collect();
        Ok(cri::ListImagesResponse { images })
    }

    async fn image_status(&self, req: cri::ImageStatusRequest) -> Result<cri::ImageStatusResponse> {
        let st = self.begin("ImageStatus")?;
        let spec = required_spec(req.image)?;
        Ok(cri::ImageStatusResponse {
            image: find(&st.images, &spec.image).cloned(),
            info: Default::default(),
        })
    }

    async fn pull_image(&self, req: cri::PullImageRequest) -> Result<cri::PullImageResponse> {
        let held = {
            let st = self.begin("PullImage")?;
            let spec = required_spec(req.image.clone())?;
            st.held_pulls.get(&spec.image).map(|h| h.subscribe())
        };
        if let Some(mut released) = held {
            let _ = released.wait_for(|r| *r).await;
        }
        let mut st = self.lock();
        let spec = required_spec(req.image)?;
        if let Some(img) = find(&st.images, &spec.image) {
            return Ok(cri::PullImageResponse {
                image_ref: img.id.clone(),
            });
        }
        let mut img = make_image(&spec.image);
        img.spec = Some(spec);
        let image_ref = img.id.clone();
        st.images.push(img);
        Ok(cri::PullImageResponse { image_ref })
    }

    async fn remove_image(&self, req: cri::RemoveImageRequest) -> Result<cri::RemoveImageResponse> {
        let mut st = self.begin("RemoveImage")?;
        let spec = required_spec(req.image)?;
        st.images.retain(|img| !matches(img, &spec.image));
        Ok(cri::RemoveImageResponse {})
    }

    async fn image_fs_info(
        &self,
        _req: cri::ImageFsInfoRequest,
    ) -> Result<cri::ImageFsInfoResponse> {
        let st = self.begin("ImageFsInfo")?;
        let used: u64 = st.images.iter().map(|i| i.size).sum();
        let inodes = u64::try_from(st.images.len()).unwrap_or(u64::MAX);
        Ok(cri::ImageFsInfoResponse {
            image_filesystems: vec![cri::FilesystemUsage {
                timestamp: now_ns(),
                fs_id: Some(cri::FilesystemIdentifier {
                    mountpoint: FAKE_IMAGE_FS_MOUNTPOINT.to_string(),
                }),
                used_bytes: Some(cri::UInt64Value { value: used }),
                inodes_used: Some(cri::UInt64Value { value: inodes }),
            }],
            container_filesystems: Vec::new(),
        })
    }
}

/// The image spec of a request, which must name an image.
fn required_spec(spec: Option<cri::ImageSpec>) -> Result<cri::ImageSpec> {
    match spec {
        Some(spec) if !spec.image.is_empty() => Ok(spec),
        _ => Err(Error::invalid_argument(
            "image spec with a non-empty image is required",
        )),
    }
}

/// The image record for `reference`.
pub(crate) fn make_image(reference: &str) -> cri::Image {
    let reference = normalize(reference);
    let id = fake_digest(&reference);
    let (repo_tags, repo_digests) = match reference.split_once('@') {
        Some(_) => (Vec::new(), vec![reference.clone()]),
        None => {
            let repo = reference
                .rsplit_once(':')
                .map_or(reference.as_str(), |(repo, _)| repo);
            (vec![reference.clone()], vec![format!("{repo}@{id}")])
        }
    };
    cri::Image {
        id,
        repo_tags,
        repo_digests,
        size: FAKE_IMAGE_SIZE,
        uid: None,
        username: String::new(),
        spec: Some(cri::ImageSpec {
            image: reference,
            ..Default::default()
        }),
        pinned: false,
    }
}

/// The first image that `name` refers to.
pub(crate) fn find<'a>(images: &'a [cri::Image], name: &str) -> Option<&'a cri::Image> {
    images.iter().find(|img| matches(img, name))
}

/// Whether `name` (id, tag reference or digest reference) refers to `img`.
fn matches(img: &cri::Image, name: &str) -> bool {
    if name.is_empty() {
        return false;
    }
    let id_hex = img.id.strip_prefix("sha256:").unwrap_or(&img.id);
    if img.id == name || id_hex == name {
        return true;
    }
    let normalized = normalize(name);
    img.repo_tags.contains(&normalized) || img.repo_digests.iter().any(|d| d == name)
}

/// Adds `:latest` to a reference with neither tag nor digest.
fn normalize(reference: &str) -> String {
    let last = reference.rsplit('/').next().unwrap_or(reference);
    if reference.contains('@') || last.contains(':') || looks_like_id(reference) {
        reference.to_string()
    } else {
        format!("{reference}:latest")
    }
}

/// Whether `s` is a bare 64-hex image id.
fn looks_like_id(s: &str) -> bool {
    s.len() == 64 && s.bytes().all(|b| b.is_ascii_hexdigit())
}

/// `"sha256:"` followed by 64 hex characters derived from `reference`.
/// Deterministic within a build (not a real SHA-256).
fn fake_digest(reference: &str) -> String {
    let mut out = String::from("sha256:");
    for salt in 0u8..4 {
        let mut h = DefaultHasher::new();
        (reference, salt).hash(&mut h);
        out.push_str(&format!("{:016x}", h.finish()));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn normalize_adds_latest_only_when_needed() {
        assert_eq!(normalize("busybox"), "busybox:latest");
        assert_eq!(normalize("busybox:1.36"), "busybox:1.36");
        assert_eq!(normalize("localhost:5000/app"), "localhost:5000/app:latest");
        assert_eq!(normalize("repo/app@sha256:abc"), "repo/app@sha256:abc");
    }

    #[test]
    fn image_ids_are_deterministic_digests() {
        let a = make_image("busybox");
        let b = make_image("busybox:latest");
        assert_eq!(a.id, b.id);
        assert!(a.id.starts_with("sha256:"));
        assert_eq!(a.id.len(), "sha256:".len() + 64);
        assert_ne!(a.id, make_image("nginx").id);
        assert_eq!(a.repo_tags, vec!["busybox:latest".to_string()]);
        assert_eq!(a.repo_digests, vec![format!("busybox@{}", a.id)]);
    }

    #[test]
    fn find_by_id_tag_and_digest() {
        let images = vec![make_image("busybox"), make_image("repo/app@sha256:abc")];
        let id = images[0].id.clone();
        assert_eq!(find(&images, &id).map(|i| &i.id), Some(&id));
        assert_eq!(
            find(&images, id.trim_start_matches("sha256:")).map(|i| &i.id),
            Some(&id)
        );
        assert!(find(&images, "busybox").is_some());
        assert!(find(&images, "busybox:latest").is_some());
        assert!(find(&images, "busybox:1.0").is_none());
        assert!(find(&images, "repo/app@sha256:abc").is_some());
        assert!(find(&images, "").is_none());
    }
}
