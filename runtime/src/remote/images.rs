//! [`ImageService`] for [`RemoteRuntime`]: each method is the same RPC on the runtime's
//! `runtime.v1.ImageService`; `PullImage` has its own, longer deadline.

use super::{RemoteRuntime, unary};
use crate::{ImageService, Result, cri};

#[async_trait::async_trait]
impl ImageService for RemoteRuntime {
    async fn list_images(&self, req: cri::ListImagesRequest) -> Result<cri::ListImagesResponse> {
        let deadline = self.deadline(0);
        let req = self.request("ListImages", req, deadline)?;
        unary("ListImages", deadline, self.images.clone().list_images(req)).await
    }

    async fn image_status(&self, req: cri::ImageStatusRequest) -> Result<cri::ImageStatusResponse> {
        let deadline = self.deadline(0);
        let req = self.request("ImageStatus", req, deadline)?;
        unary(
            "ImageStatus",
            deadline,
            self.images.clone().image_status(req),
        )
        .await
    }

    async fn pull_image(&self, req: cri::PullImageRequest) -> Result<cri::PullImageResponse> {
        let deadline = Some(self.cfg.pull_image_timeout);
        let req = self.request("PullImage", req, deadline)?;
        unary("PullImage", deadline, self.images.clone().pull_image(req)).await
    }

    async fn remove_image(&self, req: cri::RemoveImageRequest) -> Result<cri::RemoveImageResponse> {
        let deadline = self.deadline(0);
        let req = self.request("RemoveImage", req, deadline)?;
        unary(
            "RemoveImage",
            deadline,
            self.images.clone().remove_image(req),
        )
        .await
    }

    async fn image_fs_info(
        &self,
        req: cri::ImageFsInfoRequest,
    ) -> Result<cri::ImageFsInfoResponse> {
        let deadline = self.deadline(0);
        let req = self.request("ImageFsInfo", req, deadline)?;
        unary(
            "ImageFsInfo",
            deadline,
            self.images.clone().image_fs_info(req),
        )
        .await
    }
}
