package embedded_test

import (
	"testing"

	"github.com/keyfold/keyfold/persistence"
	"github.com/keyfold/keyfold/persistence/embedded"
	"github.com/keyfold/keyfold/persistence/persistencetest"
)

func TestStore(t *testing.T) {
	persistencetest.Run(t, persistencetest.Harness{
		New: func(t *testing.T) persistence.Store {
			return open(t, t.TempDir())
		},
		Reopen: func(t *testing.T, s persistence.Store) persistence.Store {
			es := s.(*embedded.Store)
			if err := es.Close(); err != nil {
				t.Fatalf("Close: %v", err)
			}
			return open(t, es.Dir())
		},
	})
}

func open(t testing.TB, dir string) *embedded.Store {
	t.Helper()
	s, err := embedded.Open(dir, embedded.Options{})
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	return s
}
