//go:build unix

package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/keyfold/keyfold"
)

// TestCrashReplay holds the handler's guarantees with a real process: the
// cart service is started, sent a stream of calls and events (every one
// with an id), killed with SIGKILL in the middle of it, restarted on the
// same data, and sent the whole stream again. Every user's state, the
// outputs (by id) and the reply to every call then equal those of an
// uninterrupted run of the same stream: what was applied before the kill
// is answered from the kept replies (or deduplicated), the rest is
// applied once, in order.
func TestCrashReplay(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the cart binary")
	}
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	ops := workload(rand.New(rand.NewPCG(seed, 7)), 8, 300)
	want := uninterrupted(t, ops)

	bin := buildCart(t)
	dir := t.TempDir()
	p := startCart(t, bin, dir)
	killAt := len(ops)/4 + rand.New(rand.NewPCG(seed, 8)).IntN(len(ops)/2)
	sent := 0
	for i, op := range ops {
		if i == killAt {
			// Mid-stream: the next op is in flight when the process dies.
			done := make(chan struct{})
			go func() {
				defer close(done)
				_, _ = p.send(op) // its outcome is unknown
			}()
			p.kill()
			<-done
			break
		}
		if _, err := p.send(op); err != nil {
			t.Fatalf("op %d before the kill: %v", i, err)
		}
		sent++
	}
	t.Logf("killed after %d of %d ops", sent, len(ops))

	p = startCart(t, bin, dir)
	defer p.stop()
	for i, op := range ops {
		got, err := p.send(op)
		if err != nil {
			t.Fatalf("op %d after the restart: %v", i, err)
		}
		if op.call && got != want.replies[i] {
			t.Errorf("op %d %s: reply %s, want %s (the uninterrupted run's)", i, op.body, got, want.replies[i])
		}
	}
	for _, user := range want.users() {
		if got := p.state(user); got != want.states[user] {
			t.Errorf("%s: state %s, want %s", user, got, want.states[user])
		}
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		got := p.outputs()
		if slices.Equal(got, want.outputs) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("outputs (by id)\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want.outputs, "\n"))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestCrashTimers: processing-time timers set before a kill -9 fire after
// the restart, once each, for keys that get no further input: carts
// filled, the process killed before they are abandoned, restarted and
// sent nothing; every cart is abandoned once.
func TestCrashTimers(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the cart binary")
	}
	bin := buildCart(t)
	dir := t.TempDir()
	p := startCart(t, bin, dir, "-abandon-after", "3s")
	const users = 10
	start := time.Now()
	for i := range users {
		o := op{user: fmt.Sprintf("u%d", i), call: true, id: "fill", body: fmt.Sprintf(`{"op":"add","item":"fig","qty":%d,"price":10}`, i+1)}
		if _, err := p.send(o); err != nil {
			t.Fatal(err)
		}
	}
	p.kill()
	if took := time.Since(start); took >= 3*time.Second {
		t.Logf("the carts took %v to fill: some may have been abandoned before the kill", took)
	}
	p = startCart(t, bin, dir, "-abandon-after", "3s")
	defer p.stop()
	var want []string
	for i := range users {
		want = append(want, fmt.Sprintf(`u%d abandoned {"items":%d,"total":%d}`, i, i+1, 10*(i+1)))
	}
	slices.Sort(want)
	deadline := time.Now().Add(30 * time.Second)
	for {
		got := p.outputs()
		if slices.Equal(got, want) {
			break
		}
		if len(got) > users || time.Now().After(deadline) {
			t.Fatalf("outputs (by id)\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
		}
		time.Sleep(50 * time.Millisecond)
	}
	for i := range users {
		if st := p.state(fmt.Sprintf("u%d", i)); st != "not found" {
			t.Errorf("u%d after its cart was abandoned: %s", i, st)
		}
	}
}

// op is one request of the stream: a call to a user's cart, or an event.
type op struct {
	user string
	call bool
	body string // the call's request, or the event
	id   string
}

// workload is n ops over users, calls and events mixed, each with an id.
func workload(rng *rand.Rand, users, n int) []op {
	items := []string{"apple", "pear", "fig", "plum"}
	ops := make([]op, n)
	for i := range ops {
		o := op{user: fmt.Sprintf("u%d", rng.IntN(users)), call: true, id: fmt.Sprintf("c%d", i)}
		item := items[rng.IntN(len(items))]
		switch r := rng.IntN(10); {
		case r < 4:
			o.body = fmt.Sprintf(`{"op":"add","item":%q,"qty":%d,"price":%d}`, item, 1+rng.IntN(3), 10*(1+len(item)))
		case r < 5:
			o.body = fmt.Sprintf(`{"op":"remove","item":%q}`, item) // may fail: not in the cart
		case r < 6:
			o.body = `{"op":"checkout"}` // may fail: empty
		case r < 7:
			o.body = `{"op":"get"}`
		default:
			o.call, o.id = false, fmt.Sprintf("e%d", i)
			o.body = fmt.Sprintf(`{"user":%q,"event_id":%q,"type":"viewed"}`, o.user, o.id)
		}
		ops[i] = o
	}
	return ops
}

// outcome is what a run of the stream leaves: each call's reply (by op
// index), each user's state, and the outputs (key, name, values), sorted.
type outcome struct {
	replies map[int]string
	states  map[string]string
	outputs []string
}

func (o outcome) users() []string {
	var us []string
	for u := range o.states {
		us = append(us, u)
	}
	slices.Sort(us)
	return us
}

// uninterrupted runs the stream on an in-process node of the same handler.
func uninterrupted(t *testing.T, ops []op) outcome {
	t.Helper()
	node := startCarts(t, time.Hour)
	ctx := context.Background()
	out := outcome{replies: map[int]string{}, states: map[string]string{}}
	for i, o := range ops {
		if !o.call {
			if _, err := node.Ingest(ctx, "carts", []json.RawMessage{json.RawMessage(o.body)}); err != nil {
				t.Fatal(err)
			}
			continue
		}
		r, err := node.Call(ctx, "carts", o.user, json.RawMessage(o.body), keyfold.CallOptions{ID: o.id})
		if err != nil {
			out.replies[i] = "error: " + strings.TrimPrefix(err.Error(), "keyfold: ")
		} else {
			out.replies[i] = compact(t, r.Reply)
		}
	}
	for _, o := range ops {
		st, err := node.Query(ctx, "carts", o.user)
		switch {
		case errors.Is(err, keyfold.ErrNotFound): // calls that failed only
			out.states[o.user] = "not found"
		case err != nil:
			t.Fatal(err)
		default:
			out.states[o.user] = fmt.Sprintf("seq %d %s", st.Seq, compact(t, st.State))
		}
	}
	n := 0 // the orders
	for i, o := range ops {
		if o.body == `{"op":"checkout"}` && !strings.HasPrefix(out.replies[i], "error: ") {
			n++
		}
	}
	for _, o := range waitOutputs(t, node, n) {
		out.outputs = append(out.outputs, fmt.Sprintf("%s %s %s", o.Key, o.Name, o.Values))
	}
	slices.Sort(out.outputs)
	return out
}

func compact(t *testing.T, b []byte) string {
	t.Helper()
	var buf bytes.Buffer
	if err := json.Compact(&buf, b); err != nil {
		t.Fatalf("%s: %v", b, err)
	}
	return buf.String()
}

// buildCart builds this program into a temp dir.
func buildCart(t *testing.T) string {
	t.Helper()
	goCmd, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("the go command is needed to build the cart service: %v", err)
	}
	bin := filepath.Join(t.TempDir(), "cart")
	if out, err := exec.Command(goCmd, "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

// cartProcess is a cart service the test started.
type cartProcess struct {
	t      *testing.T
	cmd    *exec.Cmd
	base   string
	exited chan struct{}
	client *http.Client
}

var listeningRE = regexp.MustCompile(`msg="cart listening" http=(\S+)`)

// startCart starts the binary on dir and waits until it serves; args are
// more flags (the default abandon-after is 1h).
func startCart(t *testing.T, bin, dir string, args ...string) *cartProcess {
	t.Helper()
	cmd := exec.Command(bin, append([]string{"-data", dir, "-http", "127.0.0.1:0", "-abandon-after", "1h"}, args...)...)
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &cartProcess{t: t, cmd: cmd, exited: make(chan struct{}), client: &http.Client{Timeout: 10 * time.Second}}
	addr := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			if m := listeningRE.FindStringSubmatch(sc.Text()); m != nil {
				select {
				case addr <- m[1]:
				default:
				}
			}
		}
		_, _ = io.Copy(io.Discard, stderr)
	}()
	go func() {
		_ = cmd.Wait()
		close(p.exited)
	}()
	t.Cleanup(p.kill)
	select {
	case a := <-addr:
		p.base = "http://" + a
	case <-p.exited:
		t.Fatal("the cart service exited before it served")
	case <-time.After(30 * time.Second):
		t.Fatal("the cart service did not serve within 30 s")
	}
	return p
}

// send sends one op: a call's reply (compacted JSON, or "error: …" for
// the handler's failure), or an event's ingest answer.
func (p *cartProcess) send(o op) (string, error) {
	path, body := "/v1/pipelines/carts/events", o.body
	if o.call {
		path = "/v1/pipelines/carts/keys/" + o.user + "/call"
		body = fmt.Sprintf(`{"request":%s,"id":%q}`, o.body, o.id)
	}
	resp, err := p.client.Post(p.base+path, "application/json", strings.NewReader(body))
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return "", err
	}
	switch {
	case o.call && resp.StatusCode == http.StatusOK:
		var r struct{ Reply json.RawMessage }
		if err := json.Unmarshal(b, &r); err != nil {
			return "", err
		}
		return compact(p.t, r.Reply), nil
	case o.call && resp.StatusCode == http.StatusUnprocessableEntity:
		var e struct{ Error string }
		if err := json.Unmarshal(b, &e); err != nil {
			return "", err
		}
		return "error: " + e.Error, nil
	case resp.StatusCode == http.StatusOK:
		return string(b), nil
	}
	return "", fmt.Errorf("POST %s: %d %s", path, resp.StatusCode, b)
}

