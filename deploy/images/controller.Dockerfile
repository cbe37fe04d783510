# The controller: kopf and the official Kubernetes client, no discovery handler libraries.
# Build from the repository root: docker build -f deploy/images/controller.Dockerfile .
ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY controller ./controller
COPY crds ./crds
COPY cli ./cli
COPY discovery_handlers ./discovery_handlers
# agent/ is left out: setuptools' package discovery includes only what is there.
RUN pip wheel --no-cache-dir --wheel-dir /wheels ".[controller]"

FROM ${PYTHON_IMAGE}
COPY --from=build /wheels /wheels
RUN pip install --no-cache-dir --no-index --find-links /wheels /wheels/*.whl \
    && rm -rf /wheels
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
USER 65532:65532
ENTRYPOINT ["edgeplug-controller"]
