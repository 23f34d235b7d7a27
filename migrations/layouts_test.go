package migrations_test

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/fxoutbox/outbox"
	"github.com/fxoutbox/outbox/migrations"
)

var update = flag.Bool("update", false, "rewrite migrations/goose and migrations/tern from the up/down files")

// The goose and tern copies are generated from the up/down files (the
// single source), so users of either tool take them as they are. This test
// fails when they drift; `go test ./migrations -run Layouts -update`
// rewrites them.
func TestToolLayouts(t *testing.T) {
	all, err := migrations.All(outbox.Table{})
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{}
	for _, m := range all {
		up, down := strings.TrimSpace(m.Up), strings.TrimSpace(m.Down)
		want[filepath.Join("goose", fmt.Sprintf("%05d_%s", m.Version, m.Name)+".sql")] =
			"-- +goose Up\n-- +goose StatementBegin\n" + up + "\n-- +goose StatementEnd\n\n-- +goose Down\n-- +goose StatementBegin\n" + down + "\n-- +goose StatementEnd\n"
		want[filepath.Join("tern", fmt.Sprintf("%03d_%s", m.Version, m.Name)+".sql")] =
			up + "\n\n---- create above / drop below ----\n\n" + down + "\n"
	}
	for path, content := range want {
		if *update {
			_ = os.MkdirAll(filepath.Dir(path), 0o755)
			if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
				t.Fatal(err)
			}
			continue
		}
		got, err := os.ReadFile(path)
		if err != nil || string(got) != content {
			t.Errorf("%s is missing or differs from the up/down files: run go test ./migrations -run Layouts -update", path)
		}
	}
	for _, dir := range []string{"goose", "tern"} {
		files, _ := filepath.Glob(filepath.Join(dir, "*.sql"))
		for _, f := range files {
			if _, ok := want[f]; !ok {
				t.Errorf("%s has no up/down source", f)
			}
		}
	}
}
