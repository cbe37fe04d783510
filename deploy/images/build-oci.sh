#!/usr/bin/env bash
# Build the agent and controller images as OCI image archives, without a container engine.
#
# Why this exists: there is no Docker engine or registry where edgeplug is built and tested, and
# an image nobody built is an image nobody tested. This builds the same images as
# agent.Dockerfile and controller.Dockerfile, from the same inputs (pyproject.toml, README.md and
# the packages each role needs; the agent's handler libraries picked by the same pyproject
# extras), with Debian's own tools:
#   1. mmdebstrap makes a minimal Debian root (Essential packages, python3, libudev1 for pyudev,
#      libstdc++6 for grpcio;
#      no docs, man pages or translations), from this machine's own apt sources;
#   2. pip builds the project's wheel from a copy holding only the role's packages, and fetches
#      its dependencies' wheels for the image's Python (Debian's python3, whatever Python runs
#      this script);
#   3. umoci packs the root as one base layer; each image adds one layer in which the image's own
#      python3 installs the wheels offline (pip run from its wheel, so no pip stays behind);
#   4. each image is written as an OCI image archive (a tar of an OCI image layout with one tag,
#      what `skopeo copy oci-archive:...` and `podman load -i` read).
#
# Usage: deploy/images/build-oci.sh [OUT_DIR]     (as root: mmdebstrap --mode=root, chroot)
#   AGENT_HANDLER_SETS  agent images to build, space-separated pyproject extras lists;
#                       "all" = udev,onvif,opcua (the Dockerfile's default), "none" = no extras
#                       (debugEcho and ascend only). Default: "all".
#   APT_SOURCES         apt sources files for mmdebstrap (default: this machine's own).
#   PYTHON              the Python that runs pip on this side (default: python3 on PATH).
# Writes OUT_DIR/<image>.oci.tar for edgeplug-controller and each agent set, and
# OUT_DIR/sizes.txt. Does nothing when the inputs have not changed since the last build.
set -euo pipefail

REPO=$(cd "$(dirname "$0")/../.." && pwd)
OUT=$(mkdir -p "${1:-$REPO/build/images}" && cd "${1:-$REPO/build/images}" && pwd)
PYTHON=${PYTHON:-python3}
AGENT_HANDLER_SETS=${AGENT_HANDLER_SETS:-all}
SUITE=bookworm
# Debian bookworm's python3; the dependency wheels are fetched for it.
IMAGE_PYTHON_VERSION=3.11
IMAGE_ABI=cp311
# Bookworm's glibc is 2.36: any manylinux wheel up to that runs.
MANYLINUX_MAX_MINOR=36
VERSION=$(sed -n 's/^version = "\(.*\)"/\1/p' "$REPO/pyproject.toml")
ROOT_PACKAGES=python3,libudev1,libstdc++6

log() { printf '[images] %s\n' "$*" >&2; }

if [ "$(id -u)" -ne 0 ]; then
  echo "build-oci.sh runs as root (mmdebstrap --mode=root and chroot)" >&2
  exit 1
fi
for tool in mmdebstrap umoci; do
  command -v "$tool" >/dev/null || { echo "needs $tool (Debian package $tool)" >&2; exit 1; }
done

# -- up to date? ---------------------------------------------------------------------------
inputs_digest() {
  (
    cd "$REPO"
    printf '%s\n' "$AGENT_HANDLER_SETS" "$ROOT_PACKAGES"
    find pyproject.toml README.md agent controller crds cli discovery_handlers deploy/images \
      -type f -not -path '*/__pycache__/*' -not -name '*.pyc' -print0 \
      | sort -z | xargs -0 sha256sum
  ) | sha256sum | cut -d' ' -f1
}
DIGEST=$(inputs_digest)
if [ -f "$OUT/inputs.sha256" ] && [ "$(cat "$OUT/inputs.sha256")" = "$DIGEST" ]; then
  log "images in $OUT are up to date"
  cat "$OUT/sizes.txt"
  exit 0
fi
rm -f "$OUT"/*.oci.tar "$OUT/sizes.txt" "$OUT/inputs.sha256"

WORK=$(mktemp -d "${TMPDIR:-/tmp}/edgeplug-images.XXXXXX")
trap 'rm -rf "$WORK"' EXIT

# -- 1. the Debian root --------------------------------------------------------------------
sources=()
if [ -n "${APT_SOURCES:-}" ]; then
  read -r -a sources <<<"$APT_SOURCES"
else
  for file in /etc/apt/sources.list /etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources; do
    [ -s "$file" ] && sources+=("$file")
  done
fi
[ "${#sources[@]}" -gt 0 ] || { echo "no apt sources found (set APT_SOURCES)" >&2; exit 1; }
log "mmdebstrap $SUITE ($ROOT_PACKAGES) from ${sources[*]}"
mmdebstrap --quiet --mode=root --variant=essential --include="$ROOT_PACKAGES" \
  --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-include=/usr/share/doc/*/copyright' \
  --dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/info/*' \
  --dpkgopt='path-exclude=/usr/share/locale/*' \
  --customize-hook='rm -rf "$1"/var/cache/* "$1"/var/log/*.log' \
  "$SUITE" "$WORK/root" "${sources[@]}"
image_python=$(chroot "$WORK/root" python3 -c 'import sys; print("%d.%d" % sys.version_info[:2])')
[ "$image_python" = "$IMAGE_PYTHON_VERSION" ] \
  || { echo "the root's python3 is $image_python, not $IMAGE_PYTHON_VERSION" >&2; exit 1; }

base_mib=$(du -sm --apparent-size "$WORK/root" | cut -f1)
printf '%-24s unpacked %3s MiB: the Debian root every image starts from\n' "(base layer)" \
  "$base_mib" >"$WORK/sizes.txt"
