#!/usr/bin/env python3
"""Writes the checked-in seed corpus of the fuzz targets (tests/fuzz/corpus/<target>/).

Run by hand after changing a seed (`python3 tests/fuzz/seeds.py`); the fuzz script never runs
it and never adds to the checked-in corpus. Every seed is small and meaningful: real
manifests and configurations, real protocol frames, real image archives, and the malicious
layer tars the unpacker must refuse or confine (`../` paths, absolute paths, a symlink then a
write through it, hard links to outside, device nodes, huge and PAX headers). Crash inputs
found by fuzzing are added under their target as `regression-*` by hand.
"""

import gzip
import hashlib
import io
import json
import os
import re
import shutil
import struct
import tarfile
import zlib

HERE = os.path.dirname(os.path.abspath(__file__))
CORPUS = os.path.join(HERE, "corpus")
REPO = os.path.dirname(os.path.dirname(HERE))


def put(target, name, data):
    d = os.path.join(CORPUS, target)
    os.makedirs(d, exist_ok=True)
    if isinstance(data, str):
        data = data.encode()
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


def clean(target):
    """Removes a target's generated seeds, keeping the regression inputs."""
    d = os.path.join(CORPUS, target)
    if os.path.isdir(d):
        for name in os.listdir(d):
            if not name.startswith("regression-"):
                os.remove(os.path.join(d, name))


# ---------------------------------------------------------------- KubeletConfiguration

def config_seeds():
    t = "config"
    clean(t)
    put(t, "standalone.yaml", """apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
staticPodPath: /etc/nodelet/manifests
fileCheckFrequency: 5s
authentication:
  webhook: {enabled: false}
authorization:
  mode: AlwaysAllow
""")
    put(t, "full.yaml", """apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
staticPodPath: /etc/kubernetes/manifests
staticPodURL: http://127.0.0.1:8081/pods
syncFrequency: 1m0s
fileCheckFrequency: 20s
httpCheckFrequency: 20s
nodeStatusUpdateFrequency: 10s
nodeStatusReportFrequency: 5m
nodeLeaseDurationSeconds: 40
maxPods: 110
podPidsLimit: -1
podLogsDir: /var/log/pods
containerRuntimeEndpoint: unix:///run/containerd/containerd.sock
imageServiceEndpoint: unix:///run/containerd/containerd.sock
cgroupRoot: /
cgroupsPerQOS: true
clusterDNS: [10.96.0.10, "fd00::a"]
clusterDomain: cluster.local
registerNode: true
evictionHard:
  memory.available: 100Mi
  nodefs.available: 10%
  imagefs.available: 15%
serializeImagePulls: false
maxParallelImagePulls: 5
podCIDR: 10.88.0.0/16
nodeletPodBridge: nodelet0
nodeletPodMasquerade: true
nodeletInsecureRegistries: ["127.0.0.1:5000"]
nodeletTesting:
  crashLoopBackOffInitial: 10ms
  crashLoopBackOffMax: 1h30m
address: 0.0.0.0
port: 10250
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: 10248
tlsCertFile: /etc/nodelet/pki/kubelet.crt
tlsPrivateKeyFile: /etc/nodelet/pki/kubelet.key
enableSystemLogHandler: true
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true, cacheTTL: 2m}
  x509: {clientCAFile: /etc/kubernetes/pki/ca.crt}
authorization:
  mode: Webhook
  webhook: {cacheAuthorizedTTL: 5m, cacheUnauthorizedTTL: 30s}
containerLogMaxSize: 10Mi
containerLogMaxFiles: 5
containerLogMonitorInterval: 10s
unknownField: {nested: [1, 2, 3]}
""")
    put(t, "json.json", json.dumps({
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "staticPodPath": "/etc/nodelet/manifests",
        "clusterDNS": ["10.0.0.10", "not-an-ip"],
        "maxPods": "110",
        "evictionHard": {"memory.available": "1.5Gi", "nodefs.inodesFree": "5%"},
    }))
    put(t, "wrong-kind.yaml", "apiVersion: v1\nkind: Pod\n")
    # Durations at the edge of the parser's u128 nanoseconds.
    put(t, "huge-durations.yaml", """apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
syncFrequency: 340282366920938463463374607431.999999999s
fileCheckFrequency: 94522879700260684295381835h
httpCheckFrequency: 18446744073709551615s
""")
    put(t, "anchors.yaml", """apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
a: &a [x, x, x]
b: &b [*a, *a, *a]
c: [*b, *b, *b]
syncFrequency: 1h2m3.5s
""")


