// Package keyfold is a stateful event engine: events name a pipeline and a
// key, and every (pipeline, key) is a virtual actor that folds its events
// into state (running aggregates, and in later versions windows, patterns
// and sketches). State is event-sourced: inputs are logged per key group,
// durably, before they are applied, and each key is snapshotted at
// checkpoints, so a crash loses nothing that was acknowledged and counts
// nothing twice.
//
// This package is the embedding API; cmd/keyfold is a thin CLI over it.
// A node alone serves every key with its host (package actors); a member of
// a cluster (Config.Cluster) sends each call through package cluster, which
// routes it to the owner of the key's group (see router.go). The transports
// reach the node through adapters: httpbackend.go and grpcbackend.go for
// the public APIs, localbackend.go for the node-to-node service.
//
//	cfg, err := keyfold.LoadConfig("pipelines.yaml")
//	node, err := keyfold.New(cfg)
//	go node.Run(ctx)
//	<-node.Ready()
//	res, err := node.Ingest(ctx, "logins", events)
//	state, err := node.Query(ctx, "logins", "alice")
package keyfold
