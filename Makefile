# tidemark developer targets.
#
#   make test        hermetic: go vet + go test -race (in-process kfake broker; no Java, no env needed)
#   make test-kafka  the same suite against a real Apache Kafka 4.x broker started by scripts/kafka-local
#   make test-cluster the TestCluster tests on a three-node Kafka cluster started by scripts/kafka-local:
#                    nodes killed and restarted, leaders moved, under load (about 6 minutes)
#   make lint        gofmt -l is empty, go vet (this module, bench/, plugin/tidemarkotel, examples/kubernetes, examples/sqlite-batches), go mod tidy leaves no diff (this module, plugin/tidemarkotel, examples/kubernetes, examples/sqlite-batches)
#   make fmt         gofmt -w
#   make bench       tidemark vs kafka-go, sarama and franz-go side by side (bench/, a module of its own), on the
#                    in-process kfake broker or on $KAFKA_BROKERS; updates BENCHMARKS.md (BENCHFLAGS="-rounds 1 ...")
#   make bench-kafka the same on a real Apache Kafka broker started (and stopped) by scripts/kafka-local,
#                    with Kafka's own consumer performance tool as the broker's ceiling
#   make bench-smoke bench/'s smoke test: the whole pipeline small, on kfake (seconds; go test -timeout 2m)
#   make bench-go    the Go micro-benchmarks in the library's packages (BENCH=regexp, BENCHTIME=1s)
#   make kafka-start / kafka-stop / kafka-fetch   a long-running local broker for manual work
#                    (dir: $TIDEMARK_KAFKA_DIR, default ~/.cache/tidemark/broker; prints KAFKA_BROKERS=...)
#   make fuzz        every fuzz test (decoders of network and file bytes), FUZZTIME each (default 2m)
#   make fuzz-corpus their seed corpora, from kfake and a real Kafka broker (scripts/kafka-local) and clients
#   make chaos       chaos run on the in-process broker (internal/chaos): consumer processes killed, restarted and
#                    rebalanced under load, commit and network faults, broker restarts; prints the table, exits 1
#                    if a promise is broken (CHAOS_FLAGS, default -duration 2m; e.g. CHAOS_FLAGS="-duration 20m -seed 42")
#   make chaos-kafka the same against a real Kafka 4.x broker started (and restarted) by scripts/kafka-local

SHELL := bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := test

GO         ?= go
PKGS       ?= ./...
TESTFLAGS  ?=
BENCH      ?= .
BENCHTIME  ?= 1s
# go test's own limit per test binary, inside .ci/run's `timeout` (25m, 30m): a hung package then fails
# with every goroutine's stack. TESTFLAGS come after it, so TESTFLAGS=-timeout=... overrides it.
TESTTIMEOUT ?= 20m
KAFKA_LOCAL := scripts/kafka-local

.PHONY: fuzz fuzz-corpus test test-kafka test-cluster bench bench-kafka bench-smoke bench-go fmt lint vet kafka-fetch kafka-start kafka-stop kafka-smoke

# Hermetic even when the shell has KAFKA_BROKERS set (that selects a real broker).
test:
	$(GO) vet $(PKGS)
	env -u KAFKA_BROKERS $(GO) test -race -count=1 -timeout $(TESTTIMEOUT) $(TESTFLAGS) $(PKGS)
	cd plugin/tidemarkotel && $(GO) vet ./... && env -u KAFKA_BROKERS $(GO) test -race -count=1 -timeout $(TESTTIMEOUT) $(TESTFLAGS) ./...
	cd examples/kubernetes && $(GO) vet ./... && env -u KAFKA_BROKERS $(GO) test -race -count=1 -timeout $(TESTTIMEOUT) $(TESTFLAGS) ./...
	cd examples/sqlite-batches && $(GO) vet ./... && env -u KAFKA_BROKERS $(GO) test -race -count=1 -timeout $(TESTTIMEOUT) $(TESTFLAGS) ./...

# KAFKA_BROKERS is set by scripts/kafka-local for the command it runs.
test-kafka:
	$(KAFKA_LOCAL) run $(KAFKA_LOCAL_FLAGS) -- $(GO) test -race -count=1 -timeout $(TESTTIMEOUT) -run . $(TESTFLAGS) $(PKGS)
	$(KAFKA_LOCAL) run $(KAFKA_LOCAL_FLAGS) -- $(GO) -C plugin/tidemarkotel test -race -count=1 -timeout $(TESTTIMEOUT) -run . $(TESTFLAGS) ./...
	$(KAFKA_LOCAL) run $(KAFKA_LOCAL_FLAGS) -- $(GO) -C examples/kubernetes test -race -count=1 -timeout $(TESTTIMEOUT) -run . $(TESTFLAGS) ./...
	$(KAFKA_LOCAL) run $(KAFKA_LOCAL_FLAGS) -- $(GO) -C examples/sqlite-batches test -race -count=1 -timeout $(TESTTIMEOUT) -run . $(TESTFLAGS) ./...