# ---------------------------------------------------------------- static pod manifests

def manifest_seeds():
    t = "manifest"
    clean(t)
    put(t, "web.yaml", """apiVersion: v1
kind: Pod
metadata:
  name: web
spec:
  terminationGracePeriodSeconds: 5
  containers:
  - name: httpd
    image: docker.io/library/busybox:latest
    imagePullPolicy: Never
    command: ["sh", "-c", "exec httpd -f -p 80 -h /www"]
    ports:
    - containerPort: 80
      hostPort: 8080
""")
    put(t, "full.yaml", """apiVersion: v1
kind: Pod
metadata:
  name: app.example
  namespace: kube-system
  labels: {app: demo, tier: backend}
  annotations: {note: "static"}
spec:
  hostNetwork: false
  shareProcessNamespace: true
  hostUsers: false
  dnsPolicy: None
  dnsConfig:
    nameservers: [1.1.1.1]
    searches: [svc.cluster.local]
    options: [{name: ndots, value: "2"}]
  nodeSelector: {kubernetes.io/os: linux}
  securityContext:
    runAsUser: 1000
    runAsGroup: 3000
    fsGroup: 2000
    supplementalGroups: [4000]
    sysctls: [{name: net.ipv4.ip_unprivileged_port_start, value: "0"}]
    seccompProfile: {type: RuntimeDefault}
  initContainers:
  - name: init
    image: busybox:1.36
    command: [sh, -c, "echo init"]
  - name: sidecar
    image: busybox
    restartPolicy: Always
    startupProbe: {exec: {command: ["true"]}, periodSeconds: 1}
  containers:
  - name: main
    image: registry.local:5000/app@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef
    args: ["--name=$(POD_NAME)", "$$(ESCAPED)"]
    env:
    - {name: POD_NAME, valueFrom: {fieldRef: {fieldPath: metadata.name}}}
    - {name: LIMIT, valueFrom: {resourceFieldRef: {resource: limits.memory, divisor: 1Mi}}}
    - {name: PLAIN, value: "x"}
    resources:
      requests: {cpu: 250m, memory: 64Mi, ephemeral-storage: 1Gi}
      limits: {cpu: "1.5", memory: 128Mi, hugepages-2Mi: 4Mi}
    livenessProbe:
      httpGet: {path: /healthz, port: 8080, httpHeaders: [{name: X, value: y}]}
      initialDelaySeconds: 3
    readinessProbe: {tcpSocket: {port: 8080}}
    lifecycle:
      preStop: {sleep: {seconds: 2}}
      postStart: {exec: {command: [sh, -c, date]}}
      stopSignal: SIGUSR1
    securityContext:
      privileged: false
      allowPrivilegeEscalation: false
      readOnlyRootFilesystem: true
      capabilities: {add: [NET_ADMIN], drop: [ALL]}
    volumeMounts:
    - {name: data, mountPath: /data, subPathExpr: $(POD_NAME)}
    - {name: host, mountPath: /host, readOnly: true}
  volumes:
  - {name: data, emptyDir: {medium: Memory, sizeLimit: 64Mi}}
  - {name: host, hostPath: {path: /var/log, type: Directory}}
  tolerations: [{operator: Exists}]
""")
    put(t, "pod.json", json.dumps({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "json-pod", "uid": "1234"},
        "spec": {"restartPolicy": "OnFailure",
                 "containers": [{"name": "c", "image": "busybox",
                                 "ports": [{"containerPort": 53, "hostPort": 5353,
                                            "protocol": "UDP"}]}]},
    }))
    put(t, "duplicate-names.yaml", """apiVersion: v1
kind: Pod
metadata: {name: dup}
spec:
  containers:
  - {name: a, image: x}
  - {name: a, image: y}
""")
    put(t, "not-a-pod.yaml", "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: d}\n")


# ---------------------------------------------------------------- layer tars

def trim(tar):
    """A tar without the padding to 10 KiB records: just the two zero blocks that end it."""
    body = tar.rstrip(b"\0")
    body += b"\0" * (-len(body) % 512)
    return body + b"\0" * 1024


