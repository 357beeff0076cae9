package main

import (
	"fmt"
	"runtime"
	"runtime/debug"
	"slices"
	"strings"

	"github.com/spf13/cobra"

	"github.com/keyfold/keyfold"
	"github.com/keyfold/keyfold/services/grpcapi/client"
)

func newDelete() *cobra.Command {
	var nf nodeFlags
	cmd := &cobra.Command{
		Use:   "delete PIPELINE KEY",
		Short: "Erase one key: its state, its remembered ids and its snapshot (durably, when it returns)",
		Args:  cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := nf.dial(client.Options{})
			if err != nil {
				return err
			}
			defer c.Close()
			if err := c.DeleteKey(cmd.Context(), args[0], args[1]); err != nil {
				return err
			}
			_, err = fmt.Fprintf(cmd.OutOrStdout(), "deleted %s/%s\n", args[0], args[1])
			return err
		},
	}
	nf.add(cmd)
	return cmd
}

func newConfig() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "config",
		Short: "Work with a configuration file",
	}
	var path string
	check := &cobra.Command{
		Use:   "check",
		Short: "Validate a configuration as serve would (every problem at once, with its line), without starting anything",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := keyfold.LoadConfig(path)
			if err != nil {
				return err
			}
			if _, err := keyfold.New(cfg); err != nil {
				return err
			}
			names := make([]string, 0, len(cfg.Pipelines))
			for name := range cfg.Pipelines {
				names = append(names, name)
			}
			slices.Sort(names)
			_, err = fmt.Fprintf(cmd.OutOrStdout(), "%s: ok (pipelines: %s)\n", path, strings.Join(names, ", "))
			return err
		},
	}
	check.Flags().StringVarP(&path, "config", "c", "keyfold.yaml", "the configuration (YAML) to check")
	cmd.AddCommand(check)
	return cmd
}

// version describes this binary from its build information: the module
// version (a tag with `go install …@vX`), the commit and the Go release.
func version() string {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return "unknown (no build information) " + runtime.Version()
	}
	v := bi.Main.Version
	if v == "" {
		v = "(devel)"
	}
	var rev, when string
	dirty := false
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.time":
			when = s.Value
		case "vcs.modified":
			dirty = s.Value == "true"
		}
	}
	parts := []string{v}
	if rev != "" {
		if len(rev) > 12 {
			rev = rev[:12]
		}
		if dirty {
			rev += "+modified"
		}
		parts = append(parts, "commit "+rev)
	}
	if when != "" {
		parts = append(parts, when)
	}
	return strings.Join(parts, ", ") + " (" + runtime.Version() + " " + runtime.GOOS + "/" + runtime.GOARCH + ")"
}

func newVersion() *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print the version of this binary",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			_, err := fmt.Fprintln(cmd.OutOrStdout(), "keyfold", version())
			return err
		},
	}
}
