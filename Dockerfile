# syntax=docker/dockerfile:1
# Multi-stage build: a static binary on a distroless, non-root base.
#   docker build -t ratelimit-proxy .
#   docker run --rm -p 8080:8080 -e UPSTREAM_URL=http://api:8000 -e ADMIN_TOKEN=$(openssl rand -hex 24) ratelimit-proxy
FROM golang:1.26-bookworm AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
RUN CGO_ENABLED=0 GOOS=linux go build -trimpath -ldflags="-s -w" -o /out/ratelimit-proxy ./cmd/ratelimit-proxy

FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/ratelimit-proxy /usr/local/bin/ratelimit-proxy
# The admin listener (metrics, health) must be reachable by Prometheus and
# the orchestrator inside the container network, never published publicly.
# Listening beyond loopback, it needs ADMIN_TOKEN (the start fails without
# it); /metrics, /healthz and /readyz stay open to the scraper.
ENV LISTEN_ADDR=:8080 \
    ADMIN_ADDR=:9090 \
    LOG_FORMAT=json
EXPOSE 8080 9090
USER nonroot:nonroot
ENTRYPOINT ["/usr/local/bin/ratelimit-proxy"]