def tar_bytes(build, fmt=tarfile.GNU_FORMAT):
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=fmt) as tar:
        build(tar)
    return trim(buf.getvalue())


def add(tar, name, kind=tarfile.REGTYPE, data=b"", mode=0o644, link="", pax=None,
        devmajor=0, devminor=0, uid=0, gid=0, mtime=1700000000):
    info = tarfile.TarInfo(name)
    info.type = kind
    info.mode = mode
    info.linkname = link
    info.uid, info.gid, info.mtime = uid, gid, mtime
    info.devmajor, info.devminor = devmajor, devminor
    if pax:
        info.pax_headers = pax
    if kind == tarfile.REGTYPE:
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    else:
        tar.addfile(info)


def layer_seeds():
    t = "layer_unpack"
    clean(t)

    def normal(tar):
        add(tar, "./", tarfile.DIRTYPE, mode=0o755)
        add(tar, "etc/", tarfile.DIRTYPE, mode=0o755)
        add(tar, "etc/passwd", data=b"root:x:0:0::/root:/bin/sh\n")
        add(tar, "bin/", tarfile.DIRTYPE, mode=0o755)
        add(tar, "bin/busybox", data=b"\x7fELF", mode=0o4755, uid=1000, gid=1000)
        add(tar, "bin/sh", tarfile.SYMTYPE, link="busybox")
        add(tar, "bin/ls", tarfile.LNKTYPE, link="bin/busybox")
        add(tar, "var/", tarfile.DIRTYPE, mode=0o1777)
        add(tar, "var/.wh.cache", data=b"")
        add(tar, "opt/", tarfile.DIRTYPE)
        add(tar, "opt/.wh..wh..opq", data=b"")
        add(tar, "opt/file", data=b"x", pax={"SCHILY.xattr.user.note": "hello",
                                             "SCHILY.xattr.trusted.overlay.opaque": "y"})
    normal_tar = tar_bytes(normal, tarfile.PAX_FORMAT)
    put(t, "normal.tar", normal_tar)
    put(t, "normal.tar.gz", gzip.compress(normal_tar, mtime=0))

    put(t, "dotdot.tar", tar_bytes(lambda tar: add(tar, "../escaped", data=b"out")))
    put(t, "dotdot-nested.tar", tar_bytes(lambda tar: add(tar, "a/../../escaped", data=b"out")))
    put(t, "absolute.tar", tar_bytes(lambda tar: add(tar, "/canary.txt", data=b"overwritten")))

    def symlink_then_write(tar):
        add(tar, "up", tarfile.SYMTYPE, link="..")
        add(tar, "up/canary.txt", data=b"through the link")
        add(tar, "abs", tarfile.SYMTYPE, link="/tmp")
        add(tar, "abs/escaped", data=b"through the link")
    put(t, "symlink-write.tar", tar_bytes(symlink_then_write))

    def symlink_replaces_dir(tar):
        add(tar, "d/", tarfile.DIRTYPE)
        add(tar, "d", tarfile.SYMTYPE, link="../..")
        add(tar, "d/escaped", data=b"x")
        add(tar, "d/", tarfile.DIRTYPE, mode=0o777)
    put(t, "symlink-replaces-dir.tar", tar_bytes(symlink_replaces_dir))

    def hardlinks(tar):
        add(tar, "out1", tarfile.LNKTYPE, link="../canary.txt")
        add(tar, "out2", tarfile.LNKTYPE, link="/etc/passwd")
        add(tar, "up", tarfile.SYMTYPE, link="..")
        add(tar, "out3", tarfile.LNKTYPE, link="up/canary.txt")
        add(tar, "f", data=b"f")
        add(tar, "same", tarfile.LNKTYPE, link="f")
    put(t, "hardlinks.tar", tar_bytes(hardlinks))

    def symlink_chmod(tar):
        add(tar, "up", tarfile.SYMTYPE, link="..", pax={"SCHILY.xattr.user.x": "y"})
        add(tar, "up", tarfile.DIRTYPE, mode=0o777)
        add(tar, "parentlink", tarfile.SYMTYPE, link="../canary")
        add(tar, "parentlink/", tarfile.DIRTYPE, mode=0o700)
        add(tar, "parentlink/.wh.x", data=b"")
        add(tar, "parentlink/.wh..wh..opq", data=b"")
    put(t, "symlink-metadata.tar", tar_bytes(symlink_chmod, tarfile.PAX_FORMAT))

    def devices(tar):
        add(tar, "dev/", tarfile.DIRTYPE)
        add(tar, "dev/null", tarfile.CHRTYPE, mode=0o666, devmajor=1, devminor=3)
        add(tar, "dev/sda", tarfile.BLKTYPE, mode=0o660, devmajor=8, devminor=0)
        add(tar, "dev/fifo", tarfile.FIFOTYPE, mode=0o600)
        add(tar, "../dev-escape", tarfile.CHRTYPE, devmajor=1, devminor=3)
    put(t, "devices.tar", tar_bytes(devices))

    def pax(tar):
        add(tar, "short", data=b"pax path wins", pax={"path": "../pax-escape"})
        add(tar, "l", tarfile.SYMTYPE, link="x", pax={"linkpath": "/" + "a" * 300})
        add(tar, "d" * 150 + "/" + "e" * 150, data=b"long", pax={"uid": "99999999999",
                                                             "gid": "-1",
                                                             "mtime": "1e99"})
    put(t, "pax.tar", tar_bytes(pax, tarfile.PAX_FORMAT))

    def gnu_long(tar):
        add(tar, "x" * 200 + "/../../escape", data=b"gnu long name")
        add(tar, "link", tarfile.SYMTYPE, link="y" * 5000)
    put(t, "gnu-longname.tar", tar_bytes(gnu_long, tarfile.GNU_FORMAT))

    # A header claiming a huge size, then nothing.
    huge = bytearray(tar_bytes(lambda tar: add(tar, "big", data=b"")))
    huge[124:136] = b"77777777777\0"
    chk = sum(huge[:148]) + 8 * 32 + sum(huge[156:512])
    huge[148:156] = b"%06o\0 " % chk
    put(t, "huge-size.tar", bytes(huge[:512]))
    put(t, "whiteout-escape.tar", tar_bytes(lambda tar: add(tar, ".wh...", data=b"")))


