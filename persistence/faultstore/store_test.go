package faultstore_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/keyfold/keyfold/persistence"
	"github.com/keyfold/keyfold/persistence/embedded"
	"github.com/keyfold/keyfold/persistence/faultstore"
	"github.com/keyfold/keyfold/persistence/persistencetest"
)

var errBoom = errors.New("boom")

// Without faults the wrapper is transparent.
func TestConformance(t *testing.T) {
	persistencetest.Run(t, persistencetest.Harness{
		New: func(t *testing.T) persistence.Store {
			return faultstore.New(openEmbedded(t, t.TempDir()))
		},
		Reopen: func(t *testing.T, s persistence.Store) persistence.Store {
			inner := s.(*faultstore.Store).Inner().(*embedded.Store)
			if err := s.Close(); err != nil {
				t.Fatalf("Close: %v", err)
			}
			return faultstore.New(openEmbedded(t, inner.Dir()))
		},
	})
}

func openEmbedded(t *testing.T, dir string) *embedded.Store {
	t.Helper()
	s, err := embedded.Open(dir, embedded.Options{})
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	return s
}

func newStore(t *testing.T) (*faultstore.Store, persistence.Epoch) {
	t.Helper()
	s := faultstore.New(openEmbedded(t, t.TempDir()))
	t.Cleanup(func() { s.Close() })
	st, err := s.Claim(t.Context(), 1)
	if err != nil {
		t.Fatal(err)
	}
	return s, st.Epoch
}

func readAll(t *testing.T, s persistence.Store) []string {
	t.Helper()
	var got []string
	err := s.Read(t.Context(), 1, 0, func(_ persistence.Position, d []byte) error {
		got = append(got, string(d))
		return nil
	})
	if err != nil {
		t.Fatalf("Read: %v", err)
	}
	return got
}

func TestFailNext(t *testing.T) {
	ctx := t.Context()
	s, ep := newStore(t)
	s.FailNext(faultstore.OpAppend, errBoom)
	pos, err := s.Append(ctx, []persistence.Entry{{Group: 1, Epoch: ep, Data: []byte("a")}})
	if !errors.Is(err, errBoom) || len(pos) != 1 || pos[0] != 0 {
		t.Fatalf("Append = %v, %v, want [0], errBoom", pos, err)
	}
	if got := readAll(t, s); len(got) != 0 {
		t.Errorf("failed Append wrote %q", got)
	}
	pos, err = s.Append(ctx, []persistence.Entry{{Group: 1, Epoch: ep, Data: []byte("b")}})
	if err != nil || pos[0] != 1 {
		t.Errorf("next Append = %v, %v, want [1], no error", pos, err)
	}
	if n := s.Calls(faultstore.OpAppend); n != 2 {
		t.Errorf("Calls(OpAppend) = %d, want 2", n)
	}
}

func TestFailNth(t *testing.T) {
	ctx := t.Context()
	s, ep := newStore(t)
	s.FailNth(faultstore.OpCheckpoint, 2, errBoom)
	for i, want := range []error{nil, errBoom, nil} {
		err := s.Checkpoint(ctx, 1, ep, persistence.CheckpointData{Snapshots: []persistence.Snapshot{{Key: "k", Data: []byte{byte('a' + i)}}}})
		if !errors.Is(err, want) || (want == nil && err != nil) {
			t.Errorf("Put %d = %v, want %v", i+1, err, want)
		}
	}
	if got, err := s.Get(ctx, 1, "k"); err != nil || string(got) != "c" {
		t.Errorf("Get = %q, %v, want %q", got, err, "c")
	}
}

// A fault After the call lets the write through and fails the caller.
func TestFailAfter(t *testing.T) {
	ctx := t.Context()
	s, ep := newStore(t)
	s.Inject(faultstore.OpAppend, 1, faultstore.Fault{Err: errBoom, After: true})
	pos, err := s.Append(ctx, []persistence.Entry{{Group: 1, Epoch: ep, Data: []byte("a")}})
	if !errors.Is(err, errBoom) || pos[0] != 0 {
		t.Fatalf("Append = %v, %v, want [0], errBoom", pos, err)
	}
	if got := readAll(t, s); len(got) != 1 || got[0] != "a" {
		t.Errorf("log = %q, want the record of the failed Append", got)
	}
}

