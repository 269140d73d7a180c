# syntax=docker/dockerfile:1
#
# baton on an official NVIDIA CUDA image, for GPU workers (`device: cuda:N`).
# The CPU-only image is Dockerfile.cpu.
#
#   docker build -t baton .
#   docker run --rm --gpus all --shm-size=2g --stop-timeout 20 \
#       -v /run/baton:/run/baton \
#       -v "$PWD/my.yaml:/etc/baton/baton.yaml:ro" \
#       -v "$PWD/models:/var/lib/baton/models:ro" baton
#
# Why these choices:
# - CUDA 13.0, the toolkit the project builds and tests with (nvcc 13.0 in
#   /usr/local/cuda); the kernels are compiled for CUDA_ARCH (Makefile,
#   sm_90 by default).  nvidia/cuda:13.0.1-devel-ubuntu22.04 and
#   nvidia/cuda:13.0.1-runtime-ubuntu22.04 are tags NVIDIA publishes on
#   Docker Hub (13.0.1 is CUDA 13.0 Update 1; ubuntu24.04 variants exist
#   too).  This file has never been built here: there is no Docker engine
#   on the machines that test the project, so every RUN step is a command
#   of scripts/docker-build.sh, which tests/integration/test_docker.sh runs.
# - NVIDIA publishes CUDA images for Ubuntu (and UBI/Rocky), not Debian.
#   Ubuntu 22.04 is the one whose package names match Debian 12's for every
#   package scripts/install-deps.sh and the runtime stage install (24.04
#   renamed some for 64-bit time_t, e.g. libmicrohttpd12t64), so the same
#   scripts run unchanged.  The versions differ: jammy has protobuf-c 1.3.3
#   and protoc 3.12 (Debian 12: 1.4.1 and 3.21); proto/baton.proto uses
#   nothing newer than proto3 oneof and map, which both support.
# - The runtime stage is the matching -runtime- image: the CUDA runtime,
#   cuBLAS and NCCL that baton-worker loads, without the compiler.
# - No model and no deployment of its own: mount the deployment on
#   /etc/baton/baton.yaml (the one installed there is the CPU example) and
#   the model files it names.  config/examples/chat-gpu.yaml is a GPU
#   deployment; give it absolute paths (/var/lib/baton/models/...) and
#   sockets under /run/baton first.
# - Nothing is EXPOSEd: the default endpoints are ipc:// sockets under
#   /run/baton (bind-mount that folder to reach them from the host); a
#   deployment with daemon.http_listen needs a -p mapping and a host of
#   0.0.0.0 (Dockerfile.cpu does both).  A config that listens on tcp://
#   needs CURVE keys.
# - CPU workers keep their memory pool in POSIX shared memory (/dev/shm),
#   which Docker limits to 64 MiB by default: give --shm-size at least the
#   sum of the CPU workers' pool_mb (or use --ipc=host).  --stop-timeout
#   must exceed daemon.drain_timeout_ms + 3 s (docs/operations.md).

ARG CUDA_VERSION=13.0.1
ARG UBUNTU=ubuntu22.04

# ---------------------------------------------------------------------------
FROM nvidia/cuda:${CUDA_VERSION}-devel-${UBUNTU} AS build

# GPU architecture the CUDA kernels are compiled for (Makefile CUDA_ARCH).
ARG CUDA_ARCH=sm_90
ENV DEBIAN_FRONTEND=noninteractive

WORKDIR /src
# Dependencies first, in their own layer, so that a source change does not
# reinstall them.
COPY scripts/install-deps.sh scripts/install-deps.sh
RUN bash scripts/install-deps.sh --build

COPY . .
# Build with nvcc (-j: every core; a bare -j could exhaust memory with
# nvcc jobs) and install into /stage.  .dockerignore keeps a host build/
# out of the context.
RUN CUDA_ARCH="${CUDA_ARCH}" bash scripts/docker-build.sh stage /stage --no-model

# ---------------------------------------------------------------------------
FROM nvidia/cuda:${CUDA_VERSION}-runtime-${UBUNTU} AS runtime

ENV DEBIAN_FRONTEND=noninteractive
COPY scripts/docker-build.sh /usr/local/lib/baton/docker-build.sh
RUN bash /usr/local/lib/baton/docker-build.sh runtime-deps

# batond starts baton-worker from the folder it runs from: both are in
# /usr/local/bin.
COPY --from=build /stage/ /
RUN bash /usr/local/lib/baton/docker-build.sh setup

# The user baton (uid 10001): a bind-mounted /run/baton must be writable by
# it (or run with --user).  /var/lib/baton is the working folder, so
# relative model paths in a config (models/...) resolve under it.
USER baton
WORKDIR /var/lib/baton
STOPSIGNAL SIGTERM

ENTRYPOINT ["batond"]
CMD ["--config", "/etc/baton/baton.yaml"]
