package keyfold_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/keyfold/keyfold"
	"github.com/keyfold/keyfold/actors/fold"
	keyfoldv1 "github.com/keyfold/keyfold/proto/keyfold/v1"
	"github.com/keyfold/keyfold/services/grpcapi"
	"github.com/keyfold/keyfold/services/grpcapi/client"
	"github.com/keyfold/keyfold/services/httpapi"
)

// The transports compared: HTTP JSON, gRPC unary Ingest and gRPC
// IngestStream, each with 8 batches of 100 events outstanding, against
// (a) a node on the embedded store and (b) a decode-only server (the same
// transport code over a backend that validates each event with fold.Prepare
// and returns): the ceiling of the transport itself.

const transportBatch = 100

func transportEvent(i int64) []byte {
	return fmt.Appendf(nil, `{"user_id":"u%d","event_id":"e%d","type":"login_failed","amount":%d,"geo":{"country":"DE"}}`, i%10000, i, i%100)
}

// decodeOnly validates events and returns, for both APIs.
type decodeOnly struct {
	grpcapi.Backend // the methods not defined below are never called
	p               *fold.Pipeline
}

func (d decodeOnly) ingest(events [][]byte) (keyfold.IngestResult, error) {
	evs, err := d.p.PrepareBatch(events)
	return keyfold.IngestResult{Accepted: len(evs)}, err
}
func (d decodeOnly) Ingest(_ context.Context, _ string, events [][]byte) (keyfold.IngestResult, error) {
	return d.ingest(events)
}
func (d decodeOnly) Submit(_ context.Context, _ string, events [][]byte) (keyfold.PendingIngest, error) {
	r, err := d.ingest(events)
	return donePending(r), err
}
func (d decodeOnly) Query(context.Context, string, string) (*keyfoldv1.GetStateResponse, error) {
	return &keyfoldv1.GetStateResponse{}, nil
}
func (d decodeOnly) Delete(context.Context, string, string) error { return nil }
func (d decodeOnly) Pipelines() []*keyfoldv1.PipelineInfo         { return nil }
func (d decodeOnly) Joins() []*keyfoldv1.JoinInfo                 { return nil }

type donePending keyfold.IngestResult

func (p donePending) Wait(context.Context) (keyfold.IngestResult, error) {
	return keyfold.IngestResult(p), nil
}

type decodeOnlyHTTP struct {
	decodeOnly
	httpapi.Backend // the methods not defined below are never called
}

func (d decodeOnlyHTTP) Ingest(_ context.Context, _ string, events []json.RawMessage) (keyfold.IngestResult, error) {
	raws := make([][]byte, len(events))
	for i, e := range events {
		raws[i] = e
	}
	return d.ingest(raws)
}
func (d decodeOnlyHTTP) Query(context.Context, string, string) (any, error) { return nil, nil }
func (d decodeOnlyHTTP) Serving() bool                                      { return true }
func (d decodeOnlyHTTP) Delete(context.Context, string, string) error       { return nil }
func (d decodeOnlyHTTP) Pipelines() []*keyfoldv1.PipelineInfo               { return nil }
func (d decodeOnlyHTTP) Joins() []*keyfoldv1.JoinInfo                       { return nil }

// endpoints are where each transport listens.
type endpoints struct{ http, grpc string }

func startNodeEndpoints(b *testing.B) endpoints {
	cfg, err := keyfold.ParseConfig([]byte(benchYAML))
	if err != nil {
		b.Fatal(err)
	}
	cfg.DataDir, cfg.HTTPAddr, cfg.GRPCAddr = b.TempDir(), "127.0.0.1:0", "127.0.0.1:0"
	n := run(b, cfg)
	return endpoints{"http://" + n.HTTPAddr(), n.GRPCAddr()}
}

func startDecodeOnly(b *testing.B) endpoints {
	cfg, err := keyfold.ParseConfig([]byte(benchYAML))
	if err != nil {
		b.Fatal(err)
	}
	p, err := fold.Compile("logins", cfg.Pipelines["logins"])
	if err != nil {
		b.Fatal(err)
	}
	d := decodeOnly{p: p}
	hl, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	hs := &http.Server{Handler: httpapi.New(decodeOnlyHTTP{decodeOnly: d}, httpapi.Options{})}
	go hs.Serve(hl)
	gl, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	gs := grpc.NewServer(grpc.MaxRecvMsgSize(8 << 20))
	grpcapi.Register(gs, d, grpcapi.Options{})
	go gs.Serve(gl)
	b.Cleanup(func() { hs.Close(); gs.Stop() })
	return endpoints{"http://" + hl.Addr().String(), gl.Addr().String()}
}

// latencies collects per-batch ack latencies.
type latencies struct {
	mu sync.Mutex
	d  []time.Duration
}

func (l *latencies) add(d time.Duration) { l.mu.Lock(); l.d = append(l.d, d); l.mu.Unlock() }

func (l *latencies) report(b *testing.B) {
	slices.Sort(l.d)
	if len(l.d) == 0 {
		return
	}
	b.ReportMetric(float64(l.d[len(l.d)/2].Microseconds())/1000, "p50-ms")
	b.ReportMetric(float64(l.d[len(l.d)*99/100].Microseconds())/1000, "p99-ms")
}

