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
	"time"

	"github.com/fxoutbox/outbox"
	"github.com/fxoutbox/outbox/migrations"
)

var update = flag.Bool("update", false, "rewrite migrations/goose and migrations/tern from the up/down files")

// The goose and tern copies are what migrations.Outbox.Goose and migrations.Outbox.Tern
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
		{"goose", migrations.Outbox.Goose, 3}, {"tern", migrations.Outbox.Tern, 3},
		{filepath.Join("stream", "goose"), migrations.Stream.Goose, 1}, {filepath.Join("stream", "tern"), migrations.Stream.Tern, 1},
		{filepath.Join("cursor", "goose"), migrations.Cursor.Goose, 2}, {filepath.Join("cursor", "tern"), migrations.Cursor.Tern, 2},
		{filepath.Join("partitioned", "goose"), migrations.Partitioned.Goose, 1}, {filepath.Join("partitioned", "tern"), migrations.Partitioned.Tern, 1},
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
		{migrations.Outbox.Goose, "00001_create_outbox_event.sql", "billing.paymentoutbox_goose_version",
			[]string{"-- +goose Up\n", `CREATE TABLE IF NOT EXISTS "billing"."PaymentOutbox"`, `CREATE INDEX "PaymentOutbox_unpublished_idx"`, "-- +goose Down\n", `DROP TABLE IF EXISTS "billing"."PaymentOutbox"`}},
		{migrations.Outbox.Tern, "001_create_outbox_event.sql", "billing.paymentoutbox_tern_version",
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

// An interval is for the partitioned migration only, and is rendered into
// its SQL; FS holds each set's golang-migrate files.
func TestIntervalAndFS(t *testing.T) {
	if _, err := migrations.Cursor.WithInterval(time.Hour).All(outbox.Table{}); !errors.Is(err, outbox.ErrInvalidConfig) {
		t.Errorf("Cursor.WithInterval: err = %v, want ErrInvalidConfig", err)
	}
	all, err := migrations.Partitioned.WithInterval(2 * time.Hour).All(outbox.Table{})
	if err != nil || len(all) != 1 || !strings.Contains(all[0].Up, "interval '120 minutes';") {
		t.Fatalf("Partitioned.WithInterval(2h).All = %v, %v", all, err)
	}
	if def, err := migrations.Partitioned.All(outbox.Table{}); err != nil || !strings.Contains(def[0].Up, "interval '1 day'") {
		t.Fatalf("Partitioned.All keeps its day: %v", err)
	}
	for _, tc := range []struct {
		set   migrations.Set
		first string
	}{
		{migrations.Outbox, "000001_create_outbox_event.up.sql"},
		{migrations.Inbox, "000001_create_outbox_inbox.up.sql"},
		{migrations.Stream, "000001_create_outbox_event_publication.up.sql"},
		{migrations.Cursor, "000001_outbox_event_cursor.up.sql"},
		{migrations.Partitioned, "000001_create_outbox_event_partitioned.up.sql"},
	} {
		if err := fstest.TestFS(tc.set.FS(), tc.first); err != nil {
			t.Errorf("%s: %v", tc.first, err)
		}
	}
}
