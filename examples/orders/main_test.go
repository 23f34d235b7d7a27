package orders_test

import (
	"crypto/rand"
	"encoding/hex"
	"os"
	"strings"
	"testing"

	"go.opentelemetry.io/otel/trace"
	"go.uber.org/goleak"

	"github.com/fxoutbox/outbox/examples/devkafka"
)

func TestMain(m *testing.M) {
	// go-metrics, used inside sarama, starts one global ticker goroutine on
	// first use and never stops it.
	goleak.VerifyTestMain(m, goleak.IgnoreTopFunction("github.com/rcrowley/go-metrics.(*meterArbiter).tick"))
}

// testEnv returns DATABASE_URL and the Kafka brokers: KAFKA_BROKERS, or an
// embedded development broker closed when the test ends. Without
// DATABASE_URL the test is skipped, or fails under OUTBOX_TEST_REQUIRE=1.
func testEnv(t *testing.T) (dbURL string, brokers []string) {
	t.Helper()
	dbURL = os.Getenv("DATABASE_URL")
	if dbURL == "" {
		msg := "DATABASE_URL is not set: this test needs a PostgreSQL server (run `make test`, which starts one)"
		if os.Getenv("OUTBOX_TEST_REQUIRE") == "1" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	if v := os.Getenv("KAFKA_BROKERS"); v != "" {
		return dbURL, strings.Split(v, ",")
	}
	b, err := devkafka.Start(devkafka.DefaultConfig())
	if err != nil {
		t.Fatalf("start the development broker: %v", err)
	}
	t.Cleanup(b.Close)
	return dbURL, b.Addrs()
}

// name returns prefix followed by 10 random hex digits.
func name(prefix string) string {
	b := make([]byte, 5)
	_, _ = rand.Read(b)
	return prefix + hex.EncodeToString(b)
}

// newTraceparent returns a W3C traceparent header value for a new sampled
// trace, with its trace and span ids.
func newTraceparent() (string, trace.TraceID, trace.SpanID) {
	var tid trace.TraceID
	var sid trace.SpanID
	_, _ = rand.Read(tid[:])
	_, _ = rand.Read(sid[:])
	return "00-" + tid.String() + "-" + sid.String() + "-01", tid, sid
}
