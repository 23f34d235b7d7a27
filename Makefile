# fxoutbox developer commands. Each target starts what it needs through the
# project's scripts: a throwaway PostgreSQL cluster (scripts/pg.sh, or
# DATABASE_URL when set) and a Kafka-protocol broker (scripts/devkafka.sh,
# scripts/kafka.sh, or KAFKA_BROKERS when set).

SHELL := /bin/bash
GO ?= go
GOTEST_FLAGS ?= -race -count=1 -timeout 15m

# go test, ending a failed run's output with what failed (scripts/gotest.sh).
GOTEST = GO=$(GO) $(CURDIR)/scripts/gotest.sh

# Runs a command with DATABASE_URL exported.
WITH_PG = set -euo pipefail; eval "export $$(scripts/pg.sh up)";

.PHONY: test test-kafka test-faults-eo demo bench lint vulncheck vet fmt pg-up pg-down kafka-up kafka-down devkafka-up devkafka-down clean

## test: every test, on PostgreSQL and the in-process development broker (kfake), with -race.
test:
	@$(WITH_PG) \
	started_kafka=; if [ -z "$${KAFKA_BROKERS:-}" ]; then started_kafka=1; fi; \
	eval "export $$(scripts/devkafka.sh up)"; \
	trap '[ -n "$$started_kafka" ] && scripts/devkafka.sh down >/dev/null 2>&1 || true' EXIT; \
	echo "== go test (PostgreSQL: $${DATABASE_URL%%\?*}, Kafka: $$KAFKA_BROKERS)"; \
	OUTBOX_TEST_REQUIRE=1 $(GOTEST) $(GOTEST_FLAGS) ./... ; \
	(cd examples && OUTBOX_TEST_REQUIRE=1 $(GOTEST) $(GOTEST_FLAGS) ./...) ; \
	(cd migrations/tooltest && OUTBOX_TEST_REQUIRE=1 $(GOTEST) $(GOTEST_FLAGS) ./...)

## test-kafka: the same tests against a real Apache Kafka broker (KAFKA_BROKERS, or one scripts/kafka.sh starts),
## plus the broker-crash tests of internal/faulttest (on a broker of their own, started by scripts/kafka.sh).
test-kafka:
	@$(WITH_PG) \
	if [ -z "$${KAFKA_BROKERS:-}" ]; then eval "export $$(scripts/kafka.sh up)"; fi; \
	echo "== go test on Apache Kafka (PostgreSQL: $${DATABASE_URL%%\?*}, Kafka: $$KAFKA_BROKERS)"; \
	OUTBOX_TEST_REQUIRE=1 OUTBOX_TEST_REAL_KAFKA=1 $(GOTEST) $(GOTEST_FLAGS) ./... ; \
	(cd examples && OUTBOX_TEST_REQUIRE=1 OUTBOX_TEST_REAL_KAFKA=1 $(GOTEST) $(GOTEST_FLAGS) ./...)

## test-faults-eo: the fault scenarios that judge delivery (relays killed every 0.5 s and between ack and commit,
## frozen relays, broker SIGKILLs and leader kills, 3 brokers below min ISR, PostgreSQL crashed, poison requeued;
## streaming: a slot invalidated while the relay is down, PostgreSQL crashed, a broker outage),
## their relays exactly once under cursor progress, on Apache Kafka, read back read_committed.
## EO_SKIP leaves out the slot scenario's marks variant, which runs at least once (test-kafka runs it).
EO_FAULTS ?= ^(TestRelayProcessesKilledEveryHalfSecond|TestRelayKilledBetweenAckAndCommit|TestFrozenRelayLosesItsLanes|TestFrozenRelayHoldsOnlyItsLanes|TestRelaySurvivesBrokerCrash|TestLeaderKillsKeepPerKeyOrder|TestBelowMinISRParksNothing|TestRelaySurvivesPostgresCrash|TestPoisonRequeuedRightAfterFix|TestStreamSlotInvalidatedResumesFromTheTable|TestStreamSlotInvalidatedCountedOnce|TestStreamSurvivesPostgresCrash|TestStreamBrokerOutageConfirmsNothingUnpublished)$$
EO_SKIP ?= ^TestStreamSlotInvalidatedResumesFromTheTable$$/^marks$$
test-faults-eo:
	@$(WITH_PG) \
	if [ -z "$${KAFKA_BROKERS:-}" ]; then eval "export $$(scripts/kafka.sh up)"; fi; \
	echo "== fault scenarios, exactly once under cursor progress (PostgreSQL: $${DATABASE_URL%%\?*}, Kafka: $$KAFKA_BROKERS)"; \
	OUTBOX_TEST_REQUIRE=1 OUTBOX_TEST_REAL_KAFKA=1 OUTBOX_TEST_DELIVERY=exactly-once OUTBOX_TEST_PROGRESS=cursor \
		$(GOTEST) $(GOTEST_FLAGS) -run '$(EO_FAULTS)' -skip '$(EO_SKIP)' ./internal/faulttest/