# The root package's TestCluster tests, with -v: they log each leader move's resume time.
CLUSTERTIMEOUT ?= 10m
test-cluster:
	$(KAFKA_LOCAL) run --nodes 3 $(KAFKA_LOCAL_FLAGS) -- $(GO) test -race -count=1 -timeout $(CLUSTERTIMEOUT) -run TestCluster -v $(TESTFLAGS) .

BENCHFLAGS ?=

bench:
	cd bench && $(GO) run . $(BENCHFLAGS)

bench-kafka:
	$(KAFKA_LOCAL) run $(KAFKA_LOCAL_FLAGS) -- $(MAKE) bench

# Hermetic like make test: the in-process broker even when KAFKA_BROKERS is set.
bench-smoke:
	cd bench && env -u KAFKA_BROKERS $(GO) test -count=1 -timeout 2m ./...

bench-go:
	$(GO) test -run '^$$' -bench '$(BENCH)' -benchtime $(BENCHTIME) -benchmem $(PKGS)

# Each fuzz test on its own: go test runs one -fuzz target per package at a time.
# scripts/fuzz-one retries a run Go 1.26's fuzzing coordinator failed at the
# -fuzztime boundary with no failing input (golang/go#75804), once.
FUZZTIME ?= 2m
# e.g. FUZZFLAGS=-parallel=1: one fuzzing worker instead of one per CPU.
FUZZFLAGS ?=
FUZZ_TARGETS := ./framework:FuzzNextBatch ./framework:FuzzBatchRecords ./framework:FuzzReadCommitted ./framework:FuzzDecodeSubscription \
	./internal/wire:FuzzResponses ./internal/wire:FuzzFetchStream ./internal/offsetfile:FuzzDecodeRecord ./internal/offsetfile:FuzzOpenDamagedFile ./internal/offsetfile:FuzzReadJournal ./internal/offsetfile:FuzzDecodeOutboxRecord

fuzz:
	@for t in $(FUZZ_TARGETS); do \
		pkg=$${t%%:*}; name=$${t##*:}; \
		echo "fuzz $$pkg $$name ($(FUZZTIME))"; \
		GO=$(GO) scripts/fuzz-one $$pkg $$name $(FUZZTIME) $(FUZZFLAGS) || exit 1; \
	done

# The fuzz tests' seed corpora (testdata/fuzz/FuzzX/SOURCE-NAME) from real responses and member metadata:
# from kfake, then from Kafka with its Java consumer as a group member (replaces the files of each source).
fuzz-corpus:
	env -u KAFKA_BROKERS $(GO) run ./internal/fuzzcorpus
	$(KAFKA_LOCAL) run $(KAFKA_LOCAL_FLAGS) -- $(GO) run ./internal/fuzzcorpus -kafka-local $(KAFKA_LOCAL)

fmt:
	gofmt -w .

# bench/, plugin/tidemarkotel, examples/kubernetes and examples/sqlite-batches are modules of their own: ./... does not reach them.
vet:
	$(GO) vet $(PKGS)
	cd bench && $(GO) vet ./...
	cd plugin/tidemarkotel && $(GO) vet ./...
	cd examples/kubernetes && $(GO) vet ./...
	cd examples/sqlite-batches && $(GO) vet ./...

lint: vet
	@unformatted=$$(gofmt -l .); \
	if [[ -n $$unformatted ]]; then echo "gofmt -l: these files need gofmt:"; echo "$$unformatted"; exit 1; fi
	@if ! $(GO) mod tidy -diff; then echo "go mod tidy would change go.mod/go.sum (run: go mod tidy)"; exit 1; fi
	@if ! (cd plugin/tidemarkotel && $(GO) mod tidy -diff); then echo "go mod tidy would change plugin/tidemarkotel's go.mod/go.sum (run it there)"; exit 1; fi
	@if ! (cd examples/kubernetes && $(GO) mod tidy -diff); then echo "go mod tidy would change examples/kubernetes's go.mod/go.sum (run it there)"; exit 1; fi
	@if ! (cd examples/sqlite-batches && $(GO) mod tidy -diff); then echo "go mod tidy would change examples/sqlite-batches's go.mod/go.sum (run it there)"; exit 1; fi
	@echo "lint ok"

kafka-fetch:
	$(KAFKA_LOCAL) fetch

kafka-start:
	$(KAFKA_LOCAL) start $(KAFKA_LOCAL_FLAGS)

kafka-stop:
	$(KAFKA_LOCAL) stop $(KAFKA_LOCAL_FLAGS)

kafka-smoke:
	$(KAFKA_LOCAL) smoke $(KAFKA_LOCAL_FLAGS)

CHAOS_FLAGS ?= -duration 2m

.PHONY: chaos chaos-kafka

chaos:
	env -u KAFKA_BROKERS $(GO) run ./examples/chaos $(CHAOS_FLAGS)

# scripts/kafka-local run exports KAFKA_BROKERS, TIDEMARK_KAFKA_LOCAL and TIDEMARK_KAFKA_DIR: the run restarts that broker.
chaos-kafka:
	$(KAFKA_LOCAL) run $(KAFKA_LOCAL_FLAGS) -- $(GO) run ./examples/chaos $(CHAOS_FLAGS)
