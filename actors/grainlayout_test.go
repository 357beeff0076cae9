package actors

import (
	"testing"
	"unsafe"
)

// The grain's layout (grain): what never changes in its first cache line,
// what the commit loop writes in its second, the actor's after; and within
// the 448-byte size class, whose objects start at a line.
func TestGrainLayout(t *testing.T) {
	var g grain
	if size := unsafe.Sizeof(g); size > 448 {
		t.Errorf("grain is %d bytes, beyond its 448-byte size class", size)
	}
	if off := unsafe.Offsetof(g.keyBytes) + grainKeyBytes; off > 64 {
		t.Errorf("the grain's first line ends at %d", off)
	}
	if off := unsafe.Offsetof(g.group); off != 64 {
		t.Errorf("the commit loop's fields start at %d, want 64", off)
	}
	if off := unsafe.Offsetof(g.stop) + unsafe.Sizeof(g.stop); off > 128 {
		t.Errorf("the commit loop's fields end at %d, beyond the second line", off)
	}
}
