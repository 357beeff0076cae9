//go:build unix

package main

import (
	"encoding/json"
	"fmt"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/keyfold/keyfold/persistence/redisstore/redistest"
)

// TestClusterCommand: `keyfold cluster` (the GetCluster call) against real
// member processes describes what GET /v1/cluster does — the members,
// each serving its assigned share — and names a key's owner, the same one
// whichever member is asked; against a node alone it describes a cluster
// of one. --addr takes a gRPC host:port, as everywhere.
func TestClusterCommand(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	cfg := writeConfig(t, pipelinesYAML)
	args := []string{"--redis", srv.URL(), "--cluster", "cmd", "--cluster-lease", clusterLease.String()}
	var ms []*member
	for i := range 2 {
		ms = append(ms, &member{node: launchNode(t, fmt.Sprintf("node-%c", 'a'+i), cfg, args...)})
	}
	for _, m := range ms {
		m.waitJoined()
	}
	view := waitStable(t, ms, 20*time.Second, "of 2 nodes")

	owners := map[string]bool{}
	for _, m := range ms {
		out, err := runCLI(t, "cluster", "--addr", m.id, "--pipeline", "logins", "--key", "alice")
		if err != nil {
			t.Fatalf("cluster --addr %s: %v\n%s", m.id, err, out)
		}
		head := fmt.Sprintf("cluster cmd: 2 members, 256 key groups; membership redis, failure detection %s; seen from %s\n", clusterLease, m.id)
		if !strings.HasPrefix(out, head) {
			t.Errorf("cluster --addr %s: first line of\n%s\nwant %q", m.id, out, head)
		}
		for _, e := range view.Members {
			row := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(e.ID) + `\s+serving\s+` + fmt.Sprint(e.GroupsAssigned) + `\s+` +
				fmt.Sprint(e.GroupsAssigned) + `\s+` + fmt.Sprint(e.GroupsAssigned) + `\s`)
			if !row.MatchString(out) {
				t.Errorf("cluster --addr %s: no row for %s serving its %d groups in\n%s", m.id, e.ID, e.GroupsAssigned, out)
			}
		}
		owner := regexp.MustCompile(`(?m)^key logins/alice: group (\d+), owner (\S+)$`).FindStringSubmatch(out)
		if owner == nil {
			t.Fatalf("cluster --addr %s --key alice: no owner in\n%s", m.id, out)
		}
		owners[owner[2]] = true
	}
	if len(owners) != 1 || !(owners[ms[0].id] || owners[ms[1].id]) {
		t.Errorf("the members name the owners %v of alice; want one of them, the same for both", owners)
	}

	out, err := runCLI(t, "cluster", "--addr", ms[0].id, "--json")
	if err != nil {
		t.Fatal(err)
	}
	var got struct {
		Cluster string `json:"cluster"`
		Members []struct {
			ID    string `json:"id"`
			State string `json:"state"`
		} `json:"members"`
	}
	if err := json.Unmarshal([]byte(out), &got); err != nil || got.Cluster != "cmd" || len(got.Members) != 2 {
		t.Errorf("cluster --json: %v, %+v; want cluster cmd with 2 members:\n%s", err, got, out)
	}
	if _, err := runCLI(t, "cluster", "--addr", ms[0].base); err == nil || !strings.Contains(err.Error(), "want the node's gRPC host:port") {
		t.Errorf("cluster --addr %s: %v, want a gRPC address error", ms[0].base, err)
	}
	if _, err := runCLI(t, "cluster", "--addr", ms[0].id, "--pipeline", "nope", "--key", "alice"); err == nil || !strings.Contains(err.Error(), "NotFound") {
		t.Errorf("cluster --key of an unknown pipeline: %v, want NotFound", err)
	}

	_, alone := startInProcess(t)
	out, err = runCLI(t, "cluster", "--addr", alone, "--key", "bob")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(out, "a node alone: 8 key groups; seen from "+alone+"\n") ||
		!regexp.MustCompile(`(?m)^`+regexp.QuoteMeta(alone)+`\s+serving\s+8\s+8\s+8\s`).MatchString(out) ||
		!regexp.MustCompile(`(?m)^key logins/bob: group \d+, owner `+regexp.QuoteMeta(alone)+`$`).MatchString(out) {
		t.Errorf("cluster of a node alone:\n%s", out)
	}
}
