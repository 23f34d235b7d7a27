package outbox_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// scripts/kafka.sh destroy removes the broker's state folder, as pg.sh
// destroy removes its cluster's, and keeps a folder that holds files it
// did not write. It needs neither Java nor a running broker.
func TestKafkaScriptDestroyRemovesState(t *testing.T) {
	if _, err := exec.LookPath("bash"); err != nil {
		t.Skip("needs bash")
	}
	destroy := func(dir string) {
		t.Helper()
		cmd := exec.Command("scripts/kafka.sh", "destroy")
		cmd.Env = append(os.Environ(), "KAFKA_STATE_DIR="+dir)
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("kafka.sh destroy: %v\n%s", err, out)
		}
	}
	state := func() string {
		dir := filepath.Join(t.TempDir(), "kafka")
		for _, f := range []string{"data/meta.properties", "data/t-0/00000000000000000000.log", "server.properties", "broker.log", "broker.log.1", "log4j2-broker.xml", "log4j2-tools.xml"} {
			if err := os.MkdirAll(filepath.Dir(filepath.Join(dir, f)), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(dir, f), []byte("x"), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		return dir
	}
	dir := state()
	destroy(dir)
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("kafka.sh destroy left %s behind (%v)", dir, err)
	}
	dir = state()
	if err := os.WriteFile(filepath.Join(dir, "notes.txt"), []byte("mine"), 0o644); err != nil {
		t.Fatal(err)
	}
	destroy(dir)
	left, _ := os.ReadDir(dir)
	if len(left) != 1 || left[0].Name() != "notes.txt" {
		t.Errorf("kafka.sh destroy in a folder with a file of its own left %v, want only notes.txt", left)
	}
}
