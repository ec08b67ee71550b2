# The image deploy/k8s/deployment.yaml runs, ghcr.io/pgevents/consumer: the
# static consumer binary on a distroless base (CA certificates and time
# zones, no shell, no libc), run as a non-root user. `make image` builds it
# with VERSION and COMMIT from git (.git is not in the build context), which
# `consumer version` prints. cmd/consumer/image_test.go checks this file's
# invariants and builds the binary with the same script and runs it.

# The Go minor version follows go.mod's go directive.
FROM golang:1.26 AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
ARG VERSION
ARG COMMIT
# The one build command, shared with `make static` and the test.
RUN VERSION="$VERSION" COMMIT="$COMMIT" sh scripts/build-static.sh /out/consumer

# CA certificates for TLS to PostgreSQL (sslmode=verify-full) and to the
# services handlers call; the nonroot user is 65532, as in the Deployment.
FROM gcr.io/distroless/static-debian12:nonroot
ARG VERSION
ARG COMMIT
LABEL org.opencontainers.image.title="pgevents consumer" \
      org.opencontainers.image.source="https://github.com/pgevents/pgevents" \
      org.opencontainers.image.version="$VERSION" \
      org.opencontainers.image.revision="$COMMIT"
COPY --from=build /out/consumer /consumer
USER 65532:65532
# metricsAddr ":9464": /metrics, /healthz, /readyz.
EXPOSE 9464
ENTRYPOINT ["/consumer"]
CMD ["run", "--config", "/etc/pgevents/db-event-consumer.yml"]
