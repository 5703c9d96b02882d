# The router image: built from the repository root with
#   docker build -f deploy/router.Dockerfile -t tailserve/router:0.1.0 .
# Stage 1 builds with the project's own scripts on Debian 12; stage 2 holds the binary, the default
# length model and only the runtime libraries, and runs as a non-root user.
FROM debian:bookworm AS build
WORKDIR /src
COPY . .
RUN apt-get update -q && apt-get install -y -q --no-install-recommends sudo \
 && BUILD_TYPE=Release bash scripts/build.sh -DTAILSERVE_CUDA=OFF \
 && strip build/bin/tailserve-router build/bin/tailserve-worker build/bin/tailserve-generate

FROM debian:bookworm-slim
RUN apt-get update -q && apt-get install -y -q --no-install-recommends \
      libgrpc++1.51 libprotobuf32 libabsl20220623 libyaml-cpp0.7 libspdlog1.10 libfmt9 \
      libpcre2-8-0 libutf8proc2 libopenblas0-pthread libonnx1 ca-certificates \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --system --uid 10001 --no-create-home tailserve
COPY --from=build /src/build/bin/tailserve-router /src/build/bin/tailserve-generate /usr/local/bin/
COPY --from=build /src/models/length_predictor.onnx /opt/tailserve/models/length_predictor.onnx
COPY --from=build /src/ladb_config.yaml /etc/tailserve/ladb_config.yaml
USER 10001
EXPOSE 50051 9090
ENTRYPOINT ["/usr/local/bin/tailserve-router"]
CMD ["--config", "/etc/tailserve/ladb_config.yaml"]
