package cluster

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"log/slog"
	"net"
	"os"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/keyfold/keyfold/actors"
	"github.com/keyfold/keyfold/actors/fold"
	"github.com/keyfold/keyfold/persistence"
	keyfoldv1 "github.com/keyfold/keyfold/proto/keyfold/v1"
)

// Config configures a node's membership (New).
type Config struct {
	// Name is the cluster's name (it names the lease set in Redis).
	Name string
	// Self is this node's member id: the host:port at which the others
	// reach its gRPC API (see ValidAdvertise).
	Self string
	// Groups is the number of key groups, the same on every member.
	Groups uint32
	// Peers, if set, is a static member list (every member's id, Self
	// among them); otherwise members hold leases in Store's Redis.
	Peers []string
	// Lease is how long a member stays listed without renewing its lease
	// (0: DefaultLease); a static list has no lease, but its renew period
	// (a third of it) still paces the placement loop.
	Lease time.Duration
	// Store is the node's store: the registry of leases lives in its Redis
	// (it must be a Redis store unless Peers is set).
	Store persistence.Store
	// TLSCert is the PEM file of the node's TLS certificate, if it serves
	// TLS: then the members are dialled with TLS, trusting the system roots
	// and this certificate (so that members sharing a self-signed one trust
	// each other).
	TLSCert string
	// MaxMessageBytes is the largest message a member receives
	// (max_body_bytes): it bounds forwarded batches and owners' answers.
	MaxMessageBytes int
	// Pipelines are the node's compiled pipelines (a routed batch is
	// validated with them), and Specs their configurations (an owner's
	// answer is decoded by its aggregates' ops).
	Pipelines map[string]*fold.Pipeline
	Specs     map[string]fold.Spec
	// Status describes this node as its Status call answers (Info).
	Status func() *keyfoldv1.NodeStatus
	Logger *slog.Logger
}

// Host is the local host the placement loop gives key groups to and the
// router hands this node's share of each call to: an *actors.Host.
type Host interface {
	// Owned, SetOwned and Abandon: the groups served here (see actors).
	Owned() []uint32
	SetOwned(ctx context.Context, groups []uint32) error
	Abandon(reason error) []uint32
	// Err is the error that failed the host, if any.
	Err() error
	// GroupOf is the key group of a pipeline's key, in the store's layout
	// (the host reads it when it recovers, before any call is routed).
	GroupOf(pipeline, key string) uint32
	SubmitEvents(ctx context.Context, pipeline string, events []*fold.Event) (actors.Pending, error)
	Query(ctx context.Context, pipeline, key string) (actors.KeyView, error)
	Delete(ctx context.Context, pipeline, key string) error
	Call(ctx context.Context, pipeline, key string, req []byte, o actors.CallOptions) (fold.Reply, error)
}

var _ Host = (*actors.Host)(nil)

// dialOptions are the options of every connection to a member.
func (cfg Config) dialOptions() ([]grpc.DialOption, error) {
	creds, err := peerCredentials(cfg.TLSCert)
	if err != nil {
		return nil, err
	}
	return []grpc.DialOption{grpc.WithTransportCredentials(creds),
		// Members are near each other: reconnect within a second, not
		// gRPC's default of up to two minutes after a long outage.
		grpc.WithConnectParams(grpc.ConnectParams{Backoff: backoff.Config{
			BaseDelay: 50 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: time.Second}}),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(cfg.MaxMessageBytes)),
	}, nil
}

// peerCredentials: plaintext, or TLS when the node serves TLS with the
// certificate in certFile (verifying peers against the system roots and
// that certificate).
func peerCredentials(certFile string) (credentials.TransportCredentials, error) {
	if certFile == "" {
		return insecure.NewCredentials(), nil
	}
	pool, err := x509.SystemCertPool()
	if err != nil {
		pool = x509.NewCertPool()
	}
	pem, err := os.ReadFile(certFile)
	if err != nil {
		return nil, fmt.Errorf("keyfold: cluster: %w", err)
	}
	pool.AppendCertsFromPEM(pem)
	return credentials.NewTLS(&tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}), nil
}

// ValidAdvertise checks a member id: host:port with a specific host.
func ValidAdvertise(addr string) error {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return err
	}
	if port == "0" || port == "" {
		return fmt.Errorf("advertise %q needs a port", addr)
	}
	if host == "" || host == "0.0.0.0" || host == "::" || strings.ContainsAny(addr, " \t\r\n") {
		return fmt.Errorf("advertise %q must name a host the other nodes can reach", addr)
	}
	return nil
}
