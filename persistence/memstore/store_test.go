package memstore_test

import (
	"testing"

	"github.com/keyfold/keyfold/persistence"
	"github.com/keyfold/keyfold/persistence/memstore"
	"github.com/keyfold/keyfold/persistence/persistencetest"
)

func TestConformance(t *testing.T) {
	persistencetest.Run(t, persistencetest.Harness{
		New: func(t *testing.T) persistence.Store { return memstore.New() },
		Reopen: func(t *testing.T, s persistence.Store) persistence.Store {
			if err := s.Close(); err != nil {
				t.Fatal(err)
			}
			return s.(*memstore.Store).Reopen()
		},
	})
}
