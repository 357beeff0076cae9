package embedded

import "errors"

// ErrFailed reports a store that cannot take calls until it has reopened
// its database: a write failed in a way Pebble cannot continue from (a
// failed WAL write, typically a full disk). Whether that write landed is
// unknown; the store reopens itself in the background, once there is free
// space, and the error wraps the cause (syscall.ENOSPC for a full disk).
// A failure in one of Pebble's background jobs (a MANIFEST write), or in a
// commit's WAL rotation (the data directory was removed), cannot be
// recovered in the process: then the error says so ("restart the process")
// and stays until the process restarts. Calls do not wait for the Pebble
// that is left wedged: they, and Close, return the error at once.
var ErrFailed = errors.New("embedded: store failed")
