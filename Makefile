# fxoutbox developer commands. Each target starts what it needs through the
# project's scripts: a throwaway PostgreSQL cluster (scripts/pg.sh, or
# DATABASE_URL when set) and a Kafka-protocol broker (scripts/devkafka.sh,
# scripts/kafka.sh, or KAFKA_BROKERS when set).

SHELL := /bin/bash
GO ?= go
GOTEST_FLAGS ?= -race -count=1 -timeout 15m

# Runs a command with DATABASE_URL exported.
WITH_PG = set -euo pipefail; eval "export $$(scripts/pg.sh up)";

.PHONY: test test-kafka demo bench lint vet fmt pg-up pg-down kafka-up kafka-down devkafka-up devkafka-down clean

## test: every test, on PostgreSQL and the in-process development broker (kfake), with -race.
test:
	@$(WITH_PG) \
	started_kafka=; if [ -z "$${KAFKA_BROKERS:-}" ]; then started_kafka=1; fi; \
	eval "export $$(scripts/devkafka.sh up)"; \
	trap '[ -n "$$started_kafka" ] && scripts/devkafka.sh down >/dev/null 2>&1 || true' EXIT; \
	echo "== go test (PostgreSQL: $${DATABASE_URL%%\?*}, Kafka: $$KAFKA_BROKERS)"; \
	OUTBOX_TEST_REQUIRE=1 $(GO) test $(GOTEST_FLAGS) ./... ; \
	(cd examples && OUTBOX_TEST_REQUIRE=1 $(GO) test $(GOTEST_FLAGS) ./...)

## test-kafka: the same tests against a real Apache Kafka broker (KAFKA_BROKERS, or one scripts/kafka.sh starts).
test-kafka:
	@$(WITH_PG) \
	eval "export $$(scripts/kafka.sh up)"; \
	echo "== go test on Apache Kafka (PostgreSQL: $${DATABASE_URL%%\?*}, Kafka: $$KAFKA_BROKERS)"; \
	OUTBOX_TEST_REQUIRE=1 OUTBOX_TEST_REAL_KAFKA=1 $(GO) test $(GOTEST_FLAGS) ./... ; \
	(cd examples && OUTBOX_TEST_REQUIRE=1 OUTBOX_TEST_REAL_KAFKA=1 $(GO) test $(GOTEST_FLAGS) ./...)

## demo: the example orders service end to end (embedded broker unless KAFKA_BROKERS is set).
demo:
	@$(WITH_PG) cd examples && $(GO) run ./cmd/demo

## lint: gofmt and go vet on both modules.
lint:
	@test -z "$$(gofmt -l . | tee /dev/stderr)" || { echo "gofmt: files above need formatting"; exit 1; }
	@$(GO) vet ./... && (cd examples && $(GO) vet ./...)

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
	-scripts/devkafka.sh down
	-scripts/kafka.sh destroy
	-scripts/pg.sh destroy
