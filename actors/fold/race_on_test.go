//go:build race

package fold_test

// raceDetector is set in test binaries built with -race. The single-threaded
// property tests run fewer seeds there: the race detector finds nothing in
// them, and make test runs them in full without it.
const raceDetector = true
