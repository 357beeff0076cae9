//go:build race

package actors_test

// raceDetector is set in test binaries built with -race: the tests that
// need many keys to show what they check use fewer there (under the race
// detector they ran minutes), and make test runs them in full without it.
const raceDetector = true