umoci init --layout "$WORK/layout"
umoci new --image "$WORK/layout:base"
umoci unpack --image "$WORK/layout:base" "$WORK/bundle-base"
cp -a "$WORK/root/." "$WORK/bundle-base/rootfs/"
umoci repack --image "$WORK/layout:base" "$WORK/bundle-base"
rm -rf "$WORK/root" "$WORK/bundle-base"

# -- 2. wheels -----------------------------------------------------------------------------
platforms=(--platform manylinux2014_x86_64 --platform manylinux2010_x86_64 --platform manylinux1_x86_64)
for minor in $(seq 5 "$MANYLINUX_MAX_MINOR"); do platforms+=(--platform "manylinux_2_${minor}_x86_64"); done

# wheels ROLE EXTRAS: the project's wheel built from a copy holding only the role's packages
# (setuptools' package discovery takes what is there), and every dependency's wheel.
wheels() {
  local role=$1 extras=$2 src="$WORK/src-$1-$2" dest="$WORK/wheels-$1-$2"
  mkdir -p "$src" "$dest"
  cp "$REPO/pyproject.toml" "$REPO/README.md" "$src/"
  for package in "$role" crds cli discovery_handlers; do
    (cd "$REPO" && find "$package" -type f -not -path '*/__pycache__/*' -not -name '*.pyc' \
      -exec cp --parents {} "$src/" \;)
  done
  "$PYTHON" -m pip wheel --quiet --no-deps --wheel-dir "$dest" "$src" >&2
  local spec
  spec="$(ls "$dest"/edgeplug-*.whl)${extras:+[$extras]}"
  "$PYTHON" -m pip download --quiet --dest "$dest" --only-binary=:all: \
    --python-version "$IMAGE_PYTHON_VERSION" --implementation cp --abi "$IMAGE_ABI" --abi abi3 \
    --abi none "${platforms[@]}" "$spec" pip >&2
  echo "$dest"
}

# -- 3. one image --------------------------------------------------------------------------
# image NAME ROLE EXTRAS ENTRYPOINT USER
image() {
  local name=$1 role=$2 extras=$3 entrypoint=$4 user=$5
  local dir bundle="$WORK/bundle-$name" layout="$WORK/layout-$name"
  log "$name: wheels (${role}${extras:+, extras $extras})"
  dir=$(wheels "$role" "$extras")
  cp -a "$WORK/layout" "$layout"
  umoci unpack --image "$layout:base" "$bundle"
  mkdir -p "$bundle/rootfs/tmp/wheels"
  cp "$dir"/*.whl "$bundle/rootfs/tmp/wheels/"
  log "$name: installing into the image with its own python3"
  local pip_wheel
  pip_wheel=$(cd "$bundle/rootfs/tmp/wheels" && ls pip-*.whl)
  chroot "$bundle/rootfs" /usr/bin/env -i PATH=/usr/local/bin:/usr/bin:/bin HOME=/root \
    python3 "/tmp/wheels/$pip_wheel/pip" install --quiet --no-index --find-links /tmp/wheels \
    --no-cache-dir --break-system-packages --root-user-action=ignore \
    --disable-pip-version-check "edgeplug${extras:+[$extras]}"
  rm -rf "$bundle/rootfs/tmp/wheels" "$bundle/rootfs/root/.cache"
  local installed
  installed=$(du -sm --apparent-size "$bundle/rootfs" | cut -f1)
  local added=$(( installed - base_mib ))
  umoci repack --image "$layout:base" "$bundle"
  umoci config --image "$layout:base" --tag "$VERSION" \
    --config.entrypoint "$entrypoint" --config.user "$user" --config.workingdir / \
    --config.env PYTHONDONTWRITEBYTECODE=1 --config.env PYTHONUNBUFFERED=1 \
    --config.env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    --config.label "org.opencontainers.image.title=$name" \
    --config.label "org.opencontainers.image.version=$VERSION"
  umoci rm --image "$layout:base"
  umoci gc --layout "$layout"
  tar --sort=name --owner=0 --group=0 --numeric-owner -C "$layout" -cf "$OUT/$name.oci.tar" .
  local layers
  layers=$("$PYTHON" - "$layout" <<'EOF'
import json, pathlib, sys
layout = pathlib.Path(sys.argv[1])
[entry] = json.loads((layout / "index.json").read_text())["manifests"]
manifest = json.loads((layout / "blobs/sha256" / entry["digest"].split(":")[1]).read_text())
base, own = (layer["size"] / 2**20 for layer in manifest["layers"])
print(f"{base:.1f} MiB shared base + {own:.1f} MiB own")
EOF
)
  rm -rf "$bundle" "$layout"
  local archive
  archive=$(( $(stat -c %s "$OUT/$name.oci.tar") / 1024 / 1024 ))
  printf '%-24s archive %3s MiB (gzip layers: %s); unpacked %3s MiB (%s over the base)\n' \
    "$name" "$archive" "$layers" "$installed" "$added" >>"$WORK/sizes.txt"
}

image edgeplug-controller controller controller edgeplug-controller 65532:65532
for set in $AGENT_HANDLER_SETS; do
  case "$set" in
    all) image edgeplug-agent agent udev,onvif,opcua edgeplug-agent 0:0 ;;
    none) image edgeplug-agent-minimal agent "" edgeplug-agent 0:0 ;;
    *) image "edgeplug-agent-${set//,/-}" agent "$set" edgeplug-agent 0:0 ;;
  esac
done
mv "$WORK/sizes.txt" "$OUT/sizes.txt"
echo "$DIGEST" >"$OUT/inputs.sha256"
cat "$OUT/sizes.txt"
