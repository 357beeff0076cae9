# keyfold: one static binary on a distroless base.
FROM golang:1.26-bookworm AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
RUN CGO_ENABLED=0 go build -trimpath -ldflags="-s -w" -o /out/keyfold ./cmd/keyfold \
 && mkdir -p /out/data

FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/keyfold /usr/local/bin/keyfold
COPY examples/quickstart.yaml /etc/keyfold/keyfold.yaml
# The data directory must exist, owned by the nonroot user, before the volume
# is mounted: a new named volume takes the image directory's ownership.
COPY --from=build --chown=65532:65532 /out/data /var/lib/keyfold
VOLUME /var/lib/keyfold
EXPOSE 8080 9090
ENTRYPOINT ["/usr/local/bin/keyfold"]
CMD ["serve", "--config", "/etc/keyfold/keyfold.yaml", "--data", "/var/lib/keyfold", "--http", "0.0.0.0:8080", "--grpc", "0.0.0.0:9090", "--log-format", "json"]
