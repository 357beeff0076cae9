package cluster

import (
	"fmt"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/keyfold/keyfold/actors/fold"
	"github.com/keyfold/keyfold/actors/fold/foldtest"
	keyfoldv1 "github.com/keyfold/keyfold/proto/keyfold/v1"
)

// BenchmarkForwardShare is what forwarding a share of 100 validated events
// costs the two members, the network aside: the sender encodes its
// message, the owner decodes it and rebuilds the events for its host. One
// op is one event. parse-again is the share as it went before the owner
// took a member at its word (the events as a public IngestRequest, which
// the owner validated again with PrepareBatch); prepared is how it goes
// now (route: the events in the log's form and what the sender read of
// each; SubmitLocal: fold.Pipeline.Forwarded).
func BenchmarkForwardShare(b *testing.B) {
	p, err := fold.Compile("logins", foldtest.BenchSpec())
	if err != nil {
		b.Fatal(err)
	}
	const share = 100
	raws := make([][]byte, share)
	for i := range raws { // the events of bench_test.go's benchHTTPIngest
		raws[i] = fmt.Appendf(nil, `{"user_id":"u%d","event_id":"e%d","type":"login_failed","amount":%d,"geo":{"country":"DE"}}`, i%10000, i, i%100)
	}
	events, err := p.PrepareBatch(raws)
	if err != nil {
		b.Fatal(err)
	}
	b.Run("parse-again", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			req := &keyfoldv1.IngestRequest{Pipeline: "logins", Events: make([][]byte, len(events))}
			for i, ev := range events {
				req.Events[i] = ev.Raw
			}
			wire, err := proto.Marshal(req)
			if err != nil {
				b.Fatal(err)
			}
			var got keyfoldv1.IngestRequest
			if err := proto.Unmarshal(wire, &got); err != nil {
				b.Fatal(err)
			}
			if _, err := p.PrepareBatch(got.Events); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*share), "ns/event")
	})
	b.Run("prepared", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			pt := &part{batch: &keyfoldv1.ForwardBatch{Pipeline: "logins", PipelineFingerprint: p.Fingerprint()}}
			var buf []byte
			for _, ev := range events {
				start := len(buf)
				buf = p.AppendPrepared(buf, ev)
				pt.add(ev, buf[start:], 0)
			}
			wire, err := proto.Marshal(pt.batch)
			if err != nil {
				b.Fatal(err)
			}
			var got keyfoldv1.ForwardBatch
			if err := proto.Unmarshal(wire, &got); err != nil {
				b.Fatal(err)
			}
			if _, err := p.Forwarded(got.Events, got.Keys, got.Prepared); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*share), "ns/event")
	})
}
