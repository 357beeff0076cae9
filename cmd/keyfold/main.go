// Command keyfold runs and talks to keyfold nodes. It turns flags into a
// keyfold.Config and holds no logic of its own.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := newRoot().ExecuteContext(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "error:", err)
		os.Exit(1)
	}
}

func newRoot() *cobra.Command {
	root := &cobra.Command{
		Use:           "keyfold",
		Short:         "keyfold: a stateful event service: keyed events folded into durable state",
		SilenceUsage:  true,
		SilenceErrors: true,
		Version:       version(),
	}
	root.SetVersionTemplate("keyfold {{.Version}}\n")
	root.AddCommand(newServe(), newSend(), newGet(), newDelete(), newCluster(), newOutputs(), newBench(), newHealth(), newConfig(), newVersion())
	return root
}
