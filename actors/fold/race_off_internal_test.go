//go:build !race

package fold

const raceBuild = false
