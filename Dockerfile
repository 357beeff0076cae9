# keyfold: one binary on a distroless base with glibc.
#
# Built with cgo (the golang image has a C compiler): Pebble then keeps its
# block cache and memtables in C memory, outside the Go heap. Without cgo
# they are Go allocations, and at a few million keys the collector pays for
# them: 42k against 55k events/s of first-time keys at three million keys,
# a preload of ten million keys four times slower (BENCHMARKS.md, session
# 23). The binary needs only glibc (libc, and libresolv for the net
# package), which distroless/base has: the builder and the base are both
# Debian 12, and must move together (a newer builder's glibc symbols would
# not be found here).
FROM golang:1.26-bookworm AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
RUN CGO_ENABLED=1 go build -trimpath -ldflags="-s -w" -o /out/keyfold ./cmd/keyfold \
 && mkdir -p /out/data

FROM gcr.io/distroless/base-debian12:nonroot
COPY --from=build /out/keyfold /usr/local/bin/keyfold
COPY examples/quickstart.yaml /etc/keyfold/keyfold.yaml
# The data directory must exist, owned by the nonroot user, before the volume
# is mounted: a new named volume takes the image directory's ownership.
COPY --from=build --chown=65532:65532 /out/data /var/lib/keyfold
VOLUME /var/lib/keyfold
EXPOSE 8080 9090
ENTRYPOINT ["/usr/local/bin/keyfold"]
CMD ["serve", "--config", "/etc/keyfold/keyfold.yaml", "--data", "/var/lib/keyfold", "--http", "0.0.0.0:8080", "--grpc", "0.0.0.0:9090", "--log-format", "json"]
