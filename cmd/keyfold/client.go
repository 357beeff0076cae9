package main

import (
	"bufio"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/schollz/progressbar/v3"
	"github.com/spf13/cobra"
	"google.golang.org/grpc/credentials"

	"github.com/keyfold/keyfold/services/grpcapi/client"
)

func newSend() *cobra.Command {
	var (
		addr     string
		batch    int
		window   int
		retries  int
		quiet    bool
		progress bool
		tf       tlsFlags
	)
	cmd := &cobra.Command{
		Use:   "send PIPELINE [FILE]",
		Short: "Stream events from a file or stdin (NDJSON or a JSON array) to a node over gRPC",
		Long: `Stream events to a node over gRPC, in batches of --batch on one
IngestStream with up to --window batches awaiting their acknowledgement
(each ack means durable). The input is newline-delimited JSON or a JSON
array of event objects, from FILE or standard input.

A batch the node could not take (unavailable, overloaded, a lost
connection) is sent again, up to --retries times: safe for events that
carry the pipeline's id field, which are applied once. An event the node
rejects is reported (its number in the input, the field, why) and skipped;
the rest of its batch is sent again, after the batches already in flight.
The command then exits 1.

A progress line shows on a terminal; the summary gives events/s,
duplicates and rejects.`,
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
			if batch < 1 || window < 1 {
				return errors.New("--batch and --window must be at least 1")
			}
			if retries <= 0 {
				retries = -1 // the client's "never" (its 0 means the default)
			}
			c, err := tf.dial(addr, client.Options{MaxRetries: retries})
			if err != nil {
				return err
			}
			defer c.Close()
			s := &sender{c: c, pipeline: args[0], batch: batch, window: window, quiet: quiet,
				progress: progress && !quiet, log: cmd.ErrOrStderr()}
			return s.run(cmd.Context(), in)
		},
	}
	f := cmd.Flags()
	f.StringVar(&addr, "addr", "127.0.0.1:9090", "the node's gRPC address")
	f.IntVar(&batch, "batch", 500, "events per batch")
	f.IntVar(&window, "window", 8, "batches in flight, awaiting their acks")
	f.IntVar(&retries, "retries", 5, "retries of a batch the node could not take")
	f.BoolVarP(&quiet, "quiet", "q", false, "print nothing but errors")
	f.BoolVar(&progress, "progress", isTerminal(os.Stderr), "show a progress line (default: when stderr is a terminal)")
	tf.add(cmd)
	return cmd
}

func isTerminal(f *os.File) bool {
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}

// sender streams the events of one input to a pipeline, reporting rejects
// and progress.
type sender struct {
	c        *client.Client
	pipeline string
	batch    int
	window   int
	quiet    bool
	progress bool
	log      io.Writer
}

func (s *sender) run(ctx context.Context, in io.Reader) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel() // stops the decoder
	var bar *progressbar.ProgressBar
	if s.progress {
		bar = progressbar.NewOptions64(-1, progressbar.OptionSetWriter(s.log), progressbar.OptionSetDescription("events"),
			progressbar.OptionShowCount(), progressbar.OptionShowIts(), progressbar.OptionSetItsString("events"),
			progressbar.OptionThrottle(200*time.Millisecond), progressbar.OptionClearOnFinish())
	}
	start := time.Now()
	events, errc := decodeEvents(ctx, in)
	input := func(yield func([]byte, error) bool) {
		for ev := range events {
			if !yield(ev, nil) {
				return
			}
		}
		if err := <-errc; err != nil {
			yield(nil, err)
		}
	}
	sum, err := s.c.Send(ctx, s.pipeline, input, client.SendOptions{
		Batch:  s.batch,
		Window: s.window,
		OnRejected: func(i int, err *client.Error) {
			what := err.Message
			if err.Field != "" {
				what = fmt.Sprintf("field %q: %s", err.Field, err.Message)
			}
			fmt.Fprintf(s.log, "event %d rejected: %s\n", i+1, what) // numbered from 1, as lines are
		},
		OnAcked: func(n int, _ client.Result) {
			if bar != nil {
				bar.Add(n)
			}
		},
	})
	if err != nil {
		return err
	}
	if bar != nil {
		bar.Finish()
	}
	took := time.Since(start)
	if !s.quiet {
		fmt.Fprintf(s.log, "sent %d events in %v (%.0f events/s): %d accepted, %d duplicates, %d rejected\n",
			sum.Sent, took.Round(time.Millisecond), float64(sum.Sent)/took.Seconds(), sum.Accepted, sum.Duplicates, sum.Rejected)
	}
	if sum.Rejected > 0 {
		return fmt.Errorf("%d events rejected", sum.Rejected)
	}
	return nil
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
	var (
		addr string
		tf   tlsFlags
	)
	cmd := &cobra.Command{
		Use:   "get PIPELINE KEY",
		Short: "Print one key's state (as JSON)",
		Args:  cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := tf.dial(addr, client.Options{})
			if err != nil {
				return err
			}
			defer c.Close()
			st, err := c.GetState(cmd.Context(), args[0], args[1])
			if err != nil {
				return err
			}
			// The HTTP API's shape, in its order.
			out, err := json.MarshalIndent(struct {
				Pipeline   string         `json:"pipeline"`
				Key        string         `json:"key"`
				Seq        uint64         `json:"seq"`
				Duplicates uint64         `json:"duplicates"`
				Aggregates map[string]any `json:"aggregates"`
			}{st.Pipeline, st.Key, st.Seq, st.Duplicates, st.Aggregates}, "", "  ")
			if err != nil {
				return err
			}
			_, err = fmt.Fprintf(cmd.OutOrStdout(), "%s\n", out)
			return err
		},
	}
	cmd.Flags().StringVar(&addr, "addr", "127.0.0.1:9090", "the node's gRPC address")
	tf.add(cmd)
	return cmd
}

// tlsFlags are the client's TLS flags of the gRPC commands.
type tlsFlags struct {
	on bool   // TLS with the system's roots
	ca string // TLS trusting this CA (PEM)
}

func (f *tlsFlags) add(cmd *cobra.Command) {
	cmd.Flags().BoolVar(&f.on, "tls", false, "connect with TLS, trusting the system's CAs")
	cmd.Flags().StringVar(&f.ca, "tls-ca", "", "connect with TLS, trusting this CA certificate (PEM)")
}

// dial connects to addr with o and the flags' transport security.
func (f *tlsFlags) dial(addr string, o client.Options) (*client.Client, error) {
	switch {
	case f.ca != "":
		creds, err := credentials.NewClientTLSFromFile(f.ca, "")
		if err != nil {
			return nil, fmt.Errorf("--tls-ca: %w", err)
		}
		o.TLS = creds
	case f.on:
		o.TLS = credentials.NewTLS(&tls.Config{MinVersion: tls.VersionTLS12})
	}
	return client.Dial(addr, o)
}
