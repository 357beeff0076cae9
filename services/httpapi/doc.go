// Package httpapi serves keyfold's HTTP/JSON API over a Backend (a
// *keyfold.Node):
//
//	POST   /v1/pipelines/{pipeline}/events       JSON array (or object), or NDJSON
//	GET    /v1/pipelines/{pipeline}/keys/{key}   one key's state
//	GET    /healthz                              200 while the process lives
//	GET    /readyz                               200 while the node serves
//
// Ingest bodies must be declared application/json or application/x-ndjson
// (415 otherwise), and writes (POST events, DELETE a key) from web pages of
// origins not in Options.AllowedOrigins are refused (403). An ingest reads
// its body under a deadline and within the ingest budget before it takes a
// processing slot (Options).
//
// Errors are JSON objects {"error": "..."} with the status from one table
// (errors.go).
package httpapi
