package migrations_test

import (
	"errors"
	"flag"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"testing/fstest"

	"github.com/fxoutbox/outbox"
	"github.com/fxoutbox/outbox/migrations"
)

var update = flag.Bool("update", false, "rewrite migrations/goose and migrations/tern from the up/down files")

// The goose and tern copies are what migrations.Goose and migrations.Tern
// render for the default table from the up/down files (the single source),
// so users of either tool's command line take them as they are. This test
// fails when they drift; `go test ./migrations -run Layouts -update`
// rewrites them. The same holds for the publication's migration in
// stream/goose and stream/tern.
func TestToolLayouts(t *testing.T) {
	for _, tc := range []struct {
		dir    string
		render func(outbox.Table) (fs.FS, string, error)
		files  int
	}{
		{"goose", migrations.Goose, 3}, {"tern", migrations.Tern, 3},
		{filepath.Join("stream", "goose"), migrations.GooseStream, 1}, {filepath.Join("stream", "tern"), migrations.TernStream, 1},
		{filepath.Join("cursor", "goose"), migrations.GooseCursor, 2}, {filepath.Join("cursor", "tern"), migrations.TernCursor, 2},
		{filepath.Join("partitioned", "goose"), migrations.GoosePartitioned, 1}, {filepath.Join("partitioned", "tern"), migrations.TernPartitioned, 1},
	} {
		dir, render := tc.dir, tc.render
		fsys, _, err := render(outbox.Table{})
		if err != nil {
			t.Fatal(err)
		}
		want := map[string]string{}
		err = fs.WalkDir(fsys, ".", func(path string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() {
				return err
			}
			b, err := fs.ReadFile(fsys, path)
			want[filepath.Join(dir, path)] = string(b)
			return err
		})
		if err != nil || len(want) != tc.files {
			t.Fatalf("%s: rendered %d files: %v", dir, len(want), err)
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
		files, _ := filepath.Glob(filepath.Join(dir, "*.sql"))
		for _, f := range files {
			if _, ok := want[f]; !ok {
				t.Errorf("%s has no up/down source", f)
			}
		}
	}
}

func TestToolFS(t *testing.T) {
	table := outbox.Table{Schema: "billing", Name: "PaymentOutbox"}
	for _, tc := range []struct {
		render       func(outbox.Table) (fs.FS, string, error)
		first        string
		versionTable string
		parts        []string
	}{
		{migrations.Goose, "00001_create_outbox_event.sql", "billing.paymentoutbox_goose_version",
			[]string{"-- +goose Up\n", `CREATE TABLE IF NOT EXISTS "billing"."PaymentOutbox"`, `CREATE INDEX "PaymentOutbox_unpublished_idx"`, "-- +goose Down\n", `DROP TABLE IF EXISTS "billing"."PaymentOutbox"`}},
		{migrations.Tern, "001_create_outbox_event.sql", "billing.paymentoutbox_tern_version",
			[]string{`CREATE TABLE IF NOT EXISTS "billing"."PaymentOutbox"`, "\n---- create above / drop below ----\n", `DROP TABLE IF EXISTS "billing"."PaymentOutbox"`}},
	} {
		fsys, versions, err := tc.render(table)
		if err != nil {
			t.Fatal(err)
		}
		if versions != tc.versionTable {
			t.Errorf("version table %q, want %q", versions, tc.versionTable)
		}
		if err := fstest.TestFS(fsys, tc.first); err != nil {
			t.Errorf("%s: %v", tc.first, err)
		}
		b, err := fs.ReadFile(fsys, tc.first)
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range tc.parts {
			if !strings.Contains(string(b), p) {
				t.Errorf("%s does not contain %q:\n%s", tc.first, p, b)
			}
		}
		if strings.Contains(string(b), "outbox_event") {
			t.Errorf("%s still names outbox_event:\n%s", tc.first, b)
		}
		if _, v, _ := tc.render(outbox.Table{}); !strings.HasPrefix(v, "outbox_event_") || strings.Contains(v, ".") {
			t.Errorf("default version table %q, want outbox_event_<tool>_version in the search_path", v)
		}
		for _, bad := range []outbox.Table{{Schema: "Billing"}, {Name: `x"; DROP TABLE y; --`}} {
			if _, _, err := tc.render(bad); !errors.Is(err, outbox.ErrInvalidConfig) {
				t.Errorf("%+v: err = %v, want ErrInvalidConfig", bad, err)
			}
		}
	}
}
