// Command cart is a shopping-cart service built on keyfold: each user's
// cart is a key of the "carts" pipeline, changed and read by calls to its
// Go handler (request/reply, exactly-once with an id), counting product
// views from events, emptied by a checkout that emits the order, and
// abandoned by a processing-time timer when left alone. It serves keyfold's HTTP (and, with -grpc, gRPC) API:
//
//	go run ./examples/cart -data /tmp/carts -http 127.0.0.1:8080
//	curl -s -H 'Content-Type: application/json' \
//	  -d '{"request": {"op": "add", "item": "apple", "qty": 2, "price": 40}, "id": "r1"}' \
//	  http://127.0.0.1:8080/v1/pipelines/carts/keys/alice/call
//	{"reply":{"items":{"apple":{"qty":2,"price":40}},"total":80}}
//	curl -s -H 'Content-Type: application/json' -d '{"request": {"op": "checkout"}, "id": "r2"}' \
//	  http://127.0.0.1:8080/v1/pipelines/carts/keys/alice/call
//	{"reply":{"items":2,"total":80}}
//	curl -s http://127.0.0.1:8080/v1/pipelines/carts/outputs   # the order
//
// It drains on SIGINT or SIGTERM, and recovers from a kill -9 by replaying
// its log (crash_test.go).
package main

import (
	"context"
	"flag"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/keyfold/keyfold"
)

func main() {
	dataDir := flag.String("data", "cart-data", "directory of the embedded store")
	httpAddr := flag.String("http", "127.0.0.1:8080", "HTTP listen address")
	grpcAddr := flag.String("grpc", "", "gRPC listen address (empty: none)")
	abandonAfter := flag.Duration("abandon-after", 30*time.Minute, "how long a cart left alone is kept")
	flag.Parse()
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	if err := run(*dataDir, *httpAddr, *grpcAddr, *abandonAfter, log); err != nil {
		log.Error("cart failed", "err", err)
		os.Exit(1)
	}
}

func run(dataDir, httpAddr, grpcAddr string, abandonAfter time.Duration, log *slog.Logger) error {
	cfg, err := config(dataDir, httpAddr, grpcAddr, abandonAfter)
	if err != nil {
		return err
	}
	cfg.Logger = log
	node, err := keyfold.New(cfg)
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	go func() {
		select {
		case <-node.Ready():
			log.Info("cart listening", "http", node.HTTPAddr(), "grpc", node.GRPCAddr())
		case <-ctx.Done():
		}
	}()
	return node.Run(ctx)
}
