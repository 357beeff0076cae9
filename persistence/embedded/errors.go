package embedded

import "errors"

// ErrFailed reports a store that cannot take calls until it has reopened
// its database: a write failed in a way Pebble cannot continue from (a
// failed WAL write, typically a full disk). Whether that write landed is
// unknown; the store reopens itself in the background, once there is free
// space, and the error wraps the cause (syscall.ENOSPC for a full disk).
// A failure in one of Pebble's background jobs (a MANIFEST write) cannot be
// recovered in the process: then the error says so and stays until the
// process restarts.
var ErrFailed = errors.New("embedded: store failed")
