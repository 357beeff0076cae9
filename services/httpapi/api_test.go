package httpapi_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/keyfold/keyfold/services/grpcapi/client"
	"github.com/keyfold/keyfold/services/httpapi"
	"github.com/keyfold/keyfold/services/servicetest"
)

const pipelinesYAML = `
max_body_bytes: 4096
pipelines:
  logins:
    key: user.id
    id: event_id
    aggregates:
      total:   { op: count }
      failed:  { op: count, where: "type == 'login_failed'" }
      amount:  { op: sum, field: amount }
      biggest: { op: max, field: amount }
      country: { op: last, field: geo.country }
`

// startNode runs a real node on a temp dir and returns its HTTP base URL.
func startNode(t *testing.T) string {
	t.Helper()
	cfg := servicetest.Config(t, pipelinesYAML)
	cfg.HTTPAddr = "127.0.0.1:0"
	return "http://" + servicetest.Run(t, cfg).HTTPAddr()
}

type response struct {
	status int
	body   map[string]any
}

func do(t *testing.T, method, url, contentType, body string) response {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	switch {
	case contentType == "" && method == "POST":
		req.Header.Set("Content-Type", "application/json")
	case contentType != "" && contentType != "none":
		req.Header.Set("Content-Type", contentType)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	if ct := resp.Header.Get("Content-Type"); ct != "application/json" {
		t.Errorf("%s %s: Content-Type %q", method, url, ct)
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatalf("%s %s: body %q is not a JSON object: %v", method, url, b, err)
	}
	return response{resp.StatusCode, m}
}

func TestAPI(t *testing.T) {
	base := startNode(t)
	events := base + "/v1/pipelines/logins/events"
	key := func(k string) string { return base + "/v1/pipelines/logins/keys/" + k }

	steps := []struct {
		name, method, url, ctype, body string
		status                         int
		want                           string // JSON the response must contain (subset)
	}{
		{"healthz", "GET", base + "/healthz", "", "", 200, `{"status":"ok"}`},
		{"readyz", "GET", base + "/readyz", "", "", 200, `{"status":"ready"}`},
		{"unseen key", "GET", key("alice"), "", "", 404, ``},
		{"ingest array", "POST", events, "application/json",
			`[{"user":{"id":"alice"},"event_id":"e1","type":"login_failed","amount":3,"geo":{"country":"DE"}},
			  {"user":{"id":"alice"},"event_id":"e2","amount":5},
			  {"user":{"id":7},"amount":1}]`, 200, `{"accepted":3,"duplicates":0}`},
		{"state", "GET", key("alice"), "", "", 200,
			`{"pipeline":"logins","key":"alice","seq":2,"aggregates":{"total":2,"failed":1,"amount":8,"biggest":5,"country":"DE"}}`},
		{"numeric key", "GET", key("7"), "", "", 200, `{"key":"7","seq":1,"aggregates":{"country":null}}`},
		{"retry is duplicate", "POST", events, "", `[{"user":{"id":"alice"},"event_id":"e1","amount":100}]`, 200, `{"accepted":0,"duplicates":1}`},
		{"duplicates counted", "GET", key("alice"), "", "", 200, `{"seq":2,"duplicates":1,"aggregates":{"amount":8}}`},
		{"duplicate in one batch", "POST", events, "", `[{"user":{"id":"bob"},"event_id":"x"},{"user":{"id":"bob"},"event_id":"x"}]`, 200, `{"accepted":1,"duplicates":1}`},
		{"ndjson", "POST", events, "application/x-ndjson", "{\"user\":{\"id\":\"carol\"},\"amount\":2}\n\n{\"user\":{\"id\":\"carol\"},\"amount\":4}\n", 200, `{"accepted":2,"duplicates":0}`},
		{"ndjson state", "GET", key("carol"), "", "", 200, `{"seq":2,"aggregates":{"amount":6,"biggest":4}}`},
		{"single object", "POST", events, "", `{"user":{"id":"dave"}}`, 200, `{"accepted":1}`},
		{"key with a slash", "POST", events, "", `{"user":{"id":"a/b c"}}`, 200, `{"accepted":1}`},
		{"escaped key", "GET", key(url.PathEscape("a/b c")), "", "", 200, `{"key":"a/b c","seq":1}`},
		{"empty array", "POST", events, "", `[]`, 200, `{"accepted":0,"duplicates":0}`},
		{"unknown pipeline", "POST", base + "/v1/pipelines/nope/events", "", `[]`, 404, ``},
		{"unknown pipeline query", "GET", base + "/v1/pipelines/nope/keys/a", "", "", 404, ``},
		{"no route", "GET", base + "/v2/nothing", "", "", 404, ``},
		{"wrong method", "DELETE", events, "", "", 405, ``},
		{"wrong type rejects batch", "POST", events, "",
			`[{"user":{"id":"erin"},"amount":1},{"user":{"id":"erin"},"amount":"lots"}]`, 400, ``},
		{"rejected batch changed nothing", "GET", key("erin"), "", "", 404, ``},
		{"missing key", "POST", events, "", `[{"amount":1}]`, 400, ``},
		{"not an object", "POST", events, "", `[1]`, 400, ``},
		{"not json", "POST", events, "", `[{"user":`, 400, ``},
		{"bad ndjson", "POST", events, "application/x-ndjson", "{\"user\":{\"id\":\"f\"}}\nnope\n", 400, ``},
		{"empty body", "POST", events, "", ``, 400, ``},
		{"ndjson without its content type", "POST", events, "application/json", "{\"user\":{\"id\":\"h\"}}\n{\"user\":{\"id\":\"h\"}}\n", 400, ``},
		{"too large", "POST", events, "", "[" + strings.Repeat(`{"user":{"id":"g"}},`, 400) + `{"user":{"id":"g"}}]`, 413, ``},
		{"too large changed nothing", "GET", key("g"), "", "", 404, ``},
	}
	for _, s := range steps {
		r := do(t, s.method, s.url, s.ctype, s.body)
		if r.status != s.status {
			t.Errorf("%s: status %d, want %d (body %v)", s.name, r.status, s.status, r.body)
			continue
		}
		if s.status >= 400 {
			if msg, _ := r.body["error"].(string); msg == "" {
				t.Errorf("%s: error response without a message: %v", s.name, r.body)
			}
			continue
		}
		if s.want != "" {
			var want map[string]any
			if err := json.Unmarshal([]byte(s.want), &want); err != nil {
				t.Fatalf("%s: bad want: %v", s.name, err)
			}
			if err := contains(r.body, want); err != nil {
				t.Errorf("%s: %v\n got %v", s.name, err, r.body)
			}
		}
	}
}

// TestErrorMessages checks that a rejected batch names the event and field.
func TestErrorMessages(t *testing.T) {
	base := startNode(t)
	events := base + "/v1/pipelines/logins/events"
	for _, c := range []struct{ body, want string }{
		{`[{"user":{"id":"a"}},{"user":{"id":"a"},"amount":"lots"}]`, `event 1: field "amount": sum needs a number, got string "lots"`},
		{`[{"amount":1}]`, `event 0: field "user.id": key field is missing`},
		{`[{"user":{"id":true}}]`, `event 0: field "user.id": key must be a string or a number, got bool true`},
		{`[{"user":{"id":"a"}}, 3]`, `event 1: event must be a JSON object`},
	} {
		r := do(t, "POST", events, "", c.body)
		if got, _ := r.body["error"].(string); r.status != 400 || got != c.want {
			t.Errorf("%s: got %d %q, want 400 %q", c.body, r.status, got, c.want)
		}
	}
	r := do(t, "POST", base+"/v1/pipelines/nope/events", "", `[]`)
	if got, _ := r.body["error"].(string); !strings.Contains(got, `"nope"`) {
		t.Errorf("unknown pipeline: message %q does not name it", got)
	}
}

// contains reports how got differs from want, where want is a subset.
func contains(got, want map[string]any) error {
	for k, w := range want {
		g, ok := got[k]
		if !ok {
			return fmt.Errorf("missing %q", k)
		}
		if wm, ok := w.(map[string]any); ok {
			gm, ok := g.(map[string]any)
			if !ok {
				return fmt.Errorf("%q: got %v, want an object", k, g)
			}
			if err := contains(gm, wm); err != nil {
				return fmt.Errorf("%s.%w", k, err)
			}
			continue
		}
		if fmt.Sprint(g) != fmt.Sprint(w) {
			return fmt.Errorf("%q: got %v, want %v", k, g, w)
		}
	}
	return nil
}

// TestDeleteKey: DELETE erases a key (204, no body); deleting again, or a
// key never seen, is fine; an unknown pipeline is 404.
func TestDeleteKey(t *testing.T) {
	base := startNode(t)
	key := base + "/v1/pipelines/logins/keys/alice"
	if r := do(t, "POST", base+"/v1/pipelines/logins/events", "", `[{"user":{"id":"alice"},"event_id":"e1","amount":3}]`); r.status != 200 {
		t.Fatalf("ingest: %v", r)
	}
	del := func(url string) int {
		req, _ := http.NewRequest(http.MethodDelete, url, nil)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		return resp.StatusCode
	}
	for i := range 2 {
		if got := del(key); got != http.StatusNoContent {
			t.Errorf("DELETE %d: %d, want 204", i+1, got)
		}
	}
	if r := do(t, "GET", key, "", ""); r.status != 404 {
		t.Errorf("GET after DELETE: %v", r)
	}
	if got := del(base + "/v1/pipelines/nope/keys/alice"); got != 404 {
		t.Errorf("DELETE in an unknown pipeline: %d, want 404", got)
	}
	if r := do(t, "POST", base+"/v1/pipelines/logins/events", "", `[{"user":{"id":"alice"},"event_id":"e1","amount":4}]`); r.status != 200 || r.body["accepted"] != float64(1) {
		t.Errorf("the deleted key's old id: %v, want applied afresh", r)
	}
}

// TestListPipelines: GET /v1/pipelines describes each pipeline, sorted by
// name, in the JSON of gRPC's ListPipelinesResponse: the same description
// over both transports, and through both Go clients.
func TestListPipelines(t *testing.T) {
	got := listPipelines(t, servicetest.DescribedYAML)
	// The whole answer, as the README documents it: fields that do not
	// apply are left out, durations are protobuf's JSON strings.
	want := `{"pipelines":[` +
		`{"name":"clicks","key_field":"page","aggregates":[{"name":"hits","op":"count"}]},` +
		`{"name":"logins","key_field":"user_id","id_field":"event_id","time_field":"ts",` +
		`"aggregates":[{"name":"amount","op":"sum","field":"amount"},{"name":"failed","op":"count","where":"type == 'login_failed'"},{"name":"total","op":"count"}],` +
		`"dedup_window":"86400s","ttl":"2592000s","out_of_orderness":"5s","allowed_lateness":"60s","idle_timeout":"30s","output_retention":"86400s",` +
		`"windows":[{"name":"last_hour","kind":"sliding","size":"3600s","slide":"300s","aggregates":["total"]},` +
		`{"name":"per_minute","kind":"tumbling","size":"60s","aggregates":["total","amount"]},` +
		`{"name":"sessions","kind":"session","gap":"1800s","aggregates":["amount","failed","total"]}],` +
		`"patterns":[{"name":"brute_force","kind":"threshold","where":"type == 'login_failed'","count":3,"within":"300s"},` +
		`{"name":"fail_then_ok","kind":"sequence","sequence":["type == 'login_failed'","type == 'login_ok'"],"within":"600s"},` +
		`{"name":"no_recovery","kind":"absence","after":"type == 'login_failed'","absent":"type == 'login_ok'","within":"900s"}]}]}`
	if got != want {
		t.Errorf("GET /v1/pipelines:\n got %s\nwant %s", got, want)
	}
}

// TestListJoins: GET /v1/pipelines lists the joins apart from the
// pipelines, each with its kind, mode and two sides (the JSON of gRPC's
// JoinInfo), and both Go clients read the same joins.
func TestListJoins(t *testing.T) {
	got := listPipelines(t, servicetest.JoinsYAML)
	times := `"out_of_orderness":"0s","allowed_lateness":"0s","idle_timeout":"30s","output_retention":"86400s"`
	want := `{"pipelines":[` +
		`{"name":"orders","key_field":"order_id","id_field":"event_id","time_field":"ts","dedup_window":"86400s"},` +
		`{"name":"payments","key_field":"order_id","id_field":"event_id","time_field":"ts","dedup_window":"86400s"}],` +
		`"joins":[` +
		`{"name":"paid","kind":"interval","mode":"left","left":{"pipeline":"orders","fields":["amount"]},"right":{"pipeline":"payments","fields":["amount","method"]},` +
		`"lower":"0s","upper":"3600s","out_of_orderness":"0s","allowed_lateness":"60s","idle_timeout":"30s","output_retention":"86400s"},` +
		`{"name":"per_hour","kind":"window","mode":"inner","left":{"pipeline":"orders"},"right":{"pipeline":"payments"},` +
		`"window":"sliding","size":"3600s","slide":"900s",` + times + `},` +
		`{"name":"rated","kind":"temporal","mode":"inner","left":{"pipeline":"payments"},"right":{"pipeline":"orders","fields":["amount"]},` +
		`"out_of_orderness":"0s","idle_timeout":"60s","output_retention":"86400s"},` +
		`{"name":"sessions","kind":"window","mode":"outer","left":{"pipeline":"orders"},"right":{"pipeline":"payments"},` +
		`"window":"session","gap":"600s","out_of_orderness":"5s","allowed_lateness":"0s","idle_timeout":"30s","output_retention":"86400s"}]}`
	if got != want {
		t.Errorf("GET /v1/pipelines:\n got %s\nwant %s", got, want)
	}
}

// listPipelines runs a node on the configuration and returns its answer
// to GET /v1/pipelines, having checked that the HTTP client reads from it
// the pipelines and joins the gRPC client does.
func listPipelines(t *testing.T, yaml string) string {
	t.Helper()
	cfg := servicetest.Config(t, yaml)
	cfg.HTTPAddr, cfg.GRPCAddr = "127.0.0.1:0", "127.0.0.1:0"
	n := servicetest.Run(t, cfg)
	base := "http://" + n.HTTPAddr()

	resp, err := http.Get(base + "/v1/pipelines")
	if err != nil {
		t.Fatal(err)
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Type") != "application/json" {
		t.Fatalf("GET /v1/pipelines: %s, Content-Type %q: %s", resp.Status, resp.Header.Get("Content-Type"), body)
	}

	hc := &httpapi.Client{Base: base}
	gc, err := client.Dial(n.GRPCAddr(), client.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer gc.Close()
	sameOverBoth(t, "pipeline", hc.Pipelines, gc.Pipelines)
	sameOverBoth(t, "join", hc.Joins, gc.Joins)
	return strings.TrimSpace(string(body))
}

// sameOverBoth checks that the HTTP client's list equals the gRPC one's.
func sameOverBoth[M proto.Message](t *testing.T, what string, viaHTTP, viaGRPC func(context.Context) ([]M, error)) {
	t.Helper()
	h, err := viaHTTP(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	g, err := viaGRPC(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if len(h) != len(g) {
		t.Fatalf("%d %ss over HTTP, %d over gRPC", len(h), what, len(g))
	}
	for i := range g {
		if !proto.Equal(h[i], g[i]) {
			t.Errorf("%s %d:\n HTTP %v\n gRPC %v", what, i, h[i], g[i])
		}
	}
}
