package outbox

import (
	"fmt"
	"hash/fnv"
	"regexp"
)

// DefaultTableName is the table the migrations create when none is configured.
const DefaultTableName = "outbox_event"

// Table names the outbox table. Both sides and the migrations must use the
// same one. Names are validated and always quoted, never pasted into SQL.
type Table struct {
	// Schema is the table's schema. Default: "" (the connection's search_path,
	// normally "public").
	Schema string
	// Name is the table's name. Default: "outbox_event".
	Name string
}

// WithDefaults returns t with an empty Name set to DefaultTableName.
func (t Table) WithDefaults() Table {
	if t.Name == "" {
		t.Name = DefaultTableName
	}
	return t
}

var identRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

// Validate reports a schema or table name that is not a plain SQL identifier
// (letters, digits and underscores, not starting with a digit, at most 55
// bytes so derived index names fit PostgreSQL's 63-byte limit).
func (t Table) Validate() error {
	t = t.WithDefaults()
	if t.Schema != "" && (!identRE.MatchString(t.Schema) || len(t.Schema) > 63) {
		return &ConfigError{Field: "Table.Schema", Reason: fmt.Sprintf("%q is not a plain identifier (letters, digits, _; at most 63 bytes)", t.Schema)}
	}
	if !identRE.MatchString(t.Name) || len(t.Name) > 55 {
		return &ConfigError{Field: "Table.Name", Reason: fmt.Sprintf("%q is not a plain identifier (letters, digits, _; at most 55 bytes)", t.Name)}
	}
	return nil
}

// String returns the name as schema.name, unquoted, for messages.
func (t Table) String() string {
	t = t.WithDefaults()
	if t.Schema == "" {
		return t.Name
	}
	return t.Schema + "." + t.Name
}

// Publication returns the name of the PostgreSQL publication through which
// the streaming relay (relay.Stream) reads the table's inserts:
// "<name>_fxoutbox", or "<schema>_<name>_fxoutbox" when a schema is set. The
// migrations create it (FOR TABLE the table WITH (publish = 'insert')).
// Names other than lower-case letters, digits and underscores, or past
// PostgreSQL's 63-byte limit, get those characters replaced and a hash of
// the table's name appended.
func (t Table) Publication() string { return replicationName(t, "") }

// Slot returns the name of the logical replication slot the streaming relay
// of this table, in the database named database, creates and reads:
// "<database>_<name>_fxoutbox" (with "<schema>_" before the name when a
// schema is set). Slot names are shared by the whole server, so the
// database is part of it; as for Publication, other characters than
// lower-case letters, digits and underscores, or a name too long, get a
// hash appended.
func (t Table) Slot(database string) string { return replicationName(t, database) }

func replicationName(t Table, database string) string {
	t = t.WithDefaults()
	n := t.Name + "_fxoutbox"
	if t.Schema != "" {
		n = t.Schema + "_" + n
	}
	if database != "" {
		n = database + "_" + n
	}
	b := []byte(n)
	for i, c := range b {
		if (c < 'a' || c > 'z') && (c < '0' || c > '9') && c != '_' {
			b[i] = '_'
		}
	}
	if len(b) <= 63 && string(b) == n {
		return n
	}
	// Lossy or too long: a hash of the names keeps them distinct.
	h := fnv.New64a()
	h.Write([]byte(database + "\x00" + t.String()))
	return fmt.Sprintf("%s_%016x", string(b[:min(len(b), 46)]), h.Sum64())
}
