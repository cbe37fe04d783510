# The node agent: lightkube, gRPC and the discovery handlers' own libraries, nothing of the
# controller (kopf and the official client would cost ~130 MiB on every node).
# Build from the repository root: docker build -f deploy/images/agent.Dockerfile .
# HANDLER_EXTRAS picks the handlers' libraries (pyproject extras); "" leaves debugEcho and ascend
# (ctypes and the host's DCMI library only) as the handlers that can run.
ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
ARG HANDLER_EXTRAS=udev,onvif,opcua
WORKDIR /src
COPY pyproject.toml README.md ./
COPY agent ./agent
COPY crds ./crds
COPY cli ./cli
COPY discovery_handlers ./discovery_handlers
# controller/ is left out: setuptools' package discovery includes only what is there.
RUN pip wheel --no-cache-dir --wheel-dir /wheels ".${HANDLER_EXTRAS:+[${HANDLER_EXTRAS}]}"

FROM ${PYTHON_IMAGE}
# libudev for pyudev (udev discovery reads the host's /sys and /run/udev, mounted read-only).
RUN apt-get update \
    && apt-get install -y --no-install-recommends libudev1 \
    && rm -rf /var/lib/apt/lists/*
COPY --from=build /wheels /wheels
RUN pip install --no-cache-dir --no-index --find-links /wheels /wheels/*.whl \
    && rm -rf /wheels
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
# Root: the agent creates its sockets in the kubelet's root-owned device-plugin directory.
USER 0
ENTRYPOINT ["edgeplug-agent"]
