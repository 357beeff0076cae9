package fold

import "unsafe"

// Sizes MemSize charges for what it does not measure one by one: a map
// entry with its share of the table, and the sketches, whose memory their
// libraries do not report (a dense HyperLogLog of precision 14 is 16 KiB;
// a DDSketch of a few hundred bins about 2 KiB).
const (
	mapEntryBytes = 48
	hllBytes      = 16 << 10
	ddBytes       = 2 << 10
)

// MemSize estimates the bytes the state holds in memory, for a host that
// keeps keys in memory within a budget of bytes. It is an estimate (Go does
// not say what a map or a slice's spare capacity takes), meant to follow
// the state's real size within a small factor, and cheap: it walks slices,
// not maps.
func (s *State) MemSize() int {
	n := int(unsafe.Sizeof(*s))
	n += s.aggs.memSize()
	n += s.ids.memSize() + s.h.memSize()
	if s.timeState == nil {
		return n
	}
	n += int(unsafe.Sizeof(*s.timeState))
	n += cap(s.lateWin) * 8
	for i := range s.wins {
		n += int(unsafe.Sizeof(s.wins[i])) + s.wins[i].aggs.memSize() + cap(s.wins[i].superseded)*int(unsafe.Sizeof(resultRef{}))
	}
	n += cap(s.wait) * int(unsafe.Sizeof(waiting{}))
	for i := range s.pats {
		n += int(unsafe.Sizeof(s.pats[i])) + (cap(s.pats[i].times)+cap(s.pats[i].starts))*8
	}
	if js := s.join; js != nil {
		n += int(unsafe.Sizeof(*js))
		for _, es := range js.sides {
			n += cap(es) * int(unsafe.Sizeof(joinEvent{}))
			for _, e := range es {
				n += len(e.id) + cap(e.fields)
			}
		}
	}
	n += len(s.out) * 256 // results not yet taken: only between an apply and its take
	return n
}

// memSize estimates the bytes of the remembered ids: per id its bytes (held
// once, by the index and the order alike), its place in the order and, in a
// set large enough to have one, its index entry.
func (d *idSet) memSize() int {
	n := cap(d.buckets)*int(unsafe.Sizeof(bucketInfo{})) + cap(d.log)
	if d.index != nil {
		n += int(unsafe.Sizeof(*d.index)) + 4*cap(d.index.slots)
	}
	for i := range d.buckets {
		n += cap(d.buckets[i].marks) * int(unsafe.Sizeof(partMark{}))
	}
	return n
}
