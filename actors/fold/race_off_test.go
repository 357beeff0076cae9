//go:build !race

package fold_test

const raceDetector = false