# ---------------------------------------------------------------- image archives

def sha(b):
    return hashlib.sha256(b).hexdigest()


def image_parts(layer_tar):
    layer = gzip.compress(layer_tar, mtime=0)
    config = json.dumps({
        "architecture": "amd64", "os": "linux",
        "config": {"Env": ["PATH=/bin"], "Cmd": ["sh"], "WorkingDir": "/",
                   "StopSignal": "SIGTERM", "User": "0:0"},
        "rootfs": {"type": "layers", "diff_ids": ["sha256:" + sha(layer_tar)]},
    }).encode()
    return layer, config


def archive(files, gz=False):
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.GNU_FORMAT) as tar:
        for name, data in files:
            if isinstance(data, tuple):
                kind, link = data
                add(tar, name, kind, link=link)
            elif data is None:
                add(tar, name, tarfile.DIRTYPE, mode=0o755)
            else:
                add(tar, name, data=data)
    b = trim(buf.getvalue())
    return gzip.compress(b, mtime=0) if gz else b


def oci_files(layer_tar, ref="docker.io/library/fuzz:latest"):
    layer, config = image_parts(layer_tar)
    manifest = json.dumps({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                   "digest": "sha256:" + sha(config), "size": len(config)},
        "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip",
                    "digest": "sha256:" + sha(layer), "size": len(layer)}],
    }).encode()
    index = json.dumps({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": [{"mediaType": "application/vnd.oci.image.manifest.v1+json",
                       "digest": "sha256:" + sha(manifest), "size": len(manifest),
                       "annotations": {"io.containerd.image.name": ref,
                                       "org.opencontainers.image.ref.name": "latest"},
                       "platform": {"architecture": "amd64", "os": "linux"}}],
    }).encode()
    return [
        ("oci-layout", b'{"imageLayoutVersion": "1.0.0"}'),
        ("index.json", index),
        ("blobs/", None),
        ("blobs/sha256/", None),
        ("blobs/sha256/" + sha(manifest), manifest),
        ("blobs/sha256/" + sha(config), config),
        ("blobs/sha256/" + sha(layer), layer),
    ]


def docker_files(layer_tar):
    layer, config = image_parts(layer_tar)
    h = sha(layer_tar)
    return [
        ("manifest.json", json.dumps([{"Config": sha(config) + ".json",
                                       "RepoTags": ["fuzz:docker"],
                                       "Layers": [h + "/layer.tar"]}]).encode()),
        (sha(config) + ".json", config),
        (h + "/", None),
        (h + "/layer.tar", layer_tar),
        ("repositories", json.dumps({"fuzz": {"docker": h}}).encode()),
    ]


