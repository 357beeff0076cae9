// Package fold is keyfold's per-key state machine: it folds a key's events
// into state. It is pure and deterministic: no I/O, no goroutines, no clock.
// Processing time is an input ([Pipeline.Apply] takes it), so replaying the
// same logged inputs from a snapshot rebuilds exactly the same state.
//
// A [Pipeline] is compiled from a [Spec] (the YAML of one pipeline). Events
// are first prepared ([Pipeline.Prepare]): decoded, validated and reduced to
// what the aggregates need, so a bad event is rejected before it is logged.
// Prepared events are then applied to a key's [State].
//
// A pipeline may also have a Go [Handler] (handler.go): Apply calls it
// after the built-in operators, Advance fires its timers, and its state is
// part of the key's snapshot, so it replays exactly as they do.
package fold
