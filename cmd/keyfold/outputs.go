package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/spf13/cobra"

	"github.com/keyfold/keyfold"
	keyfoldv1 "github.com/keyfold/keyfold/proto/keyfold/v1"
	"github.com/keyfold/keyfold/services/grpcapi/client"
)

func newOutputs() *cobra.Command {
	var (
		nf     nodeFlags
		after  string
		limit  int
		follow bool
	)
	cmd := &cobra.Command{
		Use:   "outputs PIPELINE",
		Short: "Print a pipeline's window results (NDJSON), or follow them as they are stored",
		Long: `Print the results a pipeline's windows emitted, oldest first, one JSON
object per line: the HTTP API's shape, with the cursor each line can be
resumed after (--after).

Without --follow it prints the results stored after --after (from the
oldest kept by default), at most --limit of them (default 100; 0 for all),
and exits. With --follow it then prints each new result as the node stores
it until interrupted (or until --limit results, if given), subscribing
again after the last line printed when the connection breaks.

Results are delivered at least once: a result a node crash made it store
twice has the same id both times.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if limit < 0 {
				return errors.New("--limit must be at least 0")
			}
			if follow && !cmd.Flags().Changed("limit") {
				limit = 0
			}
			c, err := nf.dial(client.Options{})
			if err != nil {
				return err
			}
			defer c.Close()
			p := &outputsPrinter{w: cmd.OutOrStdout(), left: limit}
			if follow {
				return p.follow(cmd.Context(), c, args[0], after)
			}
			return p.list(cmd.Context(), c, args[0], after)
		},
	}
	f := cmd.Flags()
	f.StringVar(&after, "after", "", "print the results stored after this cursor (a line's \"cursor\")")
	f.IntVar(&limit, "limit", 100, "print at most this many results (0: no limit; default unlimited with --follow)")
	f.BoolVarP(&follow, "follow", "f", false, "keep printing new results as they are stored, until interrupted")
	nf.add(cmd)
	return cmd
}

// outputsPrinter writes results as NDJSON, up to a limit.
type outputsPrinter struct {
	w    io.Writer
	left int // results still to print; 0: no limit
}

// errLimit ends a subscription once the limit is printed.
var errLimit = errors.New("limit reached")

// outputsPage is how many results one read asks for.
const outputsPage = 1000

// list prints the stored results after the cursor, page by page.
func (p *outputsPrinter) list(ctx context.Context, c *client.Client, pipeline, after string) error {
	for {
		n := outputsPage
		if p.left > 0 {
			n = min(n, p.left)
		}
		page, next, err := c.Outputs(ctx, pipeline, after, n)
		if err != nil {
			return err
		}
		for _, e := range page {
			if err := p.print(e); err != nil {
				if errors.Is(err, errLimit) {
					return nil
				}
				return err
			}
		}
		if len(page) < n {
			return nil
		}
		after = next
	}
}

// follow prints the stored results after the cursor and then the new
// ones, until ctx ends or the limit is printed.
func (p *outputsPrinter) follow(ctx context.Context, c *client.Client, pipeline, after string) error {
	err := c.Subscribe(ctx, pipeline, after, p.print)
	if errors.Is(err, errLimit) {
		return nil
	}
	return err
}

func (p *outputsPrinter) print(e *keyfoldv1.OutputEntry) error {
	line, err := json.Marshal(outputJSON(e))
	if err != nil {
		return err
	}
	if _, err := fmt.Fprintf(p.w, "%s\n", line); err != nil {
		return err
	}
	if p.left > 0 {
		if p.left--; p.left == 0 {
			return errLimit
		}
	}
	return nil
}

// outputJSON is the Go API's (and so the HTTP API's) form of a result.
func outputJSON(e *keyfoldv1.OutputEntry) keyfold.Output {
	o := e.GetOutput()
	ms := func(v int64) time.Time { return time.UnixMilli(v).UTC() }
	return keyfold.Output{
		Cursor: e.GetCursor(), ID: o.GetId(), Pipeline: o.GetPipeline(), Key: o.GetKey(),
		Kind: o.GetKind(), Name: o.GetName(), Start: ms(o.GetStartMs()), End: ms(o.GetEndMs()),
		Revision: o.GetRevision(), Count: o.GetCount(), Values: json.RawMessage(o.GetValuesJson()),
		Watermark: ms(o.GetWatermarkMs()), Stored: ms(e.GetStoredMs()), Supersedes: o.GetSupersedes(),
	}
}