def archive_seeds():
    t = "image_archive"
    clean(t)
    small = tar_bytes(lambda tar: (add(tar, "bin/", tarfile.DIRTYPE),
                                   add(tar, "bin/sh", data=b"#!"),
                                   add(tar, "link", tarfile.SYMTYPE, link="bin/sh")))
    put(t, "oci.tar", archive(oci_files(small)))
    put(t, "oci.tar.gz", archive(oci_files(small), gz=True))
    put(t, "docker-save.tar", archive(docker_files(small)))
    evil_layer = tar_bytes(lambda tar: (add(tar, "up", tarfile.SYMTYPE, link=".."),
                                        add(tar, "up/canary.txt", data=b"x")))
    put(t, "oci-evil-layer.tar", archive(oci_files(evil_layer)))
    put(t, "dotdot-entry.tar", archive(oci_files(small) + [("../canary.txt", b"overwritten")]))
    put(t, "symlink-out.tar", archive([
        ("oci-layout", b'{"imageLayoutVersion": "1.0.0"}'),
        ("index.json", (tarfile.SYMTYPE, "../canary.txt")),
        ("blobs", (tarfile.SYMTYPE, "/etc")),
        ("blobs/sha256/x", b"through the link"),
    ]))
    put(t, "hardlink-out.tar", archive([
        ("manifest.json", (tarfile.LNKTYPE, "../canary.txt")),
        ("passwd", (tarfile.LNKTYPE, "/etc/passwd")),
    ]))
    docker = docker_files(small)
    docker[0] = ("manifest.json", json.dumps([{"Config": "../../canary.txt",
                                               "RepoTags": ["Not A Valid Tag!"],
                                               "Layers": ["/etc/passwd"]}]).encode())
    put(t, "docker-bad-paths.tar", archive(docker))


# ---------------------------------------------------------------- sandbox protocol

def sandbox_seeds():
    t = "sandbox_protocol"
    clean(t)
    status = {"id": "c", "state": "Running", "pid": 42, "created_at": 1, "started_at": 2,
              "finished_at": 0, "exit_code": 0, "reason": "", "message": "",
              "log_path": "/var/log/pods/x/c/0.log", "cgroup_path": "/pod/c"}
    state = {"State": {"id": "s", "pid": 7, "pid_ns_holder": None, "userns_holder": 9,
                       "containers": [status]}}
    exited = dict(status, state="Exited", exit_code=137, reason="OOMKilled", finished_at=3)

    def line(v):
        return json.dumps(v).encode() + b"\n"
    # op 0: state; the same bytes are a request line for the sandbox's side.
    put(t, "state", b"\x00" + line(state))
    put(t, "request-state", b"\x00" + line("State"))
    put(t, "request-create", b"\x00" + line({"Create": {
        "id": "c", "bundle": "/run/b", "log_path": "/l", "stdin": True, "stdin_once": False,
        "tty": False}}))
    put(t, "request-stop", b"\x02" + line({"Stop": {"id": "c", "signal": 15,
                                                   "timeout_ms": 30000}}))
    put(t, "request-exec", b"\x04" + line({"Exec": {"container_id": "c",
                                                   "args": ["sh", "-c", "id"],
                                                   "timeout_ms": 0}}))
    put(t, "request-update", b"\x03" + line({"UpdateResources": {
        "id": "c", "resources": {"cpu": {"shares": 1024, "quota": -1.5e300}}}}))
    put(t, "start", b"\x01" + line({"Container": status}))
    put(t, "stop", b"\x02" + line({"Container": exited}))
    put(t, "delete-error", b"\x03" + line({"Error": {"kind": "NotFound",
                                                    "message": "no container c"}}))
    put(t, "exec", b"\x04" + line({"Exec": {"exit_code": 1, "stdout": [104, 105],
                                           "stderr": []}}))
    frames = struct.pack("<BI", 1, 5) + b"hello" + struct.pack("<BI", 2, 3) + b"err"
    put(t, "attach", b"\x05" + line("Attached") + frames)
    put(t, "attach-huge-frame", b"\x05" + line("Attached") + struct.pack("<BI", 1, 0xFFFFFFF0))
    put(t, "subscribe", b"\x06" + line({"sandbox_id": "s", "status": exited}) + b"not json\n")


