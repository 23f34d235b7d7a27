//go:build race

package outboxtest_test

func init() { raceEnabled = true }
