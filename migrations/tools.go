package migrations

import (
	"bytes"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/fxoutbox/outbox"
)

// FS returns the set's migration files for golang-migrate, as they are in
// their folder (NNNNNN_name.up.sql and .down.sql), written for the default
// table in the connection's search_path:
//
//	src, err := iofs.New(migrations.Outbox.FS(), ".")
//	m, err := migrate.NewWithSourceInstance("iofs", src, databaseURL)
//
// Give each set but Outbox a version table of its own (e.g.
// x-migrations-table=outbox_event_cursor_migrations). For another table
// name or schema, use [Set.Up], or write the SQL of [Set.All] to files. The
// folders also hold roles.example.sql (all but the stream's): psql scripts
// that grant least-privilege roles, not migrations.
func (s Set) FS() fs.FS {
	if s.fsys == nil {
		return memFS{}
	}
	sub, err := fs.Sub(s.fsys, s.dir)
	if err != nil { // a constant, valid directory
		panic(err)
	}
	return sub
}

// Goose returns the set's migrations in goose's layout
// (00001_create_outbox_event.sql, ...) rendered for table, and the name of
// the version table to keep them in: <name>_goose_version for [Outbox] and
// [Inbox], <name>_<set>_goose_version for the others (e.g.
// outbox_event_cursor_goose_version), lower-case, in the table's schema.
// Pass both to goose's Provider:
//
//	fsys, versions, err := migrations.Outbox.Goose(outbox.Table{})
//	provider, err := goose.NewProvider(goose.DialectPostgres, db, fsys, goose.WithTableName(versions))
//	_, err = provider.Up(ctx)
//
// A version table of their own keeps the outbox's versions 1, 2, 3 apart
// from the application's migrations, which have their own. The table's
// schema must exist; the migrations do not create it. goose does not quote
// the version table's name, so a schema with upper-case letters is refused.
// Run [Cursor] after [Partitioned].
func (s Set) Goose(table outbox.Table) (fsys fs.FS, versionTable string, err error) {
	return s.tool(table, "goose", gooseFile)
}

func gooseFile(m Migration) (string, string) {
	return fmt.Sprintf("%05d_%s.sql", m.Version, m.Name),
		"-- +goose Up\n-- +goose StatementBegin\n" + strings.TrimSpace(m.Up) + "\n-- +goose StatementEnd\n\n" +
			"-- +goose Down\n-- +goose StatementBegin\n" + strings.TrimSpace(m.Down) + "\n-- +goose StatementEnd\n"
}

// Tern returns the set's migrations in tern's layout
// (001_create_outbox_event.sql, ...) rendered for table, and the name of
// the version table to keep them in, as [Set.Goose] names it with tern for
// goose (<name>_tern_version, ...). Pass both to tern's Migrator:
//
//	fsys, versions, err := migrations.Outbox.Tern(outbox.Table{})
//	m, err := migrate.NewMigrator(ctx, conn, versions)
//	err = m.LoadMigrations(fsys)
//	err = m.Migrate(ctx)
//
// As with Goose, the schema must exist and must be lower-case.
func (s Set) Tern(table outbox.Table) (fsys fs.FS, versionTable string, err error) {
	return s.tool(table, "tern", ternFile)
}

func ternFile(m Migration) (string, string) {
	return fmt.Sprintf("%03d_%s.sql", m.Version, m.Name),
		strings.TrimSpace(m.Up) + "\n\n---- create above / drop below ----\n\n" + strings.TrimSpace(m.Down) + "\n"
}

func (s Set) tool(table outbox.Table, tool string, file func(Migration) (name, content string)) (fs.FS, string, error) {
	all, err := s.All(table)
	if err != nil {
		return nil, "", err
	}
	table = s.defaults(table)
	if table.Schema != strings.ToLower(table.Schema) {
		return nil, "", &outbox.ConfigError{Field: "Table.Schema", Reason: fmt.Sprintf(
			"%q has upper-case letters: %s does not quote the name of its version table, so the schema must be lower-case", table.Schema, tool)}
	}
	versions := strings.ToLower(table.Name) + "_" + s.versions() + tool + "_version"
	if table.Schema != "" {
		versions = table.Schema + "." + versions
	}
	files := memFS{}
	for _, m := range all {
		name, content := file(m)
		files[name] = []byte(content)
	}
	return files, versions, nil
}

// memFS is a read-only file system of files in one directory.
type memFS map[string][]byte

func (m memFS) Open(name string) (fs.File, error) {
	if name == "." {
		return &memDir{entries: m.entries()}, nil
	}
	b, ok := m[name]
	if !ok || !fs.ValidPath(name) {
		return nil, &fs.PathError{Op: "open", Path: name, Err: fs.ErrNotExist}
	}
	return &memFile{info: memInfo{name: name, size: int64(len(b))}, r: bytes.NewReader(b)}, nil
}

func (m memFS) ReadFile(name string) ([]byte, error) {
	b, ok := m[name]
	if !ok {
		return nil, &fs.PathError{Op: "read", Path: name, Err: fs.ErrNotExist}
	}
	return slices.Clone(b), nil
}

func (m memFS) ReadDir(name string) ([]fs.DirEntry, error) {
	if name != "." {
		return nil, &fs.PathError{Op: "readdir", Path: name, Err: fs.ErrNotExist}
	}
	return m.entries(), nil
}

func (m memFS) entries() []fs.DirEntry {
	var out []fs.DirEntry
	for _, name := range slices.Sorted(maps.Keys(m)) {
		out = append(out, fs.FileInfoToDirEntry(memInfo{name: name, size: int64(len(m[name]))}))
	}
	return out
}

type memInfo struct {
	name string
	size int64
	dir  bool
}

func (i memInfo) Name() string       { return i.name }
func (i memInfo) Size() int64        { return i.size }
func (i memInfo) ModTime() time.Time { return time.Time{} }
func (i memInfo) IsDir() bool        { return i.dir }
func (i memInfo) Sys() any           { return nil }
func (i memInfo) Mode() fs.FileMode {
	if i.dir {
		return fs.ModeDir | 0o555
	}
	return 0o444
}

type memFile struct {
	info memInfo
	r    *bytes.Reader
}

func (f *memFile) Stat() (fs.FileInfo, error) { return f.info, nil }
func (f *memFile) Read(p []byte) (int, error) { return f.r.Read(p) }
func (f *memFile) Close() error               { return nil }

type memDir struct {
	entries []fs.DirEntry
	off     int
}

func (d *memDir) Stat() (fs.FileInfo, error) { return memInfo{name: ".", dir: true}, nil }
func (d *memDir) Read([]byte) (int, error) {
	return 0, &fs.PathError{Op: "read", Path: ".", Err: fs.ErrInvalid}
}
func (d *memDir) Close() error { return nil }

func (d *memDir) ReadDir(n int) ([]fs.DirEntry, error) {
	rest := d.entries[d.off:]
	if n <= 0 {
		d.off = len(d.entries)
		return rest, nil
	}
	if len(rest) == 0 {
		return nil, io.EOF
	}
	rest = rest[:min(n, len(rest))]
	d.off += len(rest)
	return rest, nil
}