# ---------------------------------------------------------------- CRI requests

def varint(n):
    out = b""
    n &= (1 << 64) - 1
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out += bytes([b | 0x80])
        else:
            return out + bytes([b])


def field(num, value):
    if isinstance(value, int):
        return varint(num << 3) + varint(value)
    if isinstance(value, str):
        value = value.encode()
    return varint(num << 3 | 2) + varint(len(value)) + value


def msg(*fields):
    return b"".join(field(n, v) for n, v in fields)


def call(method, body):
    return bytes([method]) + struct.pack(">H", len(body)) + body


def cri_seeds():
    t = "cri_server"
    clean(t)
    version, run, stop_sb, remove_sb, sb_status, list_sb = 0, 1, 2, 3, 4, 5
    create, start, stop_c, remove_c, list_c, c_status = 6, 7, 8, 9, 10, 11
    exec_sync, exec_, attach, port_forward, status = 14, 15, 16, 17, 23
    list_images, image_status, pull, remove_image, fs_info = 28, 29, 30, 31, 32
    meta = msg((1, "web"), (2, "uid-1"), (3, "default"), (4, 0))
    linux = msg((1, "/kubepods/pod1"), (3, msg((1, msg((1, 0), (2, 2), (3, 0))))))
    sandbox_config = msg((1, meta), (2, "web"), (3, "/var/log/pods/default_web_uid-1"),
                         (5, msg((1, 6), (2, 80), (3, 8080), (4, "0.0.0.0"))),
                         (6, msg((1, "app"), (2, "web"))), (8, linux))
    run_req = msg((1, sandbox_config), (2, "runc"))
    container_config = msg((1, msg((1, "c"), (2, 0))), (2, msg((1, "busybox:latest"))),
                           (3, "sh"), (4, "-c"), (4, "sleep 1"),
                           (6, msg((1, "A"), (2, "b"))), (11, "c/0.log"))
    put(t, "version", call(version, msg((1, "v1"))))
    put(t, "status", call(status, msg((1, 1))))
    put(t, "lifecycle", call(run, run_req) + call(list_sb, b"") + b"".join(
        call(create, msg((1, p), (2, container_config), (3, sandbox_config)))
        for p in "0123456789abcdef") + call(list_c, b""))
    put(t, "containers", b"".join(
        call(m, msg((1, p), (2, 30)))
        for m in (start, c_status, exec_sync, stop_c, remove_c) for p in "0123456789abcdef"[:4]))
    put(t, "exec-sync-timeout", call(run, run_req) + call(exec_sync, msg((1, "0"), (2, "ls"),
                                                                        (3, (1 << 63) - 1))))
    put(t, "stop-timeout", call(stop_c, msg((1, "0"), (2, (1 << 64) - 1))))
    put(t, "streaming", call(exec_, msg((1, "0"), (2, "sh"), (3, 1), (4, 1), (5, 1))) +
        call(attach, msg((1, "0"), (2, 1), (3, 1))) +
        call(port_forward, msg((1, "0"), (2, 80))))
    put(t, "images", call(pull, msg((1, msg((1, "docker.io/library/busybox:latest"))),
                                    (2, msg((1, "user"), (2, "pass"))))) +
        call(list_images, b"") + call(image_status, msg((1, msg((1, "busybox"))), (2, 1))) +
        call(remove_image, msg((1, msg((1, "busybox"))))) + call(fs_info, b""))
    put(t, "sandbox-ops", call(run, run_req) + call(sb_status, msg((1, "0"), (2, 1))) +
        call(stop_sb, msg((1, "0"))) + call(remove_sb, msg((1, "0"))))
    put(t, "garbage", call(run, b"\xff\xff\xff\xff\x0f") + call(create, b"\x0a\xff\xff"))


# ---------------------------------------------------------------- HTTP/2 for the rewriter

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"


def h2frame(kind, flags, stream, payload):
    return struct.pack(">I", len(payload))[1:] + bytes([kind, flags]) + \
        struct.pack(">I", stream) + payload


def hpack_literal(name, value, indexing=False):
    def s(b):
        return varint_hpack(len(b), 7, 0) + b
    return bytes([0x40 if indexing else 0x00]) + s(name) + s(value)


