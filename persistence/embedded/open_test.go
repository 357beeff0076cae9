package embedded_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/keyfold/keyfold/persistence"
	"github.com/keyfold/keyfold/persistence/embedded"
)

// A directory holds one open store at a time.
func TestOpenLocksDir(t *testing.T) {
	dir := t.TempDir()
	s := open(t, dir)
	for _, d := range []string{dir, dir + "/", filepath.Join(dir, ".")} {
		if s2, err := embedded.Open(d, embedded.Options{}); err == nil {
			s2.Close()
			t.Fatalf("second Open(%q) succeeded, want an error", d)
		} else if !strings.Contains(err.Error(), "in use") {
			t.Errorf("second Open(%q) = %v, want an error saying the directory is in use", d, err)
		}
	}
	// A relative path to the same directory is the same directory.
	wd, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	if rel, err := filepath.Rel(wd, dir); err == nil {
		if s2, err := embedded.Open(rel, embedded.Options{}); err == nil {
			s2.Close()
			t.Errorf("second Open(%q) succeeded, want an error", rel)
		}
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	open(t, dir).Close()
}

func TestOptionsValidate(t *testing.T) {
	if err := (embedded.Options{}).Validate(); err != nil {
		t.Errorf("zero Options: %v", err)
	}
	err := embedded.Options{CacheSize: -1, MemTableSize: 4 << 30}.Validate()
	if err == nil || !strings.Contains(err.Error(), "CacheSize") || !strings.Contains(err.Error(), "MemTableSize") {
		t.Errorf("Validate = %v, want both problems", err)
	}
	if _, err := embedded.Open(t.TempDir(), embedded.Options{CacheSize: -1}); err == nil {
		t.Error("Open with invalid options succeeded")
	}
}

// Trimming beyond the last position would let later records land at or below
// the checkpoint.
func TestTrimBeyondLast(t *testing.T) {
	ctx := t.Context()
	s := open(t, t.TempDir())
	defer s.Close()
	st, err := s.Claim(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Append(ctx, []persistence.Entry{{Group: 1, Epoch: st.Epoch, Data: []byte("a")}}); err != nil {
		t.Fatal(err)
	}
	if err := s.Checkpoint(ctx, 1, st.Epoch, persistence.CheckpointData{Through: 2}); err == nil {
		t.Error("Trim beyond the last position succeeded")
	}
	if err := s.Checkpoint(ctx, 1, st.Epoch, persistence.CheckpointData{Through: 1}); err != nil {
		t.Errorf("Trim through the last position: %v", err)
	}
}

// The fenced error names every fenced group.
func TestAppendFencedNamesGroups(t *testing.T) {
	ctx := t.Context()
	s := open(t, t.TempDir())
	defer s.Close()
	_, err := s.Append(ctx, []persistence.Entry{{Group: 7, Epoch: 1}, {Group: 9, Epoch: 1}})
	if !errors.Is(err, persistence.ErrFenced) || !strings.Contains(err.Error(), "group 7") || !strings.Contains(err.Error(), "group 9") {
		t.Errorf("Append = %v, want ErrFenced naming groups 7 and 9", err)
	}
}

// Fencing is per entry: in a call that carries a group's current epoch
// and an old one, only the entries with the current one are appended, at
// consecutive positions, and the others get position 0 and ErrFenced.
func TestAppendFencedPerEntry(t *testing.T) {
	ctx := t.Context()
	s := open(t, t.TempDir())
	defer s.Close()
	old, err := s.Claim(ctx, 5)
	if err != nil {
		t.Fatal(err)
	}
	cur, err := s.Claim(ctx, 5)
	if err != nil {
		t.Fatal(err)
	}
	other, err := s.Claim(ctx, 9)
	if err != nil {
		t.Fatal(err)
	}
	for i, entries := range [][]persistence.Entry{
		{{Group: 5, Epoch: old.Epoch, Data: []byte("stale")}, {Group: 5, Epoch: cur.Epoch, Data: []byte("5-a")}, {Group: 9, Epoch: other.Epoch, Data: []byte("9-a")}},
		{{Group: 9, Epoch: other.Epoch, Data: []byte("9-b")}, {Group: 5, Epoch: old.Epoch, Data: []byte("stale")}, {Group: 5, Epoch: cur.Epoch, Data: []byte("5-b")}},
	} {
		pos, err := s.Append(ctx, entries)
		if !errors.Is(err, persistence.ErrFenced) {
			t.Errorf("call %d: err = %v, want ErrFenced", i, err)
		}
		for k, e := range entries {
			if want := e.Epoch != old.Epoch || e.Group != 5; (pos[k] != 0) != want {
				t.Errorf("call %d: entry %q got position %d", i, e.Data, pos[k])
			}
		}
	}
	for g, want := range map[uint32][]string{5: {"5-a", "5-b"}, 9: {"9-a", "9-b"}} {
		pos, data := readAll(t, s, g)
		var got []string
		for _, d := range data {
			got = append(got, string(d))
		}
		if strings.Join(got, ",") != strings.Join(want, ",") || pos[0] != 1 || pos[1] != 2 {
			t.Errorf("group %d: %v at %v, want %v at 1, 2", g, got, pos, want)
		}
	}
}

// Pebble logs nothing at info level or above in normal operation.
func TestQuietLogging(t *testing.T) {
	var buf bytes.Buffer
	log := slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelInfo}))
	dir := t.TempDir()
	ctx := context.Background()
	for range 2 {
		s, err := embedded.Open(dir, embedded.Options{Logger: log})
		if err != nil {
			t.Fatal(err)
		}
		st, err := s.Claim(ctx, 1)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := s.Append(ctx, []persistence.Entry{{Group: 1, Epoch: st.Epoch, Data: []byte("a")}}); err != nil {
			t.Fatal(err)
		}
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
	}
	if buf.Len() > 0 {
		t.Errorf("logged at info or above:\n%s", buf.String())
	}
}

// Close waits for a Read in progress, and calls from its fn fail cleanly.
func TestCloseDuringRead(t *testing.T) {
	ctx := t.Context()
	s := open(t, t.TempDir())
	st, err := s.Claim(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Append(ctx, []persistence.Entry{{Group: 1, Epoch: st.Epoch, Data: []byte("a")}, {Group: 1, Epoch: st.Epoch, Data: []byte("b")}}); err != nil {
		t.Fatal(err)
	}
	closed := make(chan error)
	err = s.Read(ctx, 1, 0, func(p persistence.Position, _ []byte) error {
		if p == 1 {
			go func() { closed <- s.Close() }()
			// Close cannot finish while this Read runs; wait until it has
			// begun, which fences new calls.
			for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); {
				if _, err := s.Get(ctx, 1, "k"); errors.Is(err, persistence.ErrClosed) {
					return nil
				}
			}
			return errors.New("Close did not begin within 10s")
		}
		return nil
	})
	if err != nil {
		t.Errorf("Read: %v", err)
	}
	if err := <-closed; err != nil {
		t.Errorf("Close: %v", err)
	}
}
