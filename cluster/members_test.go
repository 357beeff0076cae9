package cluster

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/keyfold/keyfold/persistence/redisstore/redistest"
)

// TestRegistry: members join by taking a lease, leave at once when they say
// so, and drop out when their lease runs out (failure detection); the
// server's clock decides.
func TestRegistry(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client()
	defer c.Close()
	ctx := context.Background()
	lease := 300 * time.Millisecond
	a, b := NewRegistry(c, "t", lease), NewRegistry(c, "t", lease)
	if ms, err := a.Renew(ctx, "127.0.0.1:7001"); err != nil || !slices.Equal(ms, []string{"127.0.0.1:7001"}) {
		t.Fatalf("first join: %v %v", ms, err)
	}
	if ms, err := b.Renew(ctx, "127.0.0.1:7002"); err != nil || len(ms) != 2 {
		t.Fatalf("second join: %v %v", ms, err)
	}
	if err := b.Leave(ctx, "127.0.0.1:7002"); err != nil {
		t.Fatal(err)
	}
	if ms, _ := a.Members(ctx); !slices.Equal(ms, []string{"127.0.0.1:7001"}) {
		t.Fatalf("after a leave: %v", ms)
	}
	// 7003 joins and then stops renewing (a kill): it is gone after the
	// lease, while 7001, renewing, stays.
	if _, err := b.Renew(ctx, "127.0.0.1:7003"); err != nil {
		t.Fatal(err)
	}
	joined := time.Now()
	for {
		ms, err := a.Renew(ctx, "127.0.0.1:7001")
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Contains(ms, "127.0.0.1:7003") {
			if since := time.Since(joined); since < lease {
				t.Fatalf("7003 dropped after %v, before its lease of %v ran out", since, lease)
			}
			if !slices.Equal(ms, []string{"127.0.0.1:7001"}) {
				t.Fatalf("members %v", ms)
			}
			break
		}
		if time.Since(joined) > 20*lease {
			t.Fatalf("7003 still listed %v after its last renewal (lease %v)", time.Since(joined), lease)
		}
		time.Sleep(lease / 6)
	}
	// Extend tells a renewal from a lease taken anew: 7004's first is new,
	// its next one extends it, and once it ran out (the others dropped
	// 7004) the next is new again.
	if _, held, err := b.Extend(ctx, "127.0.0.1:7004"); err != nil || held {
		t.Fatalf("first lease of 7004: held %v, %v; want a new lease", held, err)
	}
	if ms, held, err := b.Extend(ctx, "127.0.0.1:7004"); err != nil || !held || !slices.Contains(ms, "127.0.0.1:7004") {
		t.Fatalf("renewal of 7004: %v held %v, %v; want its lease extended", ms, held, err)
	}
	for extended := time.Now(); ; {
		ms, err := a.Renew(ctx, "127.0.0.1:7001")
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Contains(ms, "127.0.0.1:7004") {
			break
		}
		if time.Since(extended) > 20*lease {
			t.Fatalf("7004 still listed %v after its last renewal (lease %v)", time.Since(extended), lease)
		}
		time.Sleep(lease / 6)
	}
	if ms, held, err := b.Extend(ctx, "127.0.0.1:7004"); err != nil || held || !slices.Contains(ms, "127.0.0.1:7004") {
		t.Fatalf("7004 after its lease ran out: %v held %v, %v; want a new lease", ms, held, err)
	}
	if _, err := a.Renew(ctx, "bad id"); err == nil {
		t.Error("an id with a space was accepted")
	}
	other := NewRegistry(c, "other", lease) // another deployment's prefix
	if ms, _ := other.Members(ctx); len(ms) != 0 {
		t.Errorf("prefixes are not isolated: %v", ms)
	}
	if ms, _ := (Static{"b", "a", "b"}).Members(ctx); !slices.Equal(ms, []string{"a", "b"}) {
		t.Errorf("static: %v", ms)
	}
}
