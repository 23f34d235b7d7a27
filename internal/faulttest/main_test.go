package faulttest

import (
	"fmt"
	"log"
	"os"
	"testing"

	"github.com/IBM/sarama"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	if os.Getenv("OUTBOX_FAULTTEST_SARAMA_LOG") == "1" {
		// Set before any sarama client exists: sarama reads it unsynchronised.
		sarama.Logger = log.New(os.Stderr, "[sarama] ", log.Ltime|log.Lmicroseconds)
	}
	code := m.Run()
	for _, destroy := range []func() error{destroyBroker, destroyCluster} {
		if err := destroy(); err != nil {
			fmt.Fprintf(os.Stderr, "faulttest: %v\n", err)
			if code == 0 {
				code = 1
			}
		}
	}
	if code == 0 {
		// go-metrics, used inside sarama, starts one global ticker goroutine
		// on first use and never stops it.
		if err := goleak.Find(goleak.IgnoreTopFunction("github.com/rcrowley/go-metrics.(*meterArbiter).tick")); err != nil {
			fmt.Fprintf(os.Stderr, "goleak: %v\n", err)
			code = 1
		}
	}
	os.Exit(code)
}
