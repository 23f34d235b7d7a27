package outboxtest_test

import (
	"flag"
	"fmt"
	"os"
	"testing"

	"go.uber.org/goleak"
)

// TestMain runs the tests that need no database anywhere. Without
// DATABASE_URL the database tests skip themselves (testenv.Pool), and the
// database example, which cannot skip, is left out; OUTBOX_TEST_REQUIRE=1
// makes them fail instead.
func TestMain(m *testing.M) {
	flag.Parse()
	if os.Getenv("DATABASE_URL") == "" && os.Getenv("OUTBOX_TEST_REQUIRE") != "1" {
		fmt.Println("DATABASE_URL is not set: the database tests and examples of outboxtest skip")
		if f := flag.Lookup("test.skip"); f != nil && f.Value.String() == "" {
			_ = f.Value.Set("^ExampleRequire(Many)?Inserted$")
		}
	}
	goleak.VerifyTestMain(m)
}
