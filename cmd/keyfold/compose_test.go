package main

import (
	"net"
	"net/url"
	"os"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"

	"github.com/keyfold/keyfold"
)

// TestComposeFile checks docker-compose.yml as far as a machine without a
// container engine can: Redis keeps writes durable; every keyfold service
// runs `serve` with flags this binary accepts, on a configuration that
// validates, in one cluster whose members advertise their own service name
// and gRPC port; host ports do not collide; the health check is a command
// this binary has.
func TestComposeFile(t *testing.T) {
	b, err := os.ReadFile("../../docker-compose.yml")
	if err != nil {
		t.Fatal(err)
	}
	var compose struct {
		Services map[string]struct {
			Build       any      `yaml:"build"`
			Image       string   `yaml:"image"`
			Command     []string `yaml:"command"`
			Ports       []string `yaml:"ports"`
			Volumes     []string `yaml:"volumes"`
			StopSignal  string   `yaml:"stop_signal"`
			Healthcheck struct {
				Test []string `yaml:"test"`
			} `yaml:"healthcheck"`
		} `yaml:"services"`
	}
	if err := yaml.Unmarshal(b, &compose); err != nil {
		t.Fatalf("docker-compose.yml: %v", err)
	}
	redis, ok := compose.Services["redis"]
	if !ok {
		t.Fatal("no redis service")
	}
	if cmd := strings.Join(redis.Command, " "); !strings.Contains(cmd, "--appendonly yes") || !strings.Contains(cmd, "--appendfsync always") {
		t.Errorf("redis runs %q: want appendonly with appendfsync always", cmd)
	}

	clusters := map[string]bool{}
	var hostPorts []string
	nodes := 0
	for name, svc := range compose.Services {
		if !strings.HasPrefix(name, "keyfold") {
			continue
		}
		nodes++
		if len(svc.Command) == 0 || svc.Command[0] != "serve" {
			t.Fatalf("%s: command %v does not run serve", name, svc.Command)
		}
		serve := newServe()
		if err := serve.ParseFlags(svc.Command[1:]); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		flag := func(f string) string { return serve.Flags().Lookup(f).Value.String() }
		// The configuration file the service mounts, with the flags on top.
		var cfgFile string
		for _, v := range svc.Volumes {
			if src, dst, ok := strings.Cut(v, ":"); ok && strings.HasPrefix(dst, flag("config")) {
				cfgFile = "../../" + strings.TrimPrefix(src, "./")
			}
		}
		cfg, err := keyfold.LoadConfig(cfgFile)
		if err != nil {
			t.Fatalf("%s: mounted config: %v", name, err)
		}
		cfg.Redis, cfg.Cluster, cfg.Advertise = flag("redis"), flag("cluster"), flag("advertise")
		cfg.HTTPAddr, cfg.GRPCAddr = flag("http"), flag("grpc")
		if err := cfg.Validate(); err != nil {
			t.Errorf("%s: %v", name, err)
		}
		if u, err := url.Parse(cfg.Redis); err != nil || u.Hostname() != "redis" {
			t.Errorf("%s: redis URL %q does not name the redis service", name, cfg.Redis)
		}
		clusters[cfg.Cluster] = true
		advHost, advPort, _ := net.SplitHostPort(cfg.Advertise)
		_, grpcPort, _ := net.SplitHostPort(cfg.GRPCAddr)
		if advHost != name || advPort != grpcPort {
			t.Errorf("%s advertises %q: want %s:%s (its service name and gRPC port)", name, cfg.Advertise, name, grpcPort)
		}
		hostPorts = append(hostPorts, svc.Ports...)
		if svc.StopSignal != "SIGTERM" {
			t.Errorf("%s: stop_signal %q, want SIGTERM (a graceful leave)", name, svc.StopSignal)
		}
		if hc := svc.Healthcheck.Test; len(hc) < 3 || hc[0] != "CMD" {
			t.Errorf("%s: health check %v", name, hc)
		} else if sub, _, err := newRoot().Find([]string{hc[2]}); err != nil || sub.Name() != hc[2] {
			t.Errorf("%s: health check runs %q, which is no keyfold command", name, hc[2])
		}
		if svc.Build == nil || svc.Image == "" {
			t.Errorf("%s: want build and image", name)
		}
	}
	if nodes != 3 || len(clusters) != 1 || clusters[""] {
		t.Errorf("%d keyfold services in clusters %v: want 3 in one named cluster", nodes, clusters)
	}
	published := map[string]bool{}
	for _, p := range hostPorts {
		hostPort := strings.Join(strings.Split(p, ":")[:2], ":")
		if published[hostPort] {
			t.Errorf("host port %s published twice", hostPort)
		}
		published[hostPort] = true
		if !strings.HasPrefix(p, "127.0.0.1:") {
			t.Errorf("port %s is published on every interface: bind 127.0.0.1", p)
		}
	}
}
