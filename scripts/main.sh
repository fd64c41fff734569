#!/usr/bin/env bash
# The main job on a fresh machine: install what is needed, build nodelet, build a busybox image
# from Debian's packages and import it (air-gapped style), then start a standalone node with the
# built-in runtime (no cluster, no containerd, no CNI) running a static pod: a busybox httpd on
# the pod network (bridge nodelet0, 10.88.0.0/16), published on the node's port 8080 (a hostPort)
# that you can curl. Needs root. The node keeps running in the background;
# the script prints how to look at it and how to stop it.
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/setup.sh
cargo build --release
NODELET=$PWD/target/release/nodelet
ROOT=${NODELET_ROOT:-/var/lib/nodelet}
ETC=${NODELET_ETC:-/etc/nodelet}
PORT=${NODELET_DEMO_PORT:-8080}

bash scripts/build-busybox-image.sh target/busybox-oci.tar
"$NODELET" --root-dir "$ROOT" images import target/busybox-oci.tar

mkdir -p "$ETC/manifests"
cat > "$ETC/config.yaml" <<YAML
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
staticPodPath: $ETC/manifests
fileCheckFrequency: 5s
# Standalone: no API server to review tokens or access, so only client certificates signed by
# a CA given as authentication.x509.clientCAFile could use the kubelet API on 10250.
authentication:
  webhook: {enabled: false}
authorization:
  mode: AlwaysAllow
YAML
cat > "$ETC/manifests/web.yaml" <<YAML
apiVersion: v1
kind: Pod
metadata:
  name: web
spec:
  terminationGracePeriodSeconds: 5
  containers:
  - name: httpd
    image: docker.io/library/busybox:latest
    imagePullPolicy: Never
    command: ["sh", "-c", "mkdir -p /www && echo \"hello from a nodelet static pod at \$(hostname -i)\" > /www/index.html && exec httpd -f -p 80 -h /www"]
    ports:
    - containerPort: 80
      hostPort: $PORT
YAML

if pgrep -f "nodelet --root-dir $ROOT run-node" >/dev/null; then
  echo "a nodelet node is already running for $ROOT"
else
  nohup "$NODELET" --root-dir "$ROOT" run-node --config "$ETC/config.yaml" >"$ROOT/node.log" 2>&1 &
  echo "started the node (pid $!), log: $ROOT/node.log"
fi
for _ in $(seq 1 60); do
  curl -fsS "http://127.0.0.1:$PORT/" && break
  sleep 1
done
"$NODELET" --root-dir "$ROOT" pods
cat <<TXT

The node runs the static pods in $ETC/manifests (add, edit or delete manifests there).
  curl http://127.0.0.1:$PORT/                      # the pod's page, through its hostPort
  ip addr show nodelet0                             # the pods' bridge (pods get 10.88.x.y)
  $NODELET --root-dir $ROOT pods      # what runs
  ls /var/log/pods/                                 # container logs, as the upstream kubelet lays them out
  pkill -f 'nodelet --root-dir $ROOT run-node'      # stop the node agent (pods keep running; a restart adopts them)
TXT
