//! The ImageService RPCs over the `images` store.

use super::{BuiltinRuntime, image_error};
use crate::{Error, Result, cri};

/// A CRI image from a store image.
fn cri_image(img: &images::Image) -> cri::Image {
    let user = img.config.user.clone().unwrap_or_default();
    let name = user.split(':').next().unwrap_or("").to_string();
    let (uid, username) = match name.parse::<i64>() {
        Ok(n) => (Some(cri::Int64Value { value: n }), String::new()),
        Err(_) if name.is_empty() => (Some(cri::Int64Value { value: 0 }), String::new()),
        Err(_) => (None, name),
    };
    cri::Image {
        id: img.id.clone(),
        repo_tags: img.repo_tags.clone(),
        repo_digests: img.repo_digests.clone(),
        size: img.size,
        uid,
        username,
        spec: Some(cri::ImageSpec {
            image: img.id.clone(),
            ..Default::default()
        }),
        pinned: img.pinned,
    }
}

fn image_name(spec: Option<&cri::ImageSpec>) -> Result<String> {
    let name = spec.map(|s| s.image.trim().to_string()).unwrap_or_default();
    if name.is_empty() {
        return Err(Error::invalid_argument("an image name is required"));
    }
    Ok(name)
}

impl BuiltinRuntime {
    pub(super) fn list_images(&self, filter: Option<cri::ImageFilter>) -> Result<Vec<cri::Image>> {
        let want = filter
            .and_then(|f| f.image)
            .map(|i| i.image)
            .filter(|s| !s.is_empty());
        if let Some(want) = want {
            return Ok(self
                .inner
                .images
                .resolve(&want)
                .map_err(image_error)?
                .iter()
                .map(cri_image)
                .collect());
        }
        Ok(self
            .inner
            .images
            .list()
            .map_err(image_error)?
            .iter()
            .map(cri_image)
            .collect())
    }

    pub(super) fn image_status(
        &self,
        req: cri::ImageStatusRequest,
    ) -> Result<cri::ImageStatusResponse> {
        let name = image_name(req.image.as_ref())?;
        let img = match self.inner.images.resolve(&name) {
            Ok(img) => img,
            Err(e) if e.kind() == images::Kind::InvalidArgument => {
                return Err(image_error(e));
            }
            Err(e) => return Err(image_error(e)),
        };
        let mut info = std::collections::HashMap::new();
        if req.verbose {
            if let Some(img) = &img {
                let detail = serde_json::json!({
                    "manifestDigest": img.manifest_digest,
                    "layers": img.layers,
                    "config": img.config,
                });
                info.insert("info".to_string(), detail.to_string());
            }
        }
        Ok(cri::ImageStatusResponse {
            image: img.as_ref().map(cri_image),
            info,
        })
    }

    pub(super) async fn pull(&self, req: cri::PullImageRequest) -> Result<String> {
        let name = image_name(req.image.as_ref())?;
        let auth = req.auth.map(auth_from_cri).unwrap_or_default();
        let img = self
            .inner
            .images
            .pull(&name, &auth, &self.inner.cfg.registry)
            .await
            .map_err(image_error)?;
        Ok(img.id)
    }

    pub(super) async fn remove_image(&self, req: cri::RemoveImageRequest) -> Result<()> {
        let name = image_name(req.image.as_ref())?;
        // A container removed just before may still hold the image until its rootfs is gone.
        self.releases_done().await;
        match self.inner.images.remove(&name) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == images::Kind::NotFound => Ok(()),
            Err(e) => Err(image_error(e)),
        }
    }

    pub(super) fn image_fs(&self) -> Result<cri::ImageFsInfoResponse> {
        let info = self.inner.images.fs_info().map_err(image_error)?;
        let usage = cri::FilesystemUsage {
            timestamp: sandbox::now_ns(),
            fs_id: Some(cri::FilesystemIdentifier {
                mountpoint: info.mountpoint.to_string_lossy().into_owned(),
            }),
            used_bytes: Some(cri::UInt64Value {
                value: info.used_bytes,
            }),
            inodes_used: Some(cri::UInt64Value {
                value: info.inodes_used,
            }),
        };
        Ok(cri::ImageFsInfoResponse {
            image_filesystems: vec![usage.clone()],
            container_filesystems: vec![usage],
        })
    }
}

/// Registry credentials from a CRI AuthConfig (`auth` is base64 "user:password").
fn auth_from_cri(a: cri::AuthConfig) -> images::RegistryAuth {
    let (mut username, mut password) = (a.username, a.password);
    if username.is_empty() && !a.auth.is_empty() {
        if let Some((u, p)) = decode_basic(&a.auth) {
            username = u;
            password = p;
        }
    }
    let opt = |s: String| (!s.is_empty()).then_some(s);
    images::RegistryAuth {
        username: opt(username),
        password: opt(password),
        identity_token: opt(a.identity_token),
        registry_token: opt(a.registry_token),
    }
}

/// Decodes standard base64 "user:password".
fn decode_basic(s: &str) -> Option<(String, String)> {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut bits: u32 = 0;
    let mut n = 0;
    let mut out = Vec::new();
    for c in s.trim_end_matches('=').bytes() {
        let v = ALPHABET.iter().position(|a| *a == c)? as u32;
        bits = (bits << 6) | v;
        n += 6;
        if n >= 8 {
            n -= 8;
            out.push((bits >> n) as u8);
            bits &= (1 << n) - 1;
        }
    }
    let text = String::from_utf8(out).ok()?;
    let (u, p) = text.split_once(':')?;
    Some((u.to_string(), p.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn basic_auth_decodes() {
        assert_eq!(
            decode_basic("dXNlcjpwYXNz"),
            Some(("user".to_string(), "pass".to_string()))
        );
        assert_eq!(decode_basic("!!"), None);
        let a = auth_from_cri(cri::AuthConfig {
            auth: "dXNlcjpwYXNz".into(),
            ..Default::default()
        });
        assert_eq!(a.username.as_deref(), Some("user"));
        assert_eq!(a.password.as_deref(), Some("pass"));
    }
}
