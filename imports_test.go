package keyfold_test

import (
	"bytes"
	"encoding/json"
	"os/exec"
	"strings"
	"testing"
)

// The house rules on which package may import which (DESIGN: dependencies
// point one way, cmd → keyfold → services, cluster → actors → persistence;
// proto is a leaf). Each rule names the packages it governs by a pattern
// relative to the module ("actors/..." is actors and everything under it),
// the packages they must not depend on, and why. Only non-test code counts:
// a test may start whatever real component it needs.
var importRules = []struct {
	pkgs   string
	direct []string // must not be imported directly (std or third-party)
	deps   []string // module packages that must not be reached, even through others
	why    string
}{
	{
		pkgs:   "actors/...",
		direct: []string{"net/http", "github.com/redis/go-redis/...", "google.golang.org/grpc/..."},
		deps:   []string{".", "services/...", "cluster/...", "cmd/...", "persistence/redisstore/...", "persistence/embedded/..."},
		why:    "the per-key core and its actors know no transport and no concrete store",
	},
	{
		pkgs: "cluster/...",
		deps: []string{".", "services/...", "cmd/...", "persistence/redisstore/...", "persistence/embedded/..."},
		why:  "the cluster is a wing the root uses, never the other way round; it reaches the store only through persistence's interfaces",
	},
	{
		pkgs: "persistence/...",
		deps: []string{".", "actors/...", "cluster/...", "services/...", "cmd/..."},
		why:  "stores keep bytes; they know nothing of what the bytes mean",
	},
	{
		pkgs: "proto/...",
		deps: []string{".", "actors/...", "cluster/...", "persistence/...", "services/...", "cmd/..."},
		why:  "the wire and persisted formats are a leaf",
	},
	{
		// servicetest starts whole nodes for the transports' tests: it is
		// test support, not a transport.
		pkgs: "services/...",
		deps: []string{"cmd/..."},
		why:  "transports adapt the node; the CLI sits on top of them",
	},
}

// TestImportRules holds the rules above: it lists every package of the
// module with `go list` and reports each forbidden import with the rule's
// reason.
func TestImportRules(t *testing.T) {
	// go test puts its own GOROOT/bin first on PATH.
	out, err := exec.Command("go", "list", "-json=ImportPath,Imports,Deps", "./...").Output()
	if err != nil {
		var stderr []byte
		if ee, ok := err.(*exec.ExitError); ok {
			stderr = ee.Stderr
		}
		t.Fatalf("go list: %v\n%s", err, stderr)
	}
	const module = "github.com/keyfold/keyfold"
	type pkg struct {
		ImportPath    string
		Imports, Deps []string
	}
	var pkgs []pkg
	for dec := json.NewDecoder(bytes.NewReader(out)); dec.More(); {
		var p pkg
		if err := dec.Decode(&p); err != nil {
			t.Fatalf("go list output: %v", err)
		}
		pkgs = append(pkgs, p)
	}
	if len(pkgs) < 10 {
		t.Fatalf("go list found %d packages: the rules would check nothing", len(pkgs))
	}
	// rel turns a module path into the rule's form ("." for the root).
	rel := func(path string) (string, bool) {
		if path == module {
			return ".", true
		}
		r, ok := strings.CutPrefix(path, module+"/")
		return r, ok
	}
	governed := map[string]int{}
	for _, p := range pkgs {
		name, _ := rel(p.ImportPath)
		for _, r := range importRules {
			if !matchPattern(r.pkgs, name) || (r.pkgs == "services/..." && name == "services/servicetest") {
				continue
			}
			governed[r.pkgs]++
			for _, imp := range p.Imports {
				for _, f := range r.direct {
					if matchPattern(f, imp) {
						t.Errorf("%s imports %s: %s", name, imp, r.why)
					}
				}
			}
			for _, d := range p.Deps {
				dr, ok := rel(d)
				if !ok {
					continue
				}
				for _, f := range r.deps {
					if matchPattern(f, dr) {
						t.Errorf("%s depends on %s: %s", name, dr, r.why)
					}
				}
			}
		}
	}
	for _, r := range importRules {
		if governed[r.pkgs] == 0 {
			t.Errorf("rule %q governs no package: the layout changed, update the rule", r.pkgs)
		}
	}
}

// matchPattern reports whether path matches pattern, where "x/..." matches
// x and everything below it.
func matchPattern(pattern, path string) bool {
	if base, ok := strings.CutSuffix(pattern, "/..."); ok {
		return path == base || strings.HasPrefix(path, base+"/")
	}
	return path == pattern
}

// The rules must catch what they are meant to catch: matchPattern is what
// decides, so its edges are pinned.
func TestMatchPattern(t *testing.T) {
	for _, c := range []struct {
		pattern, path string
		want          bool
	}{
		{"actors/...", "actors", true},
		{"actors/...", "actors/fold", true},
		{"actors/...", "actorsx", false},
		{".", ".", true},
		{".", "actors", false},
		{"net/http", "net/http", true},
		{"net/http", "net/http/httptrace", false},
		{"google.golang.org/grpc/...", "google.golang.org/grpc", true},
		{"google.golang.org/grpc/...", "google.golang.org/grpc/codes", true},
	} {
		if got := matchPattern(c.pattern, c.path); got != c.want {
			t.Errorf("matchPattern(%q, %q) = %v, want %v", c.pattern, c.path, got, c.want)
		}
	}
}
