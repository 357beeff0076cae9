// Package services holds keyfold's transports. Each sub-package adapts one
// protocol to the node and holds no logic of its own: httpapi serves the
// HTTP/JSON API.
package services
