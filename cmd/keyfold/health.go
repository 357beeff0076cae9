package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/keyfold/keyfold/services/grpcapi/client"
)

// newHealth checks a node's readiness: the distroless image has no shell
// or curl, so container health checks run the binary itself.
func newHealth() *cobra.Command {
	var (
		nf      nodeFlags
		httpURL string
		timeout time.Duration
	)
	cmd := &cobra.Command{
		Use:   "health",
		Short: "Exit 0 if the node is ready (gRPC health SERVING, or GET /readyz 200 with --http), 1 otherwise",
		Long: `Ask a node whether it is ready: the standard gRPC health service at
--addr, or GET /readyz on the HTTP API at --http. A node is ready once it
has recovered its state (in a cluster: once it serves its share of the key
groups) and until it starts draining. For container health checks (the
image has no shell or curl).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx, cancel := context.WithTimeout(cmd.Context(), timeout)
			defer cancel()
			var err error
			if httpURL != "" {
				err = readyHTTP(ctx, httpURL)
			} else {
				err = readyGRPC(ctx, nf)
			}
			if err != nil {
				return fmt.Errorf("not ready: %w", err)
			}
			fmt.Fprintln(cmd.OutOrStdout(), "ready")
			return nil
		},
	}
	nf.add(cmd)
	cmd.Flags().StringVar(&httpURL, "http", "", "check GET /readyz at this HTTP base URL (e.g. http://127.0.0.1:8080) instead of gRPC health at --addr")
	cmd.Flags().DurationVar(&timeout, "timeout", 2*time.Second, "give up after this long")
	return cmd
}

func readyGRPC(ctx context.Context, nf nodeFlags) error {
	c, err := nf.dial(client.Options{})
	if err != nil {
		return err
	}
	defer c.Close()
	return c.Ready(ctx)
}

func readyHTTP(ctx context.Context, base string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, strings.TrimSuffix(base, "/")+"/readyz", nil)
	if err != nil {
		return fmt.Errorf("--http: %w", err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 1024))
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s %s", resp.Status, strings.TrimSpace(string(body)))
	}
	return nil
}