func BenchmarkTransports(b *testing.B) {
	for _, target := range []struct {
		name  string
		start func(*testing.B) endpoints
	}{{"node", startNodeEndpoints}, {"decode-only", startDecodeOnly}} {
		for _, tr := range []string{"http-json", "grpc-unary", "grpc-stream"} {
			b.Run(target.name+"/"+tr, func(b *testing.B) {
				ep := target.start(b)
				var seq atomic.Int64
				next := func() [][]byte {
					base := seq.Add(transportBatch) - transportBatch
					evs := make([][]byte, transportBatch)
					for i := range evs {
						evs[i] = transportEvent(base + int64(i))
					}
					return evs
				}
				var lat latencies
				var batches atomic.Int64
				b.ResetTimer()
				switch tr {
				case "http-json":
					benchHTTPTransport(b, ep.http, next, &lat, &batches)
				case "grpc-unary":
					benchGRPCUnary(b, ep.grpc, next, &lat, &batches)
				case "grpc-stream":
					benchGRPCStream(b, ep.grpc, next, &lat, &batches)
				}
				b.StopTimer()
				b.ReportMetric(float64(batches.Load()*transportBatch)/b.Elapsed().Seconds(), "events/s")
				lat.report(b)
			})
		}
	}
}

const outstanding = 8 // batches in flight in every transport

func benchHTTPTransport(b *testing.B, base string, next func() [][]byte, lat *latencies, batches *atomic.Int64) {
	c := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: outstanding}}
	var n atomic.Int64
	var wg sync.WaitGroup
	for range outstanding {
		wg.Go(func() {
			var body bytes.Buffer
			for n.Add(1) <= int64(b.N) {
				body.Reset()
				body.WriteByte('[')
				for i, ev := range next() {
					if i > 0 {
						body.WriteByte(',')
					}
					body.Write(ev)
				}
				body.WriteByte(']')
				t0 := time.Now()
				resp, err := c.Post(base+"/v1/pipelines/logins/events", "application/json", &body)
				if err != nil {
					b.Error(err)
					return
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode != 200 {
					b.Errorf("status %d", resp.StatusCode)
					return
				}
				lat.add(time.Since(t0))
				batches.Add(1)
			}
		})
	}
	wg.Wait()
}

func benchGRPCUnary(b *testing.B, addr string, next func() [][]byte, lat *latencies, batches *atomic.Int64) {
	c, err := client.Dial(addr, client.Options{MaxRetries: -1})
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	var n atomic.Int64
	var wg sync.WaitGroup
	for range outstanding {
		wg.Go(func() {
			for n.Add(1) <= int64(b.N) {
				t0 := time.Now()
				if _, err := c.Ingest(context.Background(), "logins", next()); err != nil {
					b.Error(err)
					return
				}
				lat.add(time.Since(t0))
				batches.Add(1)
			}
		})
	}
	wg.Wait()
}

func benchGRPCStream(b *testing.B, addr string, next func() [][]byte, lat *latencies, batches *atomic.Int64) {
	c, err := client.Dial(addr, client.Options{MaxRetries: -1})
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	const streams = 2
	var n atomic.Int64
	var wg sync.WaitGroup
	for range streams {
		wg.Go(func() {
			st, err := c.Stream(context.Background(), "logins", outstanding/streams)
			if err != nil {
				b.Error(err)
				return
			}
			for n.Add(1) <= int64(b.N) {
				t0 := time.Now()
				if err := st.Send(next(), func(_ client.Result, err error) {
					if err != nil {
						b.Error(err)
						return
					}
					lat.add(time.Since(t0))
					batches.Add(1)
				}); err != nil {
					b.Error(err)
					return
				}
			}
			if err := st.Close(); err != nil {
				b.Error(err)
			}
		})
	}
	wg.Wait()
}

// BenchmarkEventEncoding compares the two ways a gRPC batch can carry
// events: JSON objects as bytes (what keyfold uses) and
// google.protobuf.Struct. Each decodes a 100-event request into what the
// node needs — the field map to fold, and the event's JSON to log.
func BenchmarkEventEncoding(b *testing.B) {
	jsonReq := &keyfoldv1.IngestRequest{Pipeline: "logins"}
	type structReq struct{ events []*structpb.Struct }
	var sr structReq
	for i := range int64(transportBatch) {
		ev := transportEvent(i)
		jsonReq.Events = append(jsonReq.Events, ev)
		var m map[string]any
		if err := json.Unmarshal(ev, &m); err != nil {
			b.Fatal(err)
		}
		s, err := structpb.NewStruct(m)
		if err != nil {
			b.Fatal(err)
		}
		sr.events = append(sr.events, s)
	}
	jsonWire, err := proto.Marshal(jsonReq)
	if err != nil {
		b.Fatal(err)
	}
	// The Struct request on the wire: a ListValue of the events.
	list := &structpb.ListValue{}
	for _, s := range sr.events {
		list.Values = append(list.Values, structpb.NewStructValue(s))
	}
	structWire, err := proto.Marshal(list)
	if err != nil {
		b.Fatal(err)
	}
	b.Run("json-bytes", func(b *testing.B) {
		b.SetBytes(int64(len(jsonWire)))
		for b.Loop() {
			var req keyfoldv1.IngestRequest
			if err := proto.Unmarshal(jsonWire, &req); err != nil {
				b.Fatal(err)
			}
			for _, ev := range req.Events {
				var m map[string]any // the field map; ev itself is what is logged
				if err := json.Unmarshal(ev, &m); err != nil {
					b.Fatal(err)
				}
			}
		}
		b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*transportBatch), "ns/event")
	})
	b.Run("struct", func(b *testing.B) {
		b.SetBytes(int64(len(structWire)))
		for b.Loop() {
			var l structpb.ListValue
			if err := proto.Unmarshal(structWire, &l); err != nil {
				b.Fatal(err)
			}
			for _, v := range l.Values {
				m := v.GetStructValue().AsMap()            // the field map
				if _, err := json.Marshal(m); err != nil { // the JSON to log
					b.Fatal(err)
				}
			}
		}
		b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*transportBatch), "ns/event")
	})
}
