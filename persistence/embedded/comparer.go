package embedded

import (
	"bufio"
	"bytes"
	"fmt"
	"strings"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"
)

// A key's snapshot and the entries named after it, one look-up.
//
// keyfold names a key's id bucket parts after the key's snapshot: its name
// (pipeline NUL key), a NUL, and the part's (actors/keys.go). They sort
// right after the snapshot, but with Pebble's default comparer a key's
// Bloom filter prefix is the whole key, so reading them took a look-up
// each: after ten minutes at a million keys a key that left memory held
// two or three parts, and their look-ups were 3–12% of the node's CPU (the
// snapshot's own 7–21%; profiles of BENCHMARKS.md session 45), and they
// grow with the ids a key remembers. Pebble reads keys sharing a prefix (its
// comparer's Split) with one look-up: SeekPrefixGE consults the tables'
// filters for the prefix, and Next walks the keys of that prefix.
//
// keyComparer is Pebble's bytewise order with a Split that ends the prefix
// of a snapshot key ('s' group:4 name) at the second NUL of its name: a
// key's snapshot (pipeline NUL key, one NUL: keys cannot contain one) is
// a prefix of its own, and its parts (pipeline NUL key NUL …) have it as
// theirs. Every other key is its own prefix, as with the default. The
// order is bytewise, so it is the default's; only what the tables' Bloom
// filters hold differs, and Pebble records a store's comparer and refuses
// to open it with another. Stores created before it keep the default
// (openComparer) and read parts by name.
//
// Pebble's rules for Split (internal/base/comparer.go) hold because a
// suffix starts with a NUL and a prefix that another extends is followed
// there by a byte that is not one: a key made of its prefix sorts first
// among the keys of that prefix, keys of different prefixes sort as their
// prefixes, and keys of one prefix as their suffixes (bytewise, as
// ComparePointSuffixes says). TestKeyComparer checks them on the shapes
// of keys the store writes, FuzzKeyComparer on any. (Pebble's own
// CheckComparer does not apply: it takes a prefix's tail for a prefix,
// as of keys whose suffix says its own length.)
var keyComparer = func() *pebble.Comparer {
	c := *pebble.DefaultComparer
	c.Split = splitKey
	c.ImmediateSuccessor = immediateSuccessor
	c.Name = keyComparerName
	return &c
}()

// keyComparerName names keyComparer in Pebble's records of a store.
const keyComparerName = "keyfold.snapshot-prefix.v1"

// snapshotNameAt is where a snapshot key's name starts: after its kind and
// group.
const snapshotNameAt = 5

// splitKey is keyComparer's Split: the length of k's prefix.
func splitKey(k []byte) int {
	if len(k) <= snapshotNameAt || k[0] != kindSnapshot {
		return len(k)
	}
	name := k[snapshotNameAt:]
	i := bytes.IndexByte(name, 0)
	if i < 0 {
		return len(k)
	}
	j := bytes.IndexByte(name[i+1:], 0)
	if j < 0 {
		return len(k)
	}
	return snapshotNameAt + i + 1 + j
}

// immediateSuccessor is keyComparer's ImmediateSuccessor: the smallest
// prefix (a key that is its own prefix) after prefix a. That is a with a
// NUL appended, unless that NUL would begin a suffix of a (a snapshot's
// name with one NUL): then a with 0x01 appended.
func immediateSuccessor(dst, a []byte) []byte {
	start := len(dst)
	dst = append(append(dst, a...), 0)
	if k := dst[start:]; splitKey(k) < len(k) {
		k[len(k)-1] = 1
	}
	return dst
}

// openComparer returns the comparer to open the store in dir with: the
// one Pebble's OPTIONS file records for an existing store, keyComparer
// for a new one.
func openComparer(fs vfs.FS, dir string) (*pebble.Comparer, error) {
	desc, err := pebble.Peek(dir, fs)
	if err != nil {
		return nil, fmt.Errorf("read the store's description: %w", err)
	}
	if !desc.Exists {
		return keyComparer, nil
	}
	name := pebble.DefaultComparer.Name // (a store without an OPTIONS file predates keyComparer)
	if desc.OptionsFilename != "" {
		f, err := fs.Open(desc.OptionsFilename)
		if err != nil {
			return nil, fmt.Errorf("read the store's options: %w", err)
		}
		defer f.Close()
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			if v, ok := strings.CutPrefix(strings.TrimSpace(sc.Text()), "comparer="); ok {
				name = v
				break
			}
		}
		if err := sc.Err(); err != nil {
			return nil, fmt.Errorf("read the store's options: %w", err)
		}
	}
	switch name {
	case keyComparerName:
		return keyComparer, nil
	case pebble.DefaultComparer.Name:
		return pebble.DefaultComparer, nil
	}
	return nil, fmt.Errorf("the store's keys are ordered by comparer %q, which this build does not know", name)
}