## demo: the example orders and billing services end to end, duplicates and trace tree included (embedded broker unless KAFKA_BROKERS is set).
demo:
	@$(WITH_PG) cd examples && $(GO) run ./cmd/demo

## bench: fxoutbox vs the seed's relay vs watermill (bench/, own module) -> bench/results.json; BENCH_QUICK=1: < 2 min; KAFKA_BROKERS: real broker.
bench:
	@$(WITH_PG) cd bench && BENCH_QUICK='$(BENCH_QUICK)' KAFKA_BROKERS='$(KAFKA_BROKERS)' $(GO) run . && \
	mkdir -p out && $(GO) run ./chart -in "$${BENCH_OUT:-results.json}" -out out/benchmarks.png

## vulncheck: govulncheck on the library against the Go vulnerability database, built from the golang.org/x/vulndb module (VULNDB=latest or a version; VULNDB_URL=https://vuln.go.dev to use the online one).
# vuln.go.dev is not reachable from every machine (a sandbox may reach only
# a module proxy), but the database's source, golang.org/x/vulndb, is a Go
# module: the target fetches it through GOPROXY, indexes it once per
# version into .cache/vulndb/ with the module's own cmd/indexdb, and points
# govulncheck at that copy. Exit status 3 means vulnerable code is called.
GOVULNCHECK_VERSION ?= v1.9.0
# The standard library is checked as of this toolchain (fetched through
# GOPROXY when the local Go is older): build with it or newer.
VULNCHECK_TOOLCHAIN ?= go1.26.10
VULNDB ?= latest
vulncheck:
	@set -euo pipefail; \
	if [ -n "$${VULNDB_URL:-}" ]; then db="$$VULNDB_URL"; else \
		ver=$$(cd / && $(GO) list -m -f '{{.Version}}' golang.org/x/vulndb@$(VULNDB)); \
		dir="$(CURDIR)/.cache/vulndb/$$ver"; \
		if [ ! -f "$$dir/index/db.json" ]; then \
			echo "== indexing golang.org/x/vulndb@$$ver into $$dir"; \
			(cd / && $(GO) mod download golang.org/x/vulndb@$$ver); \
			rm -rf "$(CURDIR)/.cache/vulndb"; mkdir -p "$(CURDIR)/.cache/vulndb"; \
			(cd / && $(GO) run golang.org/x/vulndb/cmd/indexdb@$$ver \
				-vulns "$$($(GO) env GOMODCACHE)/golang.org/x/vulndb@$$ver/data/osv" -out "$$dir.tmp"); \
			mv "$$dir.tmp" "$$dir"; \
		fi; \
		db="file://$$dir"; \
	fi; \
	echo "== govulncheck $(GOVULNCHECK_VERSION), database $$db"; \
	GOTOOLCHAIN=$(VULNCHECK_TOOLCHAIN) $(GO) run golang.org/x/vuln/cmd/govulncheck@$(GOVULNCHECK_VERSION) -db "$$db" ./...

## lint: gofmt on everything; go vet on the library, examples/, bench/ and migrations/tooltest/.
lint:
	@files="$$(gofmt -l .)"; if [ -n "$$files" ]; then echo "$$files"; echo "gofmt: the files above need formatting"; exit 1; fi
	@$(GO) vet ./... && (cd examples && $(GO) vet ./...) && (cd bench && $(GO) vet ./...) && (cd migrations/tooltest && $(GO) vet ./...)

pg-up:
	@scripts/pg.sh up
pg-down:
	@scripts/pg.sh down
kafka-up:
	@scripts/kafka.sh up
kafka-down:
	@scripts/kafka.sh down
devkafka-up:
	@scripts/devkafka.sh up
devkafka-down:
	@scripts/devkafka.sh down

clean:
	-scripts/devkafka.sh down --all
	-scripts/kafka.sh destroy
	-scripts/pg.sh destroy
