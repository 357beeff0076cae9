package actors

import "testing"

// The active keys' limit (resident.go): lowered by what the resident tier
// is over its budget (at least activeStep keys, not below the floor),
// which that budget gains at ActiveKeyBytes a key; raised back into half
// the room the tier has, not above MaxActive; left alone without a
// resident tier.
func TestActiveLimitYieldsAndRegrows(t *testing.T) {
	defer func(n int) { activeFloorMin = n }(activeFloorMin)
	activeFloorMin = 1000 // (an eighth of MaxActive is less)
	const maxActive = 8_000
	h := &Host{cfg: Config{MaxActive: maxActive, MaxMemory: 1 << 30}}
	r := &h.resident
	r.keys = maxActive*ActiveKeyBytes + 1<<20
	h.setActiveMaxLocked(maxActive)
	if r.max != 1<<20 {
		t.Fatalf("resident budget %d, want what MaxActive leaves, %d", r.max, 1<<20)
	}

	r.bytes = r.max + 10 // over by a little: lowered by activeStep
	if !h.yieldActiveLocked() || r.activeMax != maxActive-activeStep || r.max != 1<<20+activeStep*ActiveKeyBytes {
		t.Fatalf("after a small excess: limit %d, budget %d; want %d, %d", r.activeMax, r.max, maxActive-activeStep, 1<<20+activeStep*ActiveKeyBytes)
	}
	r.bytes = r.max + 2000*ActiveKeyBytes + 1 // over by more than a step: by as many keys as cover it
	if !h.yieldActiveLocked() || r.activeMax != maxActive-activeStep-2001 || r.bytes > r.max {
		t.Fatalf("after a large excess: limit %d, budget %d for %d bytes", r.activeMax, r.max, r.bytes)
	}
	r.bytes = r.keys // over by everything: down to the floor, not below
	if !h.yieldActiveLocked() || r.activeMax != 1000 {
		t.Fatalf("limit %d, want the floor 1000", r.activeMax)
	}
	if h.yieldActiveLocked() || r.activeMax != 1000 {
		t.Fatalf("at the floor: lowered again, to %d", r.activeMax)
	}

	r.bytes = r.max - 4000*ActiveKeyBytes // room for 4000 keys: half of it
	h.regrowActiveLocked()
	if r.activeMax != 3000 || r.bytes > r.max {
		t.Fatalf("after regrowing into room for 4000 keys: limit %d (want 3000), budget %d for %d bytes", r.activeMax, r.max, r.bytes)
	}
	r.bytes = 0 // room for all: back to MaxActive, over a few ticks
	for range 20 {
		h.regrowActiveLocked()
	}
	if r.activeMax != maxActive {
		t.Fatalf("with the tier empty: limit %d, want MaxActive %d", r.activeMax, maxActive)
	}

	for _, c := range []struct{ maxActive, floor int }{{174_762, 21_845}, {8000, 1000}, {5, 5}} {
		if got := (&Config{MaxActive: c.maxActive}).activeFloor(); got != c.floor {
			t.Errorf("MaxActive %d: floor %d, want %d", c.maxActive, got, c.floor)
		}
	}

	none := &Host{cfg: Config{MaxActive: maxActive, MaxMemory: -1}}
	none.setActiveMaxLocked(maxActive)
	none.resident.bytes = 1
	if none.yieldActiveLocked() || none.resident.activeMax != maxActive {
		t.Errorf("without a resident tier the limit moved to %d", none.resident.activeMax)
	}
}
