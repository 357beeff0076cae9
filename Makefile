# keyfold developer targets. `make` lists them; `make test` is what CI runs.
GO ?= go

.PHONY: help
help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk 'BEGIN {FS = ":.*## "}; {printf "  %-12s %s\n", $$1, $$2}'

.PHONY: test
test: ## vet, lint, check generated code, run every test, and the in-process ones again under -race (what CI runs)
	$(GO) vet ./...
	$(MAKE) lint
	$(MAKE) proto-check
	$(GO) test -count=1 -timeout 15m ./...
	$(GO) test -race -count=1 -timeout 15m . ./actors/... ./persistence/... ./services/... ./cluster/...

.PHONY: lint
lint: ## staticcheck (pinned in go.mod as a tool) over every package, tests included
	$(GO) tool staticcheck ./...

.PHONY: proto
proto: ## regenerate the .pb.go files from proto/keyfold/v1/*.proto (needs protoc)
	protoc --plugin=protoc-gen-go="$$($(GO) tool -n protoc-gen-go)" \
		--plugin=protoc-gen-go-grpc="$$($(GO) tool -n protoc-gen-go-grpc)" \
		--go_out=. --go_opt=paths=source_relative \
		--go-grpc_out=. --go-grpc_opt=paths=source_relative \
		proto/keyfold/v1/*.proto

.PHONY: proto-check
proto-check: ## fail if the committed .pb.go differ from what `make proto` generates
	@if ! command -v protoc >/dev/null 2>&1; then \
		if [ -n "$$CI" ]; then echo "protoc is required in CI (apt-get install protobuf-compiler)" >&2; exit 1; fi; \
		echo "protoc not found: skipping the generated-code check (CI runs it)"; exit 0; \
	fi; \
	$(MAKE) --no-print-directory proto && \
	if [ -n "$$(git status --porcelain -- proto/)" ]; then \
		git status --short -- proto/ >&2; echo "generated code differs from the committed one: run make proto and commit" >&2; exit 1; \
	fi

.PHONY: bench
bench: ## run the Go benchmarks (figures go to BENCHMARKS.md)
	$(GO) test -run '^$$' -bench . -benchmem -count 5 ./...

.PHONY: serve
serve: ## run a node on the embedded store with the quickstart pipelines
	$(GO) run ./cmd/keyfold serve --config examples/quickstart.yaml
