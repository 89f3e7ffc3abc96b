# pgtenant: `make run` starts a local fleet and the daemon; `make test` runs
# every test against real PostgreSQL servers the tests start themselves.
GO        ?= go
BIN       := bin/pgtenant
STATICCHECK_VERSION := v0.8.2

.PHONY: build run test test-short lint bench docs deps deps-test

# Debian's packages the fleet and the tests need: installed with apt-get as
# root, else named in one line to run (scripts/deps).
deps:
	@bash scripts/deps
deps-test:
	@bash scripts/deps test

build:
	$(GO) build -o $(BIN) ./cmd/pgtenant

# ARGS go to `pgtenant up`: make run ARGS="--listen 127.0.0.1:9090 --data-dir /tmp/fleet"
ARGS ?=
run: deps build
	./$(BIN) up $(ARGS)

# -p 2: two test packages at a time, each with its own PostgreSQL cluster(s).
# go test runs the packages two at a time in the order given: the longest
# first (hostile 11 min, move and cmd/pgtenant 7 each, then analytics,
# backup, failover), so that none is left running alone at the end.
SLOW_TESTS = ./internal/hostile ./internal/move ./cmd/pgtenant ./internal/analytics ./internal/backup ./internal/failover

test: deps-test
	$(GO) test -count=1 -p 2 -timeout 20m $(SLOW_TESTS) ./...

# docs/cli.md is generated from the command tree (internal/cli/docs.go);
# TestCLIDocs_UpToDate fails when it differs.
docs: build
	./$(BIN) gen-docs docs

test-short: deps-test
	$(GO) test -count=1 -short -p 2 -timeout 10m ./...

lint:
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt: $$out"; exit 1; fi
	$(GO) vet ./...
	$(GO) run honnef.co/go/tools/cmd/staticcheck@$(STATICCHECK_VERSION) ./...
