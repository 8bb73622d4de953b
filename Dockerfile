# blocksync image: the same scripts/setup_env.sh as `make setup`, so the two cannot drift.
#
#   docker build -t blocksync .                                   # CPU
#   docker build -t blocksync:cuda --build-arg BASE=cuda .        # CUDA, Horovod with NCCL
#
# Stage 1 (builder) creates /opt/venv with every pinned package and builds the
# patched Horovod 0.28.1 wheel; stage 2 (runtime) is slim: Java 17, the venv,
# the project, and a non-root user.
ARG BASE=cpu
ARG CPU_IMAGE=python:3.11-slim-bookworm
ARG CUDA_IMAGE=nvidia/cuda:12.4.1-cudnn-devel-ubuntu22.04
ARG CUDA_RUNTIME_IMAGE=nvidia/cuda:12.4.1-cudnn-runtime-ubuntu22.04

FROM ${CPU_IMAGE} AS base-cpu
ENV BLOCKSYNC_CUDA=0
FROM ${CUDA_IMAGE} AS base-cuda
# On CUDA, Horovod is built with NCCL (scripts/setup_env.sh sets HOROVOD_GPU_OPERATIONS=NCCL).
ENV BLOCKSYNC_CUDA=1
RUN apt-get update && apt-get install -y --no-install-recommends python3.11 python3.11-venv python3.11-dev \
    && rm -rf /var/lib/apt/lists/*

FROM base-${BASE} AS builder
RUN apt-get update && apt-get install -y --no-install-recommends \
        g++ make cmake openjdk-17-jre-headless git \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /app
COPY requirements.lock pyproject.toml README.md ./
COPY scripts/ scripts/
COPY lib/ lib/
# No JVM class archive (scripts/setup_env.sh): it is recorded by running the demo, whose files are not
# copied into this stage; the image's local sessions start without it.
RUN VENV=/opt/venv PYTHON=python3.11 BLOCKSYNC_WHEEL_CACHE=/opt/wheels BLOCKSYNC_JVM_ARCHIVE=0 bash scripts/setup_env.sh

FROM ${CPU_IMAGE} AS runtime-cpu
FROM ${CUDA_RUNTIME_IMAGE} AS runtime-cuda
RUN apt-get update && apt-get install -y --no-install-recommends python3.11 && rm -rf /var/lib/apt/lists/*

FROM runtime-${BASE} AS runtime
RUN apt-get update && apt-get install -y --no-install-recommends openjdk-17-jre-headless procps \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --create-home --uid 1000 blocksync
COPY --from=builder /opt/venv /opt/venv
COPY --chown=blocksync . /app
WORKDIR /app
ENV PATH=/opt/venv/bin:$PATH PYSPARK_PYTHON=/opt/venv/bin/python PYSPARK_DRIVER_PYTHON=/opt/venv/bin/python
USER blocksync
CMD ["blocksync", "run", "--config", "conf/local.yaml", "--overwrite", "--quiet"]
