package main

import (
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
	nf.add(cmd)
	return cmd
}
