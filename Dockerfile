# syntax=docker/dockerfile:1
# The podcost image: one image for every service, each a command of the `podcost` entry point
#   docker run IMAGE watcher | ranker --strategy NAME | aggregator | annotator | run
# Built in two stages: the builder installs the locked environment (uv.lock) with uv into a
# virtualenv; the runtime stage is the same Python base with only that virtualenv added, no uv,
# no pip, no compilers. It runs as a numeric non-root user and writes nothing outside /tmp, so it
# works with a read-only root filesystem (mount a writable /tmp: an emptyDir or a tmpfs).
#
#   docker build --build-arg REVISION="$(git rev-parse HEAD)" -t podcost:0.1.0 .
#
# VERSION (the OCI label) defaults to pyproject.toml's version, which the services read from the
# package metadata; REVISION becomes PODCOST_REVISION, which they report (build_info, /healthz).
#
# The Helm chart (deploy/helm/podcost) and docker-compose.yml run this image;
# tests/unit/test_dockerfile.py checks these promises by reading this file.

# Python 3.11, the version `make test` runs on; builder and runtime must be the same image,
# because the virtualenv's interpreter is a link to the base image's. PYTHON is that image's
# interpreter: /usr/local/bin/python3 in the python images, /usr/bin/python3 in a base made from
# Debian's packages (`make image` builds one, as no registry image can be pulled there).
ARG PYTHON_IMAGE=python:3.11.14-slim-bookworm
ARG PYTHON=/usr/local/bin/python3

FROM ${PYTHON_IMAGE} AS builder

# The uv the Makefile pins (UV_VERSION), from PyPI as `make setup` installs it, into a virtualenv
# of its own (Debian's Python has no pip and refuses a system-wide one, PEP 668).
ARG UV_VERSION=0.13.9
ARG PYTHON
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1 \
    UV_COMPILE_BYTECODE=1 \
    UV_LINK_MODE=copy \
    UV_PYTHON_DOWNLOADS=never \
    UV_PYTHON=${PYTHON} \
    UV_PROJECT_ENVIRONMENT=/opt/podcost \
    PATH=/opt/uv/bin:$PATH
# An optional build secret `ca-certificates` (a CA bundle) is trusted for the downloads, for a
# builder behind a TLS-inspecting proxy: `--secret id=ca-certificates,src=<bundle>`.
RUN --mount=type=secret,id=ca-certificates \
    if [ -s /run/secrets/ca-certificates ]; then export PIP_CERT=/run/secrets/ca-certificates; fi \
    && "${PYTHON}" -m venv /opt/uv \
    && /opt/uv/bin/python -m pip install "uv==${UV_VERSION}"

WORKDIR /src
# The dependencies first, in their own layer: it is rebuilt only when the lock changes. The
# workspace members' pyproject files are needed to read the workspace, though their packages
# (the local test servers, the example plugin: dev dependencies) are not installed.
COPY pyproject.toml uv.lock README.md ./
COPY deploy/local/pyproject.toml deploy/local/pyproject.toml
COPY examples/podcost-strategy-example/pyproject.toml examples/podcost-strategy-example/pyproject.toml
RUN --mount=type=cache,target=/root/.cache/uv --mount=type=secret,id=ca-certificates \
    if [ -s /run/secrets/ca-certificates ]; then export SSL_CERT_FILE=/run/secrets/ca-certificates; fi \
    && uv sync --frozen --no-dev --no-install-workspace
# Then podcost itself, as a regular (non-editable) install, so the source tree is not needed.
COPY libs libs
COPY services services
RUN --mount=type=cache,target=/root/.cache/uv --mount=type=secret,id=ca-certificates \
    if [ -s /run/secrets/ca-certificates ]; then export SSL_CERT_FILE=/run/secrets/ca-certificates; fi \
    && uv sync --frozen --no-dev --no-editable


FROM ${PYTHON_IMAGE} AS runtime

ARG PYTHON_IMAGE
ARG PYTHON
ARG VERSION=0.1.0
ARG REVISION=unknown
LABEL org.opencontainers.image.title="podcost" \
      org.opencontainers.image.description="Steers Kubernetes scale-in: ranks pods with pluggable strategies and writes controller.kubernetes.io/pod-deletion-cost." \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.base.name="${PYTHON_IMAGE}"

# The base image's installers go: the runtime needs none, and a scanner should find none
# (a base made from Debian's packages has none to remove).
RUN if "${PYTHON}" -m pip --version >/dev/null 2>&1; then \
        "${PYTHON}" -m pip uninstall --yes --no-cache-dir pip setuptools wheel; fi \
    && rm -rf /root/.cache

COPY --from=builder /opt/podcost /opt/podcost

# Read-only root filesystem: bytecode was compiled in the builder, HOME and the temporary
# directory are /tmp, and faust's data directory (the aggregator) is under it too. The revision
# is the services' own (build_info, /healthz, spans, logs); the version is the package's.
ENV PATH=/opt/podcost/bin:$PATH \
    PODCOST_REVISION=${REVISION} \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    HOME=/tmp \
    TMPDIR=/tmp \
    PODCOST_AGGREGATOR_DATA_DIR=/tmp/podcost-aggregator \
    PODCOST_HTTP_PORT=8080

# Numeric, so Kubernetes' runAsNonRoot can verify it without a passwd entry.
USER 65532:65532
WORKDIR /tmp
# /healthz, /readyz and /metrics (PODCOST_HTTP_PORT)
EXPOSE 8080

ENTRYPOINT ["podcost"]
CMD ["--help"]
