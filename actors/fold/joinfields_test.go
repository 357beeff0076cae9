package fold

import (
	"reflect"
	"testing"
	"time"
	"unsafe"
)

// fillNonZero sets every field of the struct v points to, recursively, to a
// value that is not its zero value (slices get two elements).
func fillNonZero(t *testing.T, v reflect.Value, seed *int) {
	t.Helper()
	*seed++
	switch v.Kind() {
	case reflect.Struct:
		for i := range v.NumField() {
			f := v.Field(i)
			fillNonZero(t, reflect.NewAt(f.Type(), unsafe.Pointer(f.UnsafeAddr())).Elem(), seed) // unexported too
		}
	case reflect.Array:
		for i := range v.Len() {
			fillNonZero(t, v.Index(i), seed)
		}
	case reflect.Slice:
		if v.Type().Elem().Kind() == reflect.Uint8 {
			v.SetBytes([]byte(`{"f":` + string(rune('0'+*seed%10)) + `}`))
			return
		}
		s := reflect.MakeSlice(v.Type(), 2, 2)
		for i := range 2 {
			fillNonZero(t, s.Index(i), seed)
		}
		v.Set(s)
	case reflect.String:
		v.SetString(string(rune('a' + *seed%26)))
	case reflect.Int, reflect.Int64:
		v.SetInt(int64(*seed) * 1000)
	case reflect.Uint64, reflect.Uint32:
		v.SetUint(uint64(*seed))
	case reflect.Bool:
		v.SetBool(true)
	default:
		t.Fatalf("fillNonZero: a field of kind %v: teach the test (and the snapshot) about it", v.Kind())
	}
}

// TestJoinStateEncodesEveryField: every field of a join key's state
// survives its snapshot. A field added to joinState or joinEvent without
// being encoded fails this test.
func TestJoinStateEncodesEveryField(t *testing.T) {
	lower, upper := time.Duration(0), time.Second
	p := &Pipeline{name: "j", join: &join{kind: intervalJoin, mode: outerJoin, lower: lower.Milliseconds(), upper: upper.Milliseconds()}}
	var js joinState
	seed := 0
	fillNonZero(t, reflect.ValueOf(&js).Elem(), &seed)
	for i := range js.sides { // as the state keeps them: ordered, distinct
		if compareJoinEvents(js.sides[i][0], js.sides[i][1]) > 0 {
			js.sides[i][0], js.sides[i][1] = js.sides[i][1], js.sides[i][0]
		}
	}
	s := State{timeState: &timeState{join: &js}}
	var back State
	back.timeState = &timeState{}
	p.restoreJoin(&back, joinProto(&s))
	if !reflect.DeepEqual(back.join, &js) {
		t.Fatalf("join state after its snapshot:\n%+v\nwant\n%+v", back.join, &js)
	}
}