def varint_hpack(n, prefix, first):
    limit = (1 << prefix) - 1
    if n < limit:
        return bytes([first | n])
    out = [first | limit]
    n -= limit
    while n >= 128:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def grpc_headers(authority, indexing=False):
    return (b"\x83\x86" +  # :method POST, :scheme http
            hpack_literal(b":path", b"/runtime.v1.RuntimeService/Version") +
            hpack_literal(b":authority", authority, indexing) +
            hpack_literal(b"content-type", b"application/grpc") +
            hpack_literal(b"te", b"trailers"))


def h2_seeds():
    t = "h2_authority"
    clean(t)
    settings = h2frame(4, 0, 0, struct.pack(">HI", 1, 4096) + struct.pack(">HI", 4, 65535))
    data = h2frame(0, 1, 1, b"\x00\x00\x00\x00\x04\x0a\x02v1")
    sock = grpc_headers(b"/run/nodelet/cri.sock", indexing=True)
    put(t, "socket-path", b"\x07" + PREFACE + settings + h2frame(1, 4, 1, sock) + data)
    put(t, "localhost", b"\x01" + PREFACE + settings +
        h2frame(1, 4, 1, grpc_headers(b"localhost")) + data)
    # The second request reuses the dynamic table entry the first one added.
    put(t, "indexed-again", b"\x03" + PREFACE + settings + h2frame(1, 4, 1, sock) +
        h2frame(1, 5, 3, b"\x83\x86\xbe" + hpack_literal(b":path", b"/x")))
    put(t, "continuation", b"\x10" + PREFACE + h2frame(1, 0x20, 1, b"\x00\x00\x00\x00\x10" +
                                                     sock[:10]) +
        h2frame(9, 4, 1, sock[10:]))
    put(t, "padded", b"\x05" + PREFACE + h2frame(1, 0x0C, 1, b"\x03" + sock + b"\x00\x00\x00"))
    put(t, "table-size", b"\x02" + PREFACE + h2frame(1, 4, 1, b"\x3f\xe1\x1f" + sock))
    put(t, "not-h2", b"\x04GET / HTTP/1.1\r\nHost: x\r\n\r\n")


# ---------------------------------------------------------------- SPDY/3.1

def spdy_dictionary():
    src = open(os.path.join(REPO, "runtime/src/streaming/spdy/mod.rs")).read()
    words_src = src.split("const WORDS: &[&str] = &[", 1)[1].split("];", 1)[0]
    words = re.findall(r'"((?:[^"\\]|\\.)*)"', words_src)
    tail_src = src.split("const TAIL: &str =", 1)[1].split(";", 1)[0]
    tail = "".join(re.findall(r'"((?:[^"\\]|\\.)*)"', tail_src))
    d = b""
    for w in words:
        w = w.encode()
        d += struct.pack(">I", len(w)) + w
    d += tail.encode()
    assert len(d) == 1423, len(d)
    assert zlib.adler32(d) == 0xE3C6A7C2
    return d


class Spdy:
    def __init__(self):
        self.z = zlib.compressobj(zdict=spdy_dictionary())

    def block(self, headers):
        b = struct.pack(">I", len(headers))
        for k, v in headers:
            b += struct.pack(">I", len(k)) + k.encode() + struct.pack(">I", len(v)) + v.encode()
        return self.z.compress(b) + self.z.flush(zlib.Z_SYNC_FLUSH)

    @staticmethod
    def control(kind, flags, body):
        return struct.pack(">HH", 0x8003, kind) + bytes([flags]) + \
            struct.pack(">I", len(body))[1:] + body

    def syn(self, sid, headers, flags=0):
        return self.control(1, flags, struct.pack(">IIBB", sid, 0, 0, 0) + self.block(headers))

    def headers(self, sid, headers):
        return self.control(8, 0, struct.pack(">I", sid) + self.block(headers))

    @staticmethod
    def data(sid, payload, flags=0):
        return struct.pack(">I", sid) + bytes([flags]) + struct.pack(">I", len(payload))[1:] + \
            payload


def spdy_exec(s, tty=False):
    out = s.syn(1, [("streamtype", "error")]) + s.syn(3, [("streamtype", "stdin")]) + \
        s.syn(5, [("streamtype", "stdout")])
    if tty:
        out += s.syn(7, [("streamtype", "resize")])
        out += s.data(7, b'{"Width":80,"Height":24}{"Width":100,')
        out += s.data(7, b'"Height":50}')
    else:
        out += s.syn(7, [("streamtype", "stderr")])
    out += s.data(3, b"echo hello\n") + s.data(3, b"", flags=1)
    return out


