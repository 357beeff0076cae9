// Package httpapi serves keyfold's HTTP/JSON API over a Backend (a
// *keyfold.Node):
//
//	GET    /v1/pipelines                             every pipeline, described
//	POST   /v1/pipelines/{pipeline}/events           JSON array (or object), or NDJSON
//	GET    /v1/pipelines/{pipeline}/keys/{key}       one key's state
//	DELETE /v1/pipelines/{pipeline}/keys/{key}       erase one key
//	GET    /v1/pipelines/{pipeline}/outputs          a page of window results
//	GET    /v1/pipelines/{pipeline}/outputs/stream   the results, followed (SSE)
//	GET    /v1/cluster                               the members and their groups
//	GET    /healthz                                  200 while the process lives
//	GET    /readyz                                   200 while the node serves
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
