package actors

import (
	"reflect"
	"testing"
)

// The grain's layout (grain): what never changes in its first cache line,
// through keyBytes; what the commit loop writes in its second, group
// through stop; the actor's after. And the 448-byte size class, whose
// objects start at a cache line (the next smaller class's, 416 bytes, do
// not).
func TestGrainLayout(t *testing.T) {
	typ := reflect.TypeFor[grain]()
	if size := typ.Size(); size <= 416 || size > 448 {
		t.Errorf("grain is %d bytes, not in the 448-byte size class", size)
	}
	line := 0 // the line the fields so far must be in
	for i := range typ.NumField() {
		f := typ.Field(i)
		if f.Name == "group" || f.Name == "current" {
			line++
		}
		first, last := f.Offset/64, (f.Offset+f.Type.Size()-1)/64
		switch {
		case line < 2 && (first != uintptr(line) || last != uintptr(line)):
			t.Errorf("grain.%s is at bytes %d-%d, not in line %d", f.Name, f.Offset, f.Offset+f.Type.Size()-1, line)
		case line == 2 && first < 2:
			t.Errorf("grain.%s is at byte %d, in the commit loop's lines", f.Name, f.Offset)
		}
	}
}
