package main

import (
	"crypto/tls"
	"fmt"
	"strings"

	"github.com/spf13/cobra"
	"google.golang.org/grpc/credentials"

	"github.com/keyfold/keyfold/services/grpcapi/client"
)

// defaultGRPCAddr is where `keyfold serve` listens for gRPC by default.
const defaultGRPCAddr = "127.0.0.1:9090"

// nodeFlags are the flags of every command that talks to a node: --addr is
// always the node's gRPC host:port (the HTTP API, where a command can use
// it, is --http, as in serve), with its transport security.
type nodeFlags struct {
	addr string
	tls  bool   // TLS with the system's roots
	ca   string // TLS trusting this CA (PEM)
}

func (f *nodeFlags) add(cmd *cobra.Command) {
	cmd.Flags().StringVar(&f.addr, "addr", defaultGRPCAddr, "the node's gRPC address (host:port)")
	cmd.Flags().BoolVar(&f.tls, "tls", false, "connect with TLS, trusting the system's CAs")
	cmd.Flags().StringVar(&f.ca, "tls-ca", "", "connect with TLS, trusting this CA certificate (PEM)")
}

// checkGRPCAddr refuses what is not a gRPC host:port, such as an HTTP URL
// given out of habit.
func checkGRPCAddr(flag, addr string) error {
	if strings.Contains(addr, "://") {
		return fmt.Errorf("%s %q: want the node's gRPC host:port (e.g. %s); the HTTP API's URL goes in --http where a command takes it", flag, addr, defaultGRPCAddr)
	}
	if addr == "" {
		return fmt.Errorf("%s: empty address", flag)
	}
	return nil
}

// dial connects to the node with o and the flags' transport security.
func (f *nodeFlags) dial(o client.Options) (*client.Client, error) {
	if err := checkGRPCAddr("--addr", f.addr); err != nil {
		return nil, err
	}
	switch {
	case f.ca != "":
		creds, err := credentials.NewClientTLSFromFile(f.ca, "")
		if err != nil {
			return nil, fmt.Errorf("--tls-ca: %w", err)
		}
		o.TLS = creds
	case f.tls:
		o.TLS = credentials.NewTLS(&tls.Config{MinVersion: tls.VersionTLS12})
	}
	return client.Dial(f.addr, o)
}
