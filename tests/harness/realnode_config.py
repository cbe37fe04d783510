"""The files a real node starts from: its credentials, kubelet and containerd configs, CNI.

Tests/harness/realnode.py runs the real kubelet and containerd, and each reads
files a cluster's node installer would write. They are written here, one function per file, so
the node's lifecycle code stays short and each setting sits beside the reason for it. Paths
under ``/var/lib/kubelet``, ``/run/containerd``, ``/var/run/cdi``, ``/etc/cdi``, ``/var/log`` and
``/var/lib/cni`` are the node's own: the node runs in a mount namespace where they are bind
mounts of directories under its temporary root.
"""

from __future__ import annotations

import datetime
import ipaddress
import json
from dataclasses import dataclass
from pathlib import Path

import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

CAP_SYS_RESOURCE = 24


def has_cap_sys_resource() -> bool:
    """Whether this process may lower an oom_score_adj (bounding set has CAP_SYS_RESOURCE)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("CapBnd:"):
            return bool(int(line.split()[1], 16) >> CAP_SYS_RESOURCE & 1)
    return False


CONTAINERD_SOCKET = "/run/containerd/containerd.sock"
PAUSE_IMAGE = "edgeplug.local/pause:test"
#: Mount points the node gets its own copy of (bind mounts of directories under its root).
NODE_PATHS = ("/var/lib/kubelet", "/run/containerd", "/var/run/cdi", "/etc/cdi",
              "/var/log/pods", "/var/log/containers", "/var/lib/cni",
              "/var/lib/akri")  # the agent's discovery-handler sockets (Akri's directory)
#: Kernel settings the kubelet insists on (it writes them unless protectKernelDefaults). On a
#: shared test machine they must not change, so in the node's mount namespace each of these
#: files is a bind mount of a plain file the kubelet may write.
KUBELET_SYSCTLS = {
    "vm/overcommit_memory": "1", "vm/panic_on_oom": "0", "kernel/panic": "10",
    "kernel/panic_on_oops": "1", "kernel/keys/root_maxkeys": "1000000",
    "kernel/keys/root_maxbytes": "25000000",
}
POD_CIDR = "10.244.0.0/24"
VALIDITY = datetime.timedelta(days=2)


@dataclass(frozen=True)
class NodeCredentials:
    client_cert: Path  # CN system:node:<name>, O system:nodes: Node authorizer + NodeRestriction
    client_key: Path
    serving_cert: Path  # the kubelet's HTTPS endpoint (logs, exec) for 127.0.0.1
    serving_key: Path


def _issue(ca_cert: Path, ca_key: Path, subject: x509.Name, usage: x509.ObjectIdentifier,
           san: list[x509.GeneralName], cert_out: Path, key_out: Path) -> None:
    ca = x509.load_pem_x509_certificate(ca_cert.read_bytes())
    signer = serialization.load_pem_private_key(ca_key.read_bytes(), password=None)
    assert isinstance(signer, ec.EllipticCurvePrivateKey)
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject).issuer_name(ca.subject).public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + VALIDITY)
        .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
    )
    if san:
        builder = builder.add_extension(x509.SubjectAlternativeName(san), critical=False)
    cert_out.write_bytes(builder.sign(signer, hashes.SHA256()).public_bytes(
        serialization.Encoding.PEM))
    key_out.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                          serialization.PrivateFormat.PKCS8,
                                          serialization.NoEncryption()))
    key_out.chmod(0o600)


def node_credentials(ca_cert: Path, ca_key: Path, node_name: str, out: Path) -> NodeCredentials:
    """A kubelet client certificate and a serving certificate, both signed by the harness CA."""
    out.mkdir(parents=True, exist_ok=True)
    creds = NodeCredentials(out / "kubelet-client.crt", out / "kubelet-client.key",
                            out / "kubelet.crt", out / "kubelet.key")
    client = x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "system:nodes"),
                        x509.NameAttribute(NameOID.COMMON_NAME, f"system:node:{node_name}")])
    _issue(ca_cert, ca_key, client, ExtendedKeyUsageOID.CLIENT_AUTH, [],
           creds.client_cert, creds.client_key)
    _issue(ca_cert, ca_key, client, ExtendedKeyUsageOID.SERVER_AUTH,
           [x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.DNSName(node_name)],
           creds.serving_cert, creds.serving_key)
    return creds


def kubeconfig(server: str, ca_cert: Path, creds: NodeCredentials, path: Path) -> Path:
    config = {
        "apiVersion": "v1", "kind": "Config",
        "clusters": [{"name": "local", "cluster": {"server": server,
                                                   "certificate-authority": str(ca_cert)}}],
        "users": [{"name": "node", "user": {"client-certificate": str(creds.client_cert),
                                            "client-key": str(creds.client_key)}}],
        "contexts": [{"name": "node", "context": {"cluster": "local", "user": "node"}}],
        "current-context": "node",
    }
    path.write_text(json.dumps(config, indent=1))
    path.chmod(0o600)
    return path


def kubelet_config(*, path: Path, ca_cert: Path, creds: NodeCredentials, port: int,
                   healthz_port: int, cgroup_root: str) -> Path:
    """KubeletConfiguration for a test node on cgroup v1 with a shared, busy disk."""
    config = {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        # Kubernetes 1.35+ refuses cgroup v1 unless told; this machine has v1 only.
        "failCgroupV1": False,
        "cgroupDriver": "cgroupfs",
        # Every cgroup of the node under one root of its own, removed when it stops.
        "cgroupRoot": cgroup_root,
        "containerRuntimeEndpoint": f"unix://{CONTAINERD_SOCKET}",
        "address": "127.0.0.1",
        "port": port,
        "readOnlyPort": 0,
        "healthzBindAddress": "127.0.0.1",
        "healthzPort": healthz_port,
        "tlsCertFile": str(creds.serving_cert),
        "tlsPrivateKeyFile": str(creds.serving_key),
        # The harness API server has no kubelet client certificate (kubectl logs goes through
        # it unauthenticated); the kubelet listens on loopback only.
        "authentication": {"anonymous": {"enabled": True}, "webhook": {"enabled": False},
                           "x509": {"clientCAFile": str(ca_cert)}},
        "authorization": {"mode": "AlwaysAllow"},
        # A test machine's disk and memory are shared with everything else running: evict
        # nothing for pressure the node did not cause.
        "evictionHard": {"memory.available": "1Mi", "nodefs.available": "1%",
                         "nodefs.inodesFree": "1%", "imagefs.available": "1%"},
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        "failSwapOn": False,
        "protectKernelDefaults": False,
        "serializeImagePulls": False,
        "nodeStatusUpdateFrequency": "2s",
        "nodeStatusReportFrequency": "10s",
        "syncFrequency": "10s",
        "fileCheckFrequency": "5s",
        "resolvConf": "",
        "localStorageCapacityIsolation": True,
    }
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def containerd_config(*, path: Path, root: Path, cni_bin: Path, cni_conf: Path,
                      runc: Path, restrict_oom: bool) -> Path:
    """containerd 2 (config version 3): CRI on, CDI from the node's spec dirs, runc, CNI."""
    text = f"""version = 3
root = "{root}"
state = "/run/containerd"
disabled_plugins = ["io.containerd.nri.v1.nri", "io.containerd.snapshotter.v1.devmapper",
                    "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.btrfs",
                    "io.containerd.tracing.processor.v1.otlp",
                    "io.containerd.internal.v1.tracing"]

[grpc]
  address = "{CONTAINERD_SOCKET}"

[ttrpc]
  address = "/run/containerd/containerd.sock.ttrpc"

[plugins.'io.containerd.internal.v1.opt']
  path = "{root}/opt"

[plugins.'io.containerd.cri.v1.images']
  snapshotter = "overlayfs"
  [plugins.'io.containerd.cri.v1.images'.pinned_images]
    sandbox = "{PAUSE_IMAGE}"

[plugins.'io.containerd.cri.v1.runtime']
  cdi_spec_dirs = ["/etc/cdi", "/var/run/cdi"]
  netns_mounts_under_state_dir = true
  tolerate_missing_hugetlb_controller = true
  # Without CAP_SYS_RESOURCE (a sandboxed test machine) a negative oom_score_adj is refused and
  # every sandbox (the kubelet asks -998 for pause) fails; clamp to containerd's own instead.
  restrict_oom_score_adj = {str(restrict_oom).lower()}
  disable_hugetlb_controller = true
  [plugins.'io.containerd.cri.v1.runtime'.containerd]
    default_runtime_name = "runc"
    [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
        BinaryName = "{runc}"
        SystemdCgroup = false
  [plugins.'io.containerd.cri.v1.runtime'.cni]
    bin_dirs = ["{cni_bin}"]
    conf_dir = "{cni_conf}"

[plugins.'io.containerd.grpc.v1.cri']
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
"""
    path.write_text(text)
    return path


def cni_conflist(conf_dir: Path, data_dir: Path) -> Path:
    """Pods on a bridge inside the node's own network namespace (nothing reaches the host).

    containerd sets up each pod's ``lo`` itself with the ``loopback`` plugin."""
    conf_dir.mkdir(parents=True, exist_ok=True)
    conflist = {
        "cniVersion": "1.0.0",
        "name": "edgeplug-realnode",
        "plugins": [
            {"type": "bridge", "bridge": "cni0", "isGateway": True, "ipMasq": False,
             "ipam": {"type": "host-local", "dataDir": str(data_dir),
                      "ranges": [[{"subnet": POD_CIDR}]]}},
        ],
    }
    path = conf_dir / "10-edgeplug.conflist"
    path.write_text(json.dumps(conflist, indent=1))
    return path
