// Package httpapi serves keyfold's HTTP/JSON API over a Backend (a
// *keyfold.Node):
//
//	POST   /v1/pipelines/{pipeline}/events       JSON array (or object), or NDJSON
//	GET    /v1/pipelines/{pipeline}/keys/{key}   one key's state
//	GET    /healthz                              200 while the process lives
//	GET    /readyz                               200 while the node serves
//
// Errors are JSON objects {"error": "..."} with the status from one table
// (errors.go).
package httpapi