func TestDelay(t *testing.T) {
	s, _ := newStore(t)
	s.DelayNext(faultstore.OpGet, 20*time.Millisecond)
	start := time.Now()
	if _, err := s.Get(t.Context(), 1, "k"); !errors.Is(err, persistence.ErrNotFound) {
		t.Errorf("delayed Get = %v, want ErrNotFound", err)
	}
	if d := time.Since(start); d < 20*time.Millisecond {
		t.Errorf("delayed Get took %v, want 20ms or more", d)
	}

	// A delay ends with the call's context, and the call does not happen.
	s.InjectAll(faultstore.OpClaim, faultstore.Fault{Delay: time.Hour})
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Millisecond)
	defer cancel()
	if _, err := s.Claim(ctx, 1); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Claim delayed past its deadline = %v, want DeadlineExceeded", err)
	}
	s.Reset()
	if st, err := s.Claim(t.Context(), 1); err != nil || st.Epoch != 2 {
		t.Errorf("Claim after Reset = %+v, %v, want epoch 2", st, err)
	}
}

// Concurrent calls are numbered once each: exactly one gets the fault.
func TestConcurrent(t *testing.T) {
	s, _ := newStore(t)
	s.FailNth(faultstore.OpGet, 5, errBoom)
	var (
		wg     sync.WaitGroup
		mu     sync.Mutex
		failed int
	)
	for range 8 {
		wg.Go(func() {
			for range 4 {
				_, err := s.Get(t.Context(), 1, "k")
				if errors.Is(err, errBoom) {
					mu.Lock()
					failed++
					mu.Unlock()
				}
			}
		})
	}
	wg.Wait()
	if failed != 1 {
		t.Errorf("%d calls failed, want 1", failed)
	}
	if n := s.Calls(faultstore.OpGet); n != 32 {
		t.Errorf("Calls(OpGet) = %d, want 32", n)
	}
}

// The timer index and output log calls have operations of their own.
func TestOutputOps(t *testing.T) {
	ctx := t.Context()
	s, ep := newStore(t)
	d := persistence.CheckpointData{
		Timers:  []persistence.Timer{{Key: "k", Due: 5}},
		Outputs: []persistence.Output{{Pipeline: "p", Data: []byte("o")}},
	}
	if err := s.Checkpoint(ctx, 1, ep, d); err != nil {
		t.Fatal(err)
	}
	s.FailNext(faultstore.OpTimers, errBoom)
	s.FailNext(faultstore.OpReadOutputs, errBoom)
	s.FailNext(faultstore.OpTrimOutputs, errBoom)
	noTimer := func(string, int64) error { return nil }
	if err := s.Timers(ctx, 1, noTimer); !errors.Is(err, errBoom) {
		t.Errorf("Timers = %v, want errBoom", err)
	}
	if got, err := s.ReadOutputs(ctx, "p", "", 10); !errors.Is(err, errBoom) || got != nil {
		t.Errorf("ReadOutputs = %v, %v, want errBoom", got, err)
	}
	if n, err := s.TrimOutputs(ctx, "p", time.Now().Add(time.Hour)); !errors.Is(err, errBoom) || n != 0 {
		t.Errorf("TrimOutputs = %d, %v, want errBoom", n, err)
	}
	// The failed trim did not reach the store; the next calls pass.
	if got, err := s.ReadOutputs(ctx, "p", "", 10); err != nil || len(got) != 1 {
		t.Errorf("ReadOutputs = %v, %v, want the one output", got, err)
	}
	if err := s.Timers(ctx, 1, noTimer); err != nil {
		t.Errorf("Timers: %v", err)
	}
	for op, want := range map[faultstore.Op]int{faultstore.OpTimers: 2, faultstore.OpReadOutputs: 2, faultstore.OpTrimOutputs: 1, faultstore.OpGet: 0} {
		if n := s.Calls(op); n != want {
			t.Errorf("Calls(%v) = %d, want %d", op, n, want)
		}
	}
}

func TestOpString(t *testing.T) {
	if got := faultstore.OpCheckGroups.String(); got != "CheckGroups" {
		t.Errorf("OpCheckGroups.String() = %q", got)
	}
	if got := faultstore.OpTrimOutputs.String(); got != "TrimOutputs" {
		t.Errorf("OpTrimOutputs.String() = %q", got)
	}
	if got := faultstore.Op(99).String(); got != "Op(99)" {
		t.Errorf("Op(99).String() = %q", got)
	}
}
