# The CUDA worker image: built from the repository root with
#   docker build -f deploy/worker.Dockerfile -t tailserve/worker-cuda:0.1.0 .
# Stage 1 builds for Hopper (sm_90) on the NVIDIA CUDA devel image; stage 2 is the CUDA runtime
# image with cuBLAS and only the runtime libraries, running as a non-root user. The model comes
# from a volume (helm: worker.modelVolume), not the image.
ARG CUDA_VERSION=13.0.0
FROM nvidia/cuda:${CUDA_VERSION}-devel-ubuntu24.04 AS build
WORKDIR /src
COPY . .
RUN apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
      build-essential cmake ninja-build pkg-config git libgrpc++-dev libgrpc-dev protobuf-compiler-grpc \
      libprotobuf-dev protobuf-compiler libabsl-dev libyaml-cpp-dev libgtest-dev libgmock-dev libbenchmark-dev \
      libcpp-httplib-dev nlohmann-json3-dev libspdlog-dev libfmt-dev libcli11-dev libpcre2-dev libutf8proc-dev \
      libopenblas-dev libonnx-dev libssl-dev zlib1g-dev \
 && cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DTAILSERVE_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
 && cmake --build build --target tailserve-worker tailserve-make-checkpoint \
 && strip build/bin/tailserve-worker build/bin/tailserve-make-checkpoint

FROM nvidia/cuda:${CUDA_VERSION}-runtime-ubuntu24.04
RUN apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
      libgrpc++1.51t64 libprotobuf32t64 libabsl20220623t64 libyaml-cpp0.8 libspdlog1.12 libfmt9 \
      libpcre2-8-0 libutf8proc3 libopenblas0-pthread libonnx1t64 \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --system --uid 10001 --no-create-home tailserve
COPY --from=build /src/build/bin/tailserve-worker /src/build/bin/tailserve-make-checkpoint /usr/local/bin/
USER 10001
EXPOSE 50061 9091
ENTRYPOINT ["/usr/local/bin/tailserve-worker"]
CMD ["--config", "/etc/tailserve/ladb_config.yaml", "--backend", "cuda"]
