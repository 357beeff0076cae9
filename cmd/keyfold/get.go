package main

import (
	"bytes"
	"encoding/json"
	"fmt"

	"github.com/spf13/cobra"

	"github.com/keyfold/keyfold/services/grpcapi/client"
)

func newGet() *cobra.Command {
	var nf nodeFlags
	cmd := &cobra.Command{
		Use:   "get PIPELINE KEY",
		Short: "Print one key's state (as JSON)",
		Args:  cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := nf.dial(client.Options{})
			if err != nil {
				return err
			}
			defer c.Close()
			st, err := c.GetState(cmd.Context(), args[0], args[1])
			if err != nil {
				return err
			}
			out, err := stateJSON(st)
			if err != nil {
				return err
			}
			_, err = fmt.Fprintf(cmd.OutOrStdout(), "%s\n", out)
			return err
		},
	}
	nf.add(cmd)
	return cmd
}

// stateJSON renders a key's state in the HTTP API's shape
// (GET /v1/pipelines/{p}/keys/{k}), in its order and indented: for a
// pipeline with windows or patterns the watermark, late, windows,
// late_windows and patterns follow the aggregates, left out where the HTTP
// API leaves them out.
func stateJSON(st *client.State) ([]byte, error) {
	// The gRPC API sends the event-time state as one JSON object with the
	// HTTP API's field names; absent and null fields are left out (except
	// windows, an empty list when there are none, as over HTTP).
	var tm struct {
		Watermark   json.RawMessage `json:"watermark"`
		Late        json.RawMessage `json:"late"`
		Windows     json.RawMessage `json:"windows"`
		LateWindows json.RawMessage `json:"late_windows"`
		Patterns    json.RawMessage `json:"patterns"`
	}
	if len(st.Time) > 0 {
		if err := json.Unmarshal(st.Time, &tm); err != nil {
			return nil, fmt.Errorf("the key's event-time state: %w", err)
		}
		for _, f := range []*json.RawMessage{&tm.Watermark, &tm.Late, &tm.Windows, &tm.LateWindows, &tm.Patterns} {
			if bytes.Equal(bytes.TrimSpace(*f), []byte("null")) {
				*f = nil
			}
		}
		if tm.Windows == nil {
			tm.Windows = json.RawMessage("[]")
		}
	}
	return json.MarshalIndent(struct {
		Pipeline    string          `json:"pipeline"`
		Key         string          `json:"key"`
		Seq         uint64          `json:"seq"`
		Duplicates  uint64          `json:"duplicates"`
		Aggregates  map[string]any  `json:"aggregates"`
		Watermark   json.RawMessage `json:"watermark,omitempty"`
		Late        json.RawMessage `json:"late,omitempty"`
		Windows     json.RawMessage `json:"windows,omitempty"`
		LateWindows json.RawMessage `json:"late_windows,omitempty"`
		Patterns    json.RawMessage `json:"patterns,omitempty"`
	}{st.Pipeline, st.Key, st.Seq, st.Duplicates, st.Aggregates,
		tm.Watermark, tm.Late, tm.Windows, tm.LateWindows, tm.Patterns}, "", "  ")
}
