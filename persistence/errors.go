package persistence

import "errors"

var (
	// ErrFenced reports a write carrying an epoch older than the group's
	// current one: another owner has claimed the group since. Nothing was
	// written; the caller must drop the group.
	ErrFenced = errors.New("persistence: fenced by a newer epoch")
	// ErrNotFound reports a snapshot that does not exist.
	ErrNotFound = errors.New("persistence: not found")
	// ErrGroupsMismatch reports a store created for another number of key
	// groups. The number of groups is fixed for the life of a deployment.
	ErrGroupsMismatch = errors.New("persistence: key group count differs from the store's")
	// ErrIncompatible reports a store whose data this build cannot read: it
	// was written with another layout version, or by something else.
	ErrIncompatible = errors.New("persistence: incompatible store data")
	// ErrBadCursor reports an output cursor the store cannot parse: it was
	// not one of its OutputEntry cursors.
	ErrBadCursor = errors.New("persistence: bad output cursor")
	// ErrClosed reports a call on a closed store.
	ErrClosed = errors.New("persistence: closed")
	// ErrNoSpace reports a write the store refused because its disk is
	// full, or nearly: nothing of it was written, so the caller keeps what
	// it holds and may retry once space is freed.
	ErrNoSpace = errors.New("persistence: disk full")
)
