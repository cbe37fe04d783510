"""OCI image archives for the real node, made locally: the pause image and a busybox image.

The real node's containerd runs images, and a test may not reach a registry.
Both images are built here from files already on the machine: ``pause`` (the static binary
built with the kubelet, see tests/harness/realnodebin/pause) and Debian's static busybox
(package busybox-static) with a link per applet. Each archive is a plain OCI image layout in a
tar, one uncompressed layer, which ``ctr images import`` reads as a registry's image would be.
"""

from __future__ import annotations

import hashlib
import io
import json
import platform
import subprocess
import tarfile
from pathlib import Path

BUSYBOX = Path("/bin/busybox")
BUSYBOX_IMAGE = "edgeplug.local/busybox:test"
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_CONFIG = "application/vnd.oci.image.config.v1+json"
OCI_LAYER = "application/vnd.oci.image.layer.v1.tar"
ARCH = {"x86_64": "amd64", "aarch64": "arm64"}.get(platform.machine(), platform.machine())


def _add(tar: tarfile.TarFile, name: str, *, data: bytes | None = None, mode: int = 0o755,
         link: str | None = None) -> None:
    info = tarfile.TarInfo(name)
    info.mode = mode
    if link is not None:
        info.type, info.linkname = tarfile.SYMTYPE, link
    elif data is None:
        info.type = tarfile.DIRTYPE
    else:
        info.size = len(data)
    tar.addfile(info, io.BytesIO(data) if data is not None else None)


def _layer(files: dict[str, Path], links: dict[str, str], dirs: tuple[str, ...]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name in dirs:
            _add(tar, name, mode=0o1777 if name == "tmp" else 0o755)
        for name, source in files.items():
            _add(tar, name, data=source.read_bytes())
        for name, target in sorted(links.items()):
            _add(tar, name, link=target, mode=0o777)
    return buffer.getvalue()


def _blob(tar: tarfile.TarFile, data: bytes) -> str:
    digest = hashlib.sha256(data).hexdigest()
    _add(tar, f"blobs/sha256/{digest}", data=data, mode=0o644)
    return f"sha256:{digest}"


def write_archive(out: Path, name: str, layer: bytes, *, entrypoint: list[str],
                  cmd: list[str] | None = None) -> Path:
    """An OCI image layout (oci-layout, index.json, blobs) in a tar, for ``ctr images import``."""
    config = {
        "architecture": ARCH, "os": "linux",
        "config": {"Entrypoint": entrypoint, "Cmd": cmd or [], "Env": ["PATH=/bin"]},
        "rootfs": {"type": "layers", "diff_ids": [f"sha256:{hashlib.sha256(layer).hexdigest()}"]},
    }
    with tarfile.open(out, "w", format=tarfile.PAX_FORMAT) as tar:
        _add(tar, "blobs", mode=0o755)
        _add(tar, "blobs/sha256", mode=0o755)
        layer_digest = _blob(tar, layer)
        config_bytes = json.dumps(config).encode()
        config_digest = _blob(tar, config_bytes)
        manifest = json.dumps({
            "schemaVersion": 2, "mediaType": OCI_MANIFEST,
            "config": {"mediaType": OCI_CONFIG, "digest": config_digest,
                       "size": len(config_bytes)},
            "layers": [{"mediaType": OCI_LAYER, "digest": layer_digest, "size": len(layer)}],
        }).encode()
        manifest_digest = _blob(tar, manifest)
        index = {
            "schemaVersion": 2,
            "manifests": [{
                "mediaType": OCI_MANIFEST, "digest": manifest_digest, "size": len(manifest),
                "platform": {"architecture": ARCH, "os": "linux"},
                "annotations": {"io.containerd.image.name": name,
                                "org.opencontainers.image.ref.name": name.rsplit(":", 1)[1]},
            }],
        }
        _add(tar, "oci-layout", data=b'{"imageLayoutVersion":"1.0.0"}', mode=0o644)
        _add(tar, "index.json", data=json.dumps(index).encode(), mode=0o644)
    return out


def pause_archive(pause_binary: Path, out: Path, name: str) -> Path:
    layer = _layer({"pause": pause_binary}, {}, ("dev", "proc", "sys", "etc"))
    return write_archive(out, name, layer, entrypoint=["/pause"])


def busybox_archive(out: Path) -> Path:
    """Debian's static busybox with ``/bin/<applet>`` links: sh, env, ls, dd, od, ..."""
    if not BUSYBOX.is_file():
        raise RuntimeError(f"the real node's test image needs {BUSYBOX} "
                           "(Debian package busybox-static, in .ci/apt/realnode.txt)")
    listed = subprocess.run([str(BUSYBOX), "--list"], check=True, capture_output=True,
                            text=True).stdout.split()
    links = {f"bin/{applet}": "busybox" for applet in listed if applet != "busybox"}
    layer = _layer({"bin/busybox": BUSYBOX}, links,
                   ("bin", "dev", "proc", "sys", "etc", "tmp", "root", "var"))
    return write_archive(out, BUSYBOX_IMAGE, layer, entrypoint=[], cmd=["sh"])
