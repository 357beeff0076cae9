package main

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"sync"
	"time"

	"github.com/schollz/progressbar/v3"
	"github.com/spf13/cobra"

	"github.com/keyfold/keyfold/services/grpcapi/client"
)

func newSend() *cobra.Command {
	var (
		nf       nodeFlags
		batch    int
		window   int
		retries  int
		quiet    bool
		progress bool
		skip     bool
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
rejects is reported (its line in NDJSON, its number in an array; the
field; why) and skipped; the rest of its batch is sent again, after the
batches already in flight. The command then exits 1.

A line that is not JSON stops the input there: what came before it is
sent and acknowledged, and the command exits 1 naming the line. With
--skip-malformed such lines are reported and skipped instead (a JSON
array cannot be resumed past a syntax error: it always stops).

A progress line shows on a terminal; the summary, printed even when the
command fails, says what was acknowledged: events/s, accepted,
duplicates, rejected and malformed.`,
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
			c, err := nf.dial(client.Options{MaxRetries: retries})
			if err != nil {
				return err
			}
			defer c.Close()
			s := &sender{c: c, pipeline: args[0], batch: batch, window: window, quiet: quiet,
				progress: progress && !quiet, log: cmd.ErrOrStderr(), skipMalformed: skip}
			return s.run(cmd.Context(), in)
		},
	}
	f := cmd.Flags()
	f.IntVar(&batch, "batch", 500, "events per batch")
	f.IntVar(&window, "window", 8, "batches in flight, awaiting their acks")
	f.IntVar(&retries, "retries", 5, "retries of a batch the node could not take")
	f.BoolVarP(&quiet, "quiet", "q", false, "print nothing but errors (and the summary when something failed)")
	f.BoolVar(&skip, "skip-malformed", false, "NDJSON: report a line that is not JSON and go on (default: stop there, after sending what came before)")
	f.BoolVar(&progress, "progress", isTerminal(os.Stderr), "show a progress line (default: when stderr is a terminal)")
	nf.add(cmd)
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

	skipMalformed bool
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
	d := &eventDecoder{skipMalformed: s.skipMalformed, log: s.log}
	events, errc := d.decode(ctx, in)
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
			fmt.Fprintf(s.log, "%s rejected: %s\n", d.where(i), what)
		},
		OnAcked: func(n int, _ client.Result) {
			if bar != nil {
				bar.Add(n)
			}
		},
	})
	if bar != nil {
		bar.Finish()
	}
	took := time.Since(start)
	malformed := d.malformed()
	// The summary is printed whatever happened: it says what is durable.
	if !s.quiet || err != nil {
		fmt.Fprintf(s.log, "sent %d events in %v (%.0f events/s): %d accepted, %d duplicates, %d rejected, %d malformed\n",
			sum.Sent, took.Round(time.Millisecond), float64(sum.Sent)/took.Seconds(), sum.Accepted, sum.Duplicates, sum.Rejected, malformed)
	}
	switch {
	case err != nil:
		return err
	case sum.Rejected > 0 || malformed > 0:
		return fmt.Errorf("%d events rejected, %d lines malformed", sum.Rejected, malformed)
	}
	return nil
}

// eventDecoder streams the events of an input without holding it in
// memory: a JSON array of objects, or NDJSON (one event a line, blank lines
// skipped). It knows where each event came from, so rejects and malformed
// input are reported by line (NDJSON) or by position in the array.
type eventDecoder struct {
	skipMalformed bool      // NDJSON: report a malformed line and go on
	log           io.Writer // where skipped lines are reported

	mu    sync.Mutex
	array bool
	// shifts maps event indexes to lines in NDJSON: from shifts[k].index on,
	// event i is on line i+shifts[k].delta (one entry per blank or skipped
	// line, so memory follows those, not the input).
	shifts []lineShift
	bad    int // malformed lines skipped
}

type lineShift struct{ index, delta int }

// where names event i (from 0) for a message.
func (d *eventDecoder) where(i int) string {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.array {
		return fmt.Sprintf("event %d", i+1)
	}
	delta := 1
	if k, _ := slices.BinarySearchFunc(d.shifts, i+1, func(s lineShift, t int) int { return cmp.Compare(s.index, t) }); k > 0 {
		delta = d.shifts[k-1].delta
	}
	return fmt.Sprintf("line %d", i+delta)
}

func (d *eventDecoder) malformed() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.bad
}

// decode sends the events to the first channel and then the input's error
// (nil at its end) to the second.
func (d *eventDecoder) decode(ctx context.Context, in io.Reader) (<-chan json.RawMessage, <-chan error) {
	out, errc := make(chan json.RawMessage, 1024), make(chan error, 1)
	go func() {
		defer close(out)
		br := bufio.NewReaderSize(in, 1<<20)
		send := func(ev json.RawMessage) bool {
			select {
			case out <- ev:
				return true
			case <-ctx.Done():
				return false
			}
		}
		var err error
		if b, perr := peekNonSpace(br); perr == nil && b == '[' {
			d.mu.Lock()
			d.array = true
			d.mu.Unlock()
			err = decodeArray(br, send)
		} else {
			err = d.decodeLines(br, send)
		}
		if err == nil {
			err = ctx.Err()
		}
		errc <- err
	}()
	return out, errc
}

// decodeLines reads NDJSON: every non-blank line must be one JSON value.
func (d *eventDecoder) decodeLines(br *bufio.Reader, send func(json.RawMessage) bool) error {
	index := 0 // events yielded
	for line := 1; ; line++ {
		b, err := br.ReadBytes('\n')
		if len(b) == 0 && err != nil {
			if err == io.EOF {
				return nil
			}
			return fmt.Errorf("line %d: %w", line, err)
		}
		b = bytes.TrimSpace(b)
		skip := len(b) == 0
		if !skip && !json.Valid(b) {
			msg := fmt.Sprintf("line %d: malformed JSON: %s", line, describeInvalid(b))
			if !d.skipMalformed {
				return errors.New(msg + " (nothing from this line on was sent; --skip-malformed goes on past such lines)")
			}
			fmt.Fprintf(d.log, "%s: skipped\n", msg)
			d.mu.Lock()
			d.bad++
			d.mu.Unlock()
			skip = true
		}
		if skip {
			d.mu.Lock()
			d.shifts = append(d.shifts, lineShift{index: index, delta: line + 1 - index})
			d.mu.Unlock()
		} else {
			if !send(json.RawMessage(b)) {
				return nil
			}
			index++
		}
		if err == io.EOF {
			return nil
		}
	}
}

// describeInvalid says what is wrong with b, which is not valid JSON.
func describeInvalid(b []byte) string {
	var v any
	err := json.Unmarshal(b, &v)
	var se *json.SyntaxError
	if errors.As(err, &se) {
		return fmt.Sprintf("%v (at column %d)", se, se.Offset)
	}
	return err.Error()
}

// decodeArray reads a JSON array of events. Its elements are found by a
// streaming decoder; a syntax error ends the input (an array cannot be
// resumed past it), reported by the number of the event it is in.
func decodeArray(br *bufio.Reader, send func(json.RawMessage) bool) error {
	dec := json.NewDecoder(br)
	if _, err := dec.Token(); err != nil {
		return err
	}
	for n := 1; dec.More(); n++ {
		var ev json.RawMessage
		if err := dec.Decode(&ev); err != nil {
			return fmt.Errorf("array element %d: malformed JSON: %w (nothing from it on was sent)", n, err)
		}
		if !send(ev) {
			return nil
		}
	}
	if _, err := dec.Token(); err != nil {
		return fmt.Errorf("end of the array: %w", err)
	}
	return nil
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
