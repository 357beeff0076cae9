package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/keyfold/keyfold/services/httpapi"
	"github.com/spf13/cobra"
)

func newSend() *cobra.Command {
	var (
		addr    string
		batch   int
		retries int
		quiet   bool
	)
	cmd := &cobra.Command{
		Use:   "send PIPELINE [FILE]",
		Short: "Send events from a file or stdin (JSON array or NDJSON) to a node",
		Long: `Send events to a node in batches, in order, each acknowledged (durable)
before the next is sent. The input is a JSON array of event objects or
newline-delimited JSON, from FILE or standard input. A batch the node could
not take (503, 504 or a lost connection) is retried: that is safe for events
that carry the pipeline's id field, which are applied once.`,
		Args: cobra.RangeArgs(1, 2),
		RunE: func(cmd *cobra.Command, args []string) error {
			in := io.Reader(os.Stdin)
			if len(args) == 2 && args[1] != "-" {
				f, err := os.Open(args[1])
				if err != nil {
					return err
				}
				defer f.Close()
				in = f
			}
			if batch < 1 {
				return errors.New("--batch must be at least 1")
			}
			c := &httpapi.Client{Base: addr}
			return send(cmd.Context(), c, args[0], in, batch, retries, quiet, cmd.ErrOrStderr())
		},
	}
	f := cmd.Flags()
	f.StringVar(&addr, "addr", "http://127.0.0.1:8080", "the node's HTTP base URL")
	f.IntVar(&batch, "batch", 500, "events per request")
	f.IntVar(&retries, "retries", 5, "retries of a batch the node could not take")
	f.BoolVarP(&quiet, "quiet", "q", false, "no progress lines")
	return cmd
}

// send streams events from in to the pipeline in batches.
func send(ctx context.Context, c *httpapi.Client, pipeline string, in io.Reader, batch, retries int, quiet bool, log io.Writer) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel() // stops the decoder if a batch fails
	events, errc := decodeEvents(ctx, in)
	start, lastReport := time.Now(), time.Now()
	var sent, accepted, dups int
	buf := make([]json.RawMessage, 0, batch)
	flush := func() error {
		if len(buf) == 0 {
			return nil
		}
		a, d, err := ingestWithRetry(ctx, c, pipeline, buf, retries, log)
		if err != nil {
			return fmt.Errorf("batch of events %d..%d: %w", sent, sent+len(buf)-1, err)
		}
		sent, accepted, dups = sent+len(buf), accepted+a, dups+d
		buf = buf[:0]
		if !quiet && time.Since(lastReport) > 2*time.Second {
			lastReport = time.Now()
			fmt.Fprintf(log, "sent %d events (%.0f/s)\n", sent, float64(sent)/time.Since(start).Seconds())
		}
		return nil
	}
	for ev := range events {
		buf = append(buf, ev)
		if len(buf) == batch {
			if err := flush(); err != nil {
				return err
			}
		}
	}
	if err := <-errc; err != nil {
		return fmt.Errorf("input after event %d: %w", sent+len(buf), err)
	}
	if err := flush(); err != nil {
		return err
	}
	if !quiet {
		fmt.Fprintf(log, "sent %d events: %d accepted, %d duplicates, in %v\n", sent, accepted, dups, time.Since(start).Round(time.Millisecond))
	}
	return nil
}

func ingestWithRetry(ctx context.Context, c *httpapi.Client, pipeline string, events []json.RawMessage, retries int, log io.Writer) (int, int, error) {
	backoff := 100 * time.Millisecond
	for attempt := 0; ; attempt++ {
		a, d, err := c.Ingest(ctx, pipeline, events)
		if err == nil {
			return a, d, nil
		}
		var se *httpapi.StatusError
		retryable := !errors.As(err, &se) || se.Retryable()
		if !retryable || attempt >= retries || ctx.Err() != nil {
			return 0, 0, err
		}
		fmt.Fprintf(log, "retrying in %v: %v\n", backoff, err)
		select {
		case <-time.After(backoff):
		case <-ctx.Done():
			return 0, 0, ctx.Err()
		}
		backoff = min(2*backoff, 5*time.Second)
	}
}

// decodeEvents streams the values of a JSON array, or of a sequence of JSON
// values (NDJSON), without holding the input in memory.
func decodeEvents(ctx context.Context, in io.Reader) (<-chan json.RawMessage, <-chan error) {
	out, errc := make(chan json.RawMessage, 1024), make(chan error, 1)
	go func() {
		defer close(out)
		br := bufio.NewReaderSize(in, 1<<20)
		dec := json.NewDecoder(br)
		array := false
		if b, err := peekNonSpace(br); err == nil && b == '[' {
			if _, err := dec.Token(); err != nil {
				errc <- err
				return
			}
			array = true
		}
		for array && dec.More() || !array {
			var ev json.RawMessage
			if err := dec.Decode(&ev); err != nil {
				if err == io.EOF && !array {
					break
				}
				errc <- err
				return
			}
			select {
			case out <- ev:
			case <-ctx.Done():
				errc <- ctx.Err()
				return
			}
		}
		errc <- nil
	}()
	return out, errc
}

func peekNonSpace(br *bufio.Reader) (byte, error) {
	for {
		b, err := br.ReadByte()
		if err != nil {
			return 0, err
		}
		if b != ' ' && b != '\t' && b != '\n' && b != '\r' {
			return b, br.UnreadByte()
		}
	}
}

func newGet() *cobra.Command {
	var addr string
	cmd := &cobra.Command{
		Use:   "get PIPELINE KEY",
		Short: "Print one key's state",
		Args:  cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			c := &httpapi.Client{Base: addr}
			st, err := c.Query(cmd.Context(), args[0], args[1])
			if err != nil {
				return err
			}
			var pretty bytes.Buffer
			if err := json.Indent(&pretty, st, "", "  "); err != nil {
				return err
			}
			pretty.WriteByte('\n')
			_, err = cmd.OutOrStdout().Write(pretty.Bytes())
			return err
		},
	}
	cmd.Flags().StringVar(&addr, "addr", "http://127.0.0.1:8080", "the node's HTTP base URL")
	return cmd
}
