package partition_test

import (
	"testing"

	"github.com/fxoutbox/outbox/internal/testenv"
)

// TestMain checks for leaked goroutines (goleak) and skips the package
// without DATABASE_URL.
func TestMain(m *testing.M) { testenv.Main(m) }
