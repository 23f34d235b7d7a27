package lazytx

import (
	"testing"

	"github.com/fxoutbox/outbox/internal/testenv"
)

// TestMain checks for leaked goroutines (goleak) and skips the package
// without DATABASE_URL (the project's services are started together).
func TestMain(m *testing.M) { testenv.Main(m) }