// state is a user's seq and handler state, as uninterrupted records them.
func (p *cartProcess) state(user string) string {
	var st struct {
		Seq   uint64
		State json.RawMessage
	}
	if p.get("/v1/pipelines/carts/keys/"+user, &st) == http.StatusNotFound {
		return "not found"
	}
	return fmt.Sprintf("seq %d %s", st.Seq, compact(p.t, st.State))
}

// outputs are the stored outputs, one per id, as uninterrupted records them.
func (p *cartProcess) outputs() []string {
	var page struct {
		Outputs []struct {
			ID, Key, Name string
			Values        json.RawMessage
		}
	}
	p.get("/v1/pipelines/carts/outputs?limit=10000", &page)
	byID := map[string]string{}
	for _, o := range page.Outputs {
		byID[o.ID] = fmt.Sprintf("%s %s %s", o.Key, o.Name, compact(p.t, o.Values))
	}
	var out []string
	for _, o := range byID {
		out = append(out, o)
	}
	slices.Sort(out)
	return out
}

// get GETs path into v; a 404 is returned, not decoded.
func (p *cartProcess) get(path string, v any) int {
	p.t.Helper()
	resp, err := p.client.Get(p.base + path)
	if err != nil {
		p.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if resp.StatusCode == http.StatusNotFound {
		return resp.StatusCode
	}
	if err != nil || resp.StatusCode != http.StatusOK {
		p.t.Fatalf("GET %s: %d %s %v", path, resp.StatusCode, b, err)
	}
	if err := json.Unmarshal(b, v); err != nil {
		p.t.Fatalf("GET %s: %v", path, err)
	}
	return resp.StatusCode
}

// kill sends SIGKILL to the process the test started (by its PID) and
// waits for it.
func (p *cartProcess) kill() {
	select {
	case <-p.exited:
		return
	default:
	}
	_ = p.cmd.Process.Kill()
	<-p.exited
}

// stop drains the process with SIGTERM.
func (p *cartProcess) stop() {
	select {
	case <-p.exited:
		return
	default:
	}
	_ = p.cmd.Process.Signal(os.Interrupt)
	select {
	case <-p.exited:
	case <-time.After(30 * time.Second):
		p.t.Error("the cart service did not drain within 30 s")
		p.kill()
	}
}
