//! nodelet: the kubelet.