def spdy_portforward(s):
    return (s.syn(1, [("streamtype", "error"), ("port", "80"), ("requestid", "0")]) +
            s.syn(3, [("streamtype", "data"), ("port", "80"), ("requestid", "0")]) +
            s.data(3, b"GET / HTTP/1.0\r\n\r\n") + s.data(3, b"", flags=1) +
            s.syn(5, [("streamtype", "error"), ("port", "1")]) +
            s.syn(7, [("streamtype", "data"), ("port", "1")]))


def spdy_seeds():
    t = "spdy_frames"
    clean(t)
    s = Spdy()
    put(t, "exec", spdy_exec(s))
    s = Spdy()
    put(t, "control", s.syn(1, [("streamtype", "error"), ("multi", "a\0b")], flags=1) +
        Spdy.control(2, 0, struct.pack(">I", 1) + s.block([("status", "200")])) +
        Spdy.control(3, 0, struct.pack(">II", 1, 5)) +
        Spdy.control(4, 1, struct.pack(">I", 2) + struct.pack(">BBBBI", 0, 0, 0, 4, 65536) +
                     struct.pack(">BBBBI", 1, 0, 0, 7, 1 << 20)) +
        Spdy.control(6, 0, struct.pack(">I", 1)) +
        Spdy.control(7, 0, struct.pack(">II", 3, 0)) +
        s.headers(1, [("x", "y")]) +
        Spdy.control(9, 0, struct.pack(">II", 1, 1 << 16)) +
        Spdy.control(5, 0, b"") + Spdy.data(1, b"data", flags=1))
    put(t, "bad-version", struct.pack(">HH", 0x8002, 1) + b"\x00\x00\x00\x00")
    put(t, "raw-zlib-end", Spdy.control(1, 0, struct.pack(">IIBB", 1, 0, 0, 0) +
                                        zlib.compress(b"\x00\x00\x00\x00") + b"trailing"))

    t = "streaming_sessions"
    clean(t)
    put(t, "spdy-exec", b"\x04" + spdy_exec(Spdy()))
    put(t, "spdy-exec-tty", b"\x05" + spdy_exec(Spdy(), tty=True))
    put(t, "spdy-attach", b"\x06" + spdy_exec(Spdy()))
    put(t, "spdy-portforward", b"\x07" + spdy_portforward(Spdy()))

    def ws(payload, opcode=2, fin=True, mask=b"\x01\x02\x03\x04"):
        head = bytes([(0x80 if fin else 0) | opcode])
        n = len(payload)
        if n < 126:
            head += bytes([0x80 | n])
        elif n < 65536:
            head += bytes([0x80 | 126]) + struct.pack(">H", n)
        else:
            head += bytes([0x80 | 127]) + struct.pack(">Q", n)
        masked = bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
        return head + mask + masked
    close = ws(struct.pack(">H", 1000), opcode=8)
    put(t, "ws-exec", b"\x00" + ws(b"\x00echo hi\n") + ws(b"\xff\x00") + ws(b"ping", 9) + close)
    put(t, "ws-exec-tty", b"\x01" + ws(b"\x04" + b'{"Width":120,"Height":40}') +
        ws(b"\x04{bad json") + ws(b"\x00ls\n", fin=False) + ws(b"more", opcode=0) + close)
    put(t, "ws-attach", b"\x02" + ws(b"\x00input") + ws(b"\xff\x00") + ws(b"text", 1))
    put(t, "ws-portforward", b"\x03" + ws(b"\x00GET / HTTP/1.0\r\n\r\n") + ws(b"\x02x") +
        ws(b"\x04to port 8080") + ws(b"\x07") + close)
    put(t, "ws-unmasked", b"\x00\x82\x02\x00a")


def main():
    config_seeds()
    manifest_seeds()
    layer_seeds()
    archive_seeds()
    sandbox_seeds()
    cri_seeds()
    h2_seeds()
    spdy_seeds()
    total = 0
    for root, _, files in os.walk(CORPUS):
        total += sum(os.path.getsize(os.path.join(root, f)) for f in files)
    print(f"corpus: {total} bytes")


if __name__ == "__main__":
    main()
