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
// database examples, which cannot skip, are left out; OUTBOX_TEST_REQUIRE=1
// makes them fail instead. The examples' cleanups run after everything,
// before the leak check.
func TestMain(m *testing.M) {
	flag.Parse()
	if os.Getenv("DATABASE_URL") == "" && os.Getenv("OUTBOX_TEST_REQUIRE") != "1" {
		fmt.Println("DATABASE_URL is not set: the database tests and examples of outboxtest skip")
		if f := flag.Lookup("test.skip"); f != nil && f.Value.String() == "" {
			_ = f.Value.Set("^ExampleRequire(Many)?Inserted(_.*)?$")
		}
	}
	code := m.Run()
	if !runExampleCleanups() {
		fmt.Println("FAIL: an example's cleanup failed")
		code = 1
	}
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Printf("FAIL: goleak: %v\n", err)
			code = 1
		}
	}
	os.Exit(code)
}
