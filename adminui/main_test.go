package adminui_test

import (
	"testing"

	"github.com/fxoutbox/outbox/internal/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }
