package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/spf13/cobra"
)

// newHealth checks a node's readiness: the distroless image has no shell
// or curl, so container health checks run the binary itself.
func newHealth() *cobra.Command {
	var (
		addr    string
		timeout time.Duration
	)
	cmd := &cobra.Command{
		Use:   "health",
		Short: "Exit 0 if the node at --addr is ready (GET /readyz answers 200), 1 otherwise",
		Long: `Ask a node whether it is ready: GET /readyz on its HTTP API. A node is
ready once it has recovered its state (in a cluster: once it serves its
share of the key groups) and until it starts draining. For container
health checks (the image has no shell or curl).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx, cancel := context.WithTimeout(cmd.Context(), timeout)
			defer cancel()
			req, err := http.NewRequestWithContext(ctx, http.MethodGet, strings.TrimSuffix(addr, "/")+"/readyz", nil)
			if err != nil {
				return err
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				return fmt.Errorf("not ready: %w", err)
			}
			defer resp.Body.Close()
			body, _ := io.ReadAll(io.LimitReader(resp.Body, 1024))
			if resp.StatusCode != http.StatusOK {
				return fmt.Errorf("not ready: %s %s", resp.Status, strings.TrimSpace(string(body)))
			}
			fmt.Fprintln(cmd.OutOrStdout(), "ready")
			return nil
		},
	}
	cmd.Flags().StringVar(&addr, "addr", "http://127.0.0.1:8080", "the node's HTTP base URL")
	cmd.Flags().DurationVar(&timeout, "timeout", 2*time.Second, "give up after this long")
	return cmd
}
