# syntax=docker/dockerfile:1
#
# baton on an official NVIDIA CUDA image.
#
#   docker build -t baton .
#   docker run --rm --gpus all --shm-size=2g \
#       -v /run/baton:/run/baton \
#       -v "$PWD/my.yaml:/etc/baton/baton.yaml:ro" \
#       -v "$PWD/models:/var/lib/baton/models:ro" baton
#
# Why these choices:
# - NVIDIA publishes CUDA images for Ubuntu (and UBI/Rocky), not Debian, so
#   the base is Ubuntu 22.04 (jammy). scripts/install-deps.sh is written for
#   Debian 12; every package it names also exists under the same name in
#   jammy (libzmq3-dev, libprotobuf-c-dev, protobuf-c-compiler,
#   protobuf-compiler, libyaml-dev, libjemalloc-dev, libcmocka-dev,
#   libopenblas-dev, libsystemd-dev, python3-zmq, python3-protobuf,
#   python3-yaml, ...), so the script runs unchanged. The versions differ:
#   jammy has protobuf-c 1.3.3 and protoc 3.12 (Debian 12: 1.4.1 and 3.21);
#   proto/baton.proto uses nothing newer than proto3 oneof and map, which
#   both support.
# - The runtime stage uses the matching -runtime- image: it carries the CUDA
#   runtime, cuBLAS and NCCL that baton-worker links against, without the
#   compiler. Runtime library package names on jammy are the same as on
#   Debian 12 (libzmq5, libprotobuf-c1, libyaml-0-2, libjemalloc2,
#   libopenblas0, libsystemd0).
# - Nothing is EXPOSEd: the default endpoints are ipc:// sockets under
#   /run/baton (bind-mount that folder to reach them from the host). A
#   config that listens on tcp:// needs CURVE keys and a -p mapping.
# - CPU workers keep their memory pool in POSIX shared memory (/dev/shm),
#   which Docker limits to 64 MiB by default: give --shm-size at least the
#   sum of the CPU workers' pool_mb (or use --ipc=host).

ARG CUDA_VERSION=12.4.1
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
RUN bash scripts/install-deps.sh && rm -rf /var/lib/apt/lists/*

COPY . .
# A host build folder is excluded by .dockerignore; remove it anyway so that
# objects built against the host's libraries can never be reused here.
# -j$(nproc) rather than a bare -j: unbounded nvcc jobs can exhaust memory.
RUN rm -rf build && make -j"$(nproc)" CUDA_ARCH="${CUDA_ARCH}"

# ---------------------------------------------------------------------------
FROM nvidia/cuda:${CUDA_VERSION}-runtime-${UBUNTU} AS runtime

ENV DEBIAN_FRONTEND=noninteractive
RUN apt-get update -q \
 && apt-get install -y -q --no-install-recommends \
        libzmq5 libprotobuf-c1 libyaml-0-2 libjemalloc2 libopenblas0 libsystemd0 \
 && rm -rf /var/lib/apt/lists/*

# batond, and baton-worker / batonctl once they exist: the pattern copies
# whichever programs this build produced. batond starts baton-worker from
# the folder it runs from, so both must stay side by side.
COPY --from=build /src/build/bat* /usr/local/bin/
COPY --from=build /src/config/examples/ /usr/local/share/baton/examples/

# /etc/baton/baton.yaml is expected to be mounted; /run/baton holds the ipc
# sockets; /var/lib/baton is the working folder, so relative model paths in
# a config (models/...) resolve under it.
RUN useradd --system --uid 10001 --home-dir /var/lib/baton --shell /usr/sbin/nologin baton \
 && mkdir -p /etc/baton /run/baton /var/lib/baton/models \
 && chown baton:baton /run/baton /var/lib/baton /var/lib/baton/models

# A bind-mounted /run/baton must be writable by uid 10001 (or run with --user).
USER baton
WORKDIR /var/lib/baton

ENTRYPOINT ["batond"]
CMD ["--config", "/etc/baton/baton.yaml"]
