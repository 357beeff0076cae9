package main

import (
	"bytes"
	"encoding/json"
	"testing"
	"time"
)

// JSON logs carry durations in a readable unit, as text logs do.
func TestJSONLogDurations(t *testing.T) {
	var buf bytes.Buffer
	l, err := newLoggerTo(&buf, "info", "json")
	if err != nil {
		t.Fatal(err)
	}
	l.Info("took", "took", 1500*time.Millisecond, "n", 3)
	var rec map[string]any
	if err := json.Unmarshal(buf.Bytes(), &rec); err != nil {
		t.Fatalf("%q: %v", buf.String(), err)
	}
	if rec["took"] != "1.5s" || rec["n"] != float64(3) {
		t.Errorf("log record %v: want took=\"1.5s\", n=3", rec)
	}
	if _, err := newLoggerTo(&buf, "info", "xml"); err == nil {
		t.Error("log format xml accepted")
	}
}
