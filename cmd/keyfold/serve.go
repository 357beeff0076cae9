package main

import (
	"fmt"
	"log/slog"
	"os"
	"strings"

	"github.com/keyfold/keyfold"
	"github.com/spf13/cobra"
)

func newServe() *cobra.Command {
	var (
		configPath string
		dataDir    string
		httpAddr   string
		grpcAddr   string
		logLevel   string
		logFormat  string
	)
	cmd := &cobra.Command{
		Use:   "serve",
		Short: "Run a node (embedded on-disk store in --data)",
		Long: `Run a keyfold node. It keeps its state in the embedded on-disk store in
--data, recovers it at start, serves the HTTP API on --http, and drains on
SIGTERM or SIGINT: it stops accepting, finishes in-flight batches, writes a
checkpoint and exits 0.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := keyfold.LoadConfig(configPath)
			if err != nil {
				return err
			}
			flags := cmd.Flags()
			if flags.Changed("data") || cfg.DataDir == "" {
				cfg.DataDir = dataDir
			}
			if flags.Changed("http") || cfg.HTTPAddr == "" {
				cfg.HTTPAddr = httpAddr
			}
			if flags.Changed("grpc") {
				cfg.GRPCAddr = grpcAddr
			}
			logger, err := newLogger(logLevel, logFormat)
			if err != nil {
				return err
			}
			cfg.Logger = logger
			node, err := keyfold.New(cfg)
			if err != nil {
				return err
			}
			return node.Run(cmd.Context())
		},
	}
	f := cmd.Flags()
	f.StringVarP(&configPath, "config", "c", "keyfold.yaml", "pipeline configuration (YAML)")
	f.StringVar(&dataDir, "data", keyfold.DefaultDataDir, "directory of the embedded store")
	f.StringVar(&httpAddr, "http", "127.0.0.1:8080", "HTTP listen address")
	f.StringVar(&grpcAddr, "grpc", "", "gRPC listen address (accepted; served by a later version)")
	f.StringVar(&logLevel, "log-level", "info", "log level: debug, info, warn, error")
	f.StringVar(&logFormat, "log-format", "text", "log format: text or json")
	return cmd
}

func newLogger(level, format string) (*slog.Logger, error) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(level)); err != nil {
		return nil, fmt.Errorf("--log-level: %w", err)
	}
	opts := &slog.HandlerOptions{Level: l}
	switch strings.ToLower(format) {
	case "text":
		return slog.New(slog.NewTextHandler(os.Stderr, opts)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(os.Stderr, opts)), nil
	}
	return nil, fmt.Errorf("--log-format: want text or json, got %q", format)
}
