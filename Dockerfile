# blocksync image: the same scripts/setup_env.sh as `make setup`, so the two cannot drift.
#
#   docker build -t blocksync .                                                     # CPU
#   docker build -t blocksync:cuda --build-arg BLOCKSYNC_CUDA=1 \
#     --build-arg BUILD_IMAGE=nvidia/cuda:12.4.1-cudnn-devel-ubuntu22.04 \
#     --build-arg RUNTIME_IMAGE=nvidia/cuda:12.4.1-cudnn-runtime-ubuntu22.04 .      # CUDA, Horovod with NCCL
#   podman build --build-arg CPU_IMAGE=localhost/blocksync-base:bookworm -t blocksync .
#       where no registry is reachable: scripts/debian_base_image.sh builds that base from Debian's packages
#
# Stage 1 (builder) creates /opt/venv with every pinned package and builds the patched Horovod 0.28.1
# wheel; stage 2 (runtime) is slim: Java 17, the venv, the project, and a non-root user. One path for
# CPU and CUDA, chosen by image arguments only (no stage named by a variable: buildah, podman's builder,
# does not resolve `FROM stage-${VAR}`). The dependencies are installed before the sources are copied,
# so a rebuild after a source change reuses them from the build cache.
ARG CPU_IMAGE=python:3.11-slim-bookworm
ARG BUILD_IMAGE=${CPU_IMAGE}
ARG RUNTIME_IMAGE=${CPU_IMAGE}

FROM ${BUILD_IMAGE} AS builder
# 1: Horovod is built with NCCL (scripts/setup_env.sh sets HOROVOD_GPU_OPERATIONS=NCCL).
ARG BLOCKSYNC_CUDA=0
# Where pip finds wheels beyond the index (a folder mounted into the build, e.g. a local torch CPU wheel):
# build args reach RUN steps as environment variables, and pip reads PIP_FIND_LINKS.
ARG PIP_FIND_LINKS
# python3.11 is in the CPU base images; the CUDA (Ubuntu) images need it installed.
RUN apt-get update && apt-get install -y --no-install-recommends g++ make cmake openjdk-17-jre-headless git \
    && (command -v python3.11 >/dev/null || apt-get install -y --no-install-recommends \
        python3.11 python3.11-venv python3.11-dev) \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /app
# Only what the dependencies depend on: a change to the sources reuses this stage's layers (and the
# runtime's copy of /opt/venv) from the build cache, instead of reinstalling 3 GB of packages.
COPY requirements.lock pyproject.toml ./
COPY scripts/setup_env.sh scripts/
# No JVM class archive (scripts/setup_env.sh): it is recorded by running the demo, whose files are not
# copied into this stage; the image's local sessions start without it.
RUN VENV=/opt/venv PYTHON=python3.11 BLOCKSYNC_WHEEL_CACHE=/opt/wheels BLOCKSYNC_JVM_ARCHIVE=0 \
    BLOCKSYNC_DEPS_ONLY=1 bash scripts/setup_env.sh

# Its own stage so that a build cache can keep it by name (`--target runtime-base`).
FROM ${RUNTIME_IMAGE} AS runtime-base
RUN apt-get update && apt-get install -y --no-install-recommends openjdk-17-jre-headless procps \
    && (command -v python3.11 >/dev/null || apt-get install -y --no-install-recommends python3.11) \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --create-home --uid 1000 blocksync

# The dependencies on the slim base, also a stage of its own (`--target runtime-deps`): kept by name, a
# rebuild after a source change reuses this 3 GB layer instead of copying the venv again.
FROM runtime-base AS runtime-deps
COPY --from=builder /opt/venv /opt/venv

FROM runtime-deps AS runtime
COPY --chown=blocksync . /app
WORKDIR /app
# blocksync itself, editable as `make setup` installs it (setuptools is pinned in the venv, so no index).
RUN /opt/venv/bin/python -m pip install -q --no-deps --no-build-isolation --no-index -e /app \
    && rm -rf /app/lib/*.egg-info
ENV PATH=/opt/venv/bin:$PATH PYSPARK_PYTHON=/opt/venv/bin/python PYSPARK_DRIVER_PYTHON=/opt/venv/bin/python
USER blocksync
CMD ["blocksync", "run", "--config", "conf/local.yaml", "--overwrite", "--quiet"]
