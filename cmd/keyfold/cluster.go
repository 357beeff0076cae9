package main

import (
	"fmt"
	"io"
	"text/tabwriter"

	"github.com/spf13/cobra"
	"google.golang.org/protobuf/encoding/protojson"

	keyfoldv1 "github.com/keyfold/keyfold/proto/keyfold/v1"
	"github.com/keyfold/keyfold/services/grpcapi/client"
)

func newCluster() *cobra.Command {
	var (
		nf            nodeFlags
		pipeline, key string
		asJSON        bool
	)
	cmd := &cobra.Command{
		Use:   "cluster",
		Short: "Show the cluster as a node sees it: its members, their key groups, and a key's owner (--key)",
		Long: `Ask the node at --addr how it sees its cluster (the GetCluster call): each
member with its state, the key groups placement assigns it, those it holds
and serves, its keys in memory and its events; with --key, the member that
owns the key's group. A member that does not answer is listed as
unreachable, with why. A node alone is a cluster of one.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := nf.dial(client.Options{})
			if err != nil {
				return err
			}
			defer c.Close()
			resp, err := c.Cluster(cmd.Context(), pipeline, key)
			if err != nil {
				return err
			}
			if asJSON {
				b, err := protojson.MarshalOptions{Multiline: true, Indent: "  ", UseProtoNames: true}.Marshal(resp)
				if err != nil {
					return err
				}
				_, err = fmt.Fprintf(cmd.OutOrStdout(), "%s\n", b)
				return err
			}
			return printCluster(cmd.OutOrStdout(), resp)
		},
	}
	nf.add(cmd)
	cmd.Flags().StringVar(&key, "key", "", "also name the member that owns this key")
	cmd.Flags().StringVar(&pipeline, "pipeline", "", "the key's pipeline (may be left out when the node has one)")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the GetCluster answer as JSON (field names as in proto/keyfold/v1/service.proto)")
	return cmd
}

// printCluster writes a cluster's description: a summary line, a table of
// its members, why any did not answer, and the owner of the key asked for.
func printCluster(w io.Writer, r *keyfoldv1.GetClusterResponse) error {
	if r.Cluster == "" {
		fmt.Fprintf(w, "a node alone: %d key groups; seen from %s\n", r.KeyGroups, r.Self)
	} else {
		fmt.Fprintf(w, "cluster %s: %d members, %d key groups; membership %s", r.Cluster, len(r.Members), r.KeyGroups, r.Membership)
		if r.FailureDetection != "" {
			fmt.Fprintf(w, ", failure detection %s", r.FailureDetection)
		}
		fmt.Fprintf(w, "; seen from %s\n", r.Self)
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "MEMBER\tSTATE\tASSIGNED\tOWNED\tSERVING\tKEYS\tEVENTS\tFORWARDED\tRECEIVED\tHTTP")
	for _, m := range r.Members {
		http := m.HttpAddr
		if http == "" {
			http = "-"
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%s\n", m.Id, m.State, m.GroupsAssigned, m.GroupsOwned,
			m.GroupsServing, m.ActiveKeys, m.Events, m.EventsForwarded, m.EventsReceived, http)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, m := range r.Members {
		if m.Error != "" {
			fmt.Fprintf(w, "%s: %s: %s\n", m.Id, m.State, m.Error)
		}
	}
	if k := r.Key; k != nil {
		fmt.Fprintf(w, "key %s/%s: group %d, owner %s\n", k.Pipeline, k.Key, k.Group, k.Owner)
	}
	return nil
}
