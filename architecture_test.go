package outbox_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// mayImport is ARCHITECTURE.md's table: the packages of this module each
// package's non-test files may import, by path relative to the module.
// A package missing from it fails the test, so a new package is placed on
// the map when it is added.
var mayImport = map[string][]string{
	".":                                    {"internal/textcut"},
	"unitofwork":                           {".", "internal/record", "internal/sqlname", "internal/defaults"},
	"relay":                                {".", "relay/internal/claim", "relay/internal/cursor", "relay/internal/eo", "relay/internal/feed", "relay/internal/snapshot", "relay/internal/failure", "relay/internal/kafkaproducer", "relay/internal/lanelock", "relay/internal/lazytx", "relay/internal/marks", "relay/internal/pace", "relay/internal/partition", "relay/internal/pgoutput", "relay/internal/streamsql", "relay/internal/tablestats", "internal/backoff", "internal/dberr", "internal/locks", "internal/parklog", "internal/record", "internal/tablesql", "internal/textcut", "internal/sqlname", "internal/partitioner", "internal/defaults"},
	"relay/internal/cursor":                {".", "relay/internal/claim", "relay/internal/lanelock", "relay/internal/lazytx", "internal/sqlname", "internal/tablesql"},
	"relay/internal/claim":                 {},
	"relay/internal/eo":                    {".", "relay/internal/cursor", "relay/internal/kafkaproducer", "relay/internal/lanelock", "relay/internal/pgoutput", "relay/internal/snapshot", "internal/backoff", "internal/dberr"},
	"relay/internal/feed":                  {".", "relay/internal/claim", "relay/internal/cursor", "relay/internal/eo", "relay/internal/failure", "relay/internal/kafkaproducer", "relay/internal/pgoutput", "relay/internal/snapshot", "relay/internal/streamsql"},
	"relay/internal/snapshot":              {},
	"relay/internal/lanelock":              {},
	"relay/internal/marks":                 {".", "relay/internal/claim", "internal/sqlname", "internal/tablesql"},
	"relay/internal/partition":             {".", "internal/sqlname", "internal/tablesql"},
	"relay/internal/failure":               {".", "internal/dberr", "internal/tablesql", "internal/textcut"},
	"relay/internal/kafkaproducer":         {"relay/internal/failure"},
	"relay/internal/pgoutput":              {".", "relay/internal/claim"},
	"relay/internal/lazytx":                {},
	"relay/internal/pace":                  {"relay/internal/failure"},
	"relay/internal/streamsql":             {".", "internal/sqlname"},
	"relay/internal/tablestats":            {".", "internal/tablesql"},
	"inbox":                                {".", "unitofwork", "migrations", "internal/backoff", "internal/dberr", "internal/parklog", "internal/tablesql", "internal/textcut", "internal/sqlname", "internal/defaults"},
	"admin":                                {".", "relay", "migrations", "internal/locks", "internal/tablesql", "internal/textcut", "internal/sqlname"},
	"adminui":                              {".", "admin", "migrations", "internal/tablesql", "internal/sqlname"},
	"migrations":                           {".", "internal/textcut", "internal/sqlname"},
	"fxoutbox":                             {".", "unitofwork", "relay", "inbox", "migrations", "adminui", "outboxconfig", "internal/envconfig", "internal/sqlname", "internal/textcut", "internal/partitioner"},
	"outboxtest":                           {".", "unitofwork", "migrations", "internal/record", "internal/textcut", "internal/sqlname"},
	"cmd/outboxctl":                        {".", "admin", "adminui", "migrations", "outboxconfig", "internal/envconfig", "internal/tablesql", "internal/textcut", "internal/sqlname"},
	"internal/envconfig":                   {".", "internal/textcut", "internal/partitioner"},
	"outboxconfig":                         {".", "unitofwork", "relay", "inbox", "internal/envconfig", "internal/record", "internal/textcut", "internal/partitioner"},
	"internal/settingsdoc":                 {".", "outboxconfig"},
	"internal/settingsdoc/cmd/gensettings": {"internal/settingsdoc"},
	"internal/record":                      {".", "internal/textcut", "internal/defaults"},
	"internal/tablesql":                    {".", "migrations", "internal/textcut", "internal/sqlname"},
	"internal/backoff":                     nil,
	"internal/dberr":                       nil,
	"internal/locks":                       nil,
	"internal/parklog":                     nil,
	"internal/textcut":                     nil,
	"internal/partitioner":                 nil,
	"internal/defaults":                    nil,
	"internal/sqlname":                     {"."},
	// Test set-up and test-only packages: anything but cmd and examples.
	"internal/testenv":    {"*"},
	"internal/nestjs":     {"*"},
	"internal/faulttest":  {"*"},
	"internal/limitstest": {"*"},
	"internal/rolestest":  {"*"},
}

const module = "github.com/fxoutbox/outbox"

// TestImportsFollowTheMap checks every package's imports of this module
// against mayImport, and that outboxctl links no fx.
func TestImportsFollowTheMap(t *testing.T) {
	out, err := exec.Command("go", "list", "-f", "{{.ImportPath}} {{join .Imports \",\"}}", "./...").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	rel := func(p string) string {
		if p == module {
			return "."
		}
		return strings.TrimPrefix(p, module+"/")
	}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		path, imports, _ := strings.Cut(line, " ")
		pkg := rel(path)
		allowed, ok := mayImport[pkg]
		if !ok {
			t.Errorf("package %s is not on the map: add it to ARCHITECTURE.md and mayImport, with what it may import", pkg)
			continue
		}
		for _, imp := range strings.Split(imports, ",") {
			if imp != module && !strings.HasPrefix(imp, module+"/") {
				continue
			}
			dep := rel(imp)
			if strings.HasPrefix(dep, "cmd/") || strings.HasPrefix(dep, "examples/") {
				t.Errorf("%s imports %s: nothing imports cmd/ or examples/", pkg, dep)
				continue
			}
			if !slices.Contains(allowed, "*") && !slices.Contains(allowed, dep) {
				t.Errorf("%s imports %s, which ARCHITECTURE.md does not allow it (it may import %v)", pkg, dep, allowed)
			}
		}
	}

	deps, err := exec.Command("go", "list", "-deps", "./cmd/outboxctl").Output()
	if err != nil {
		t.Fatalf("go list -deps: %v", err)
	}
	for _, d := range strings.Fields(string(deps)) {
		if strings.HasPrefix(d, "go.uber.org/fx") {
			t.Errorf("cmd/outboxctl links %s: the command reads its settings through outboxconfig, not fx", d)
		}
	}
}

// sqlStart matches an SQL statement where one starts: at the start of a
// string (after blanks) or right after an opening parenthesis (a
// subquery). A message that names a statement for the operator mid-sentence
// ("..., or SELECT pg_drop_replication_slot(...)") is not one.
var sqlStart = regexp.MustCompile(`(?s)(?:^|\()\s*(?:SELECT\b|INSERT\s+INTO\b|UPDATE\s+\S+.*\bSET\b|DELETE\s+FROM\b|WITH\s+(?:RECURSIVE\s+)?\S+\s+AS\b)`)

// TestArchitectureRelayRootHoldsNoSQL fails on SQL text in the relay root's
// non-test files: its statements live in relay/internal/..., built once per
// relay, and the relay runs them. A string built with + is read whole, its
// other operands (a table's name, the lane function) as a placeholder.
func TestArchitectureRelayRootHoldsNoSQL(t *testing.T) {
	for s, want := range map[string]bool{
		"SELECT 1":                                          true,
		" AND NOT EXISTS (SELECT FROM x)":                   true,
		"UPDATE _ SET done = @done":                         true,
		"INSERT INTO t (a) VALUES (1)":                      true,
		"DELETE FROM t WHERE id = $1":                       true,
		"WITH k AS MATERIALIZED (SELECT 1) SELECT * FROM k": true,
		"outbox relay: drop the slot (outboxctl stream drop-slot, or SELECT pg_drop_replication_slot('s'))": false,
		"outbox relay: update the lanes; set them":                                                          false,
		"claims rows with FOR UPDATE SKIP LOCKED":                                                           false,
	} {
		if got := sqlStart.MatchString(s); got != want {
			t.Errorf("sqlStart.MatchString(%q) = %v, want %v", s, got, want)
		}
	}

	files, err := filepath.Glob("relay/*.go")
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, parser.SkipObjectResolution)
		if err != nil {
			t.Fatal(err)
		}
		var flagged []ast.Node // strings reported: their parts are not again
		ast.Inspect(f, func(n ast.Node) bool {
			e, ok := n.(ast.Expr)
			if !ok || !isString(e) {
				return true
			}
			for _, o := range flagged {
				if o.Pos() <= n.Pos() && n.End() <= o.End() {
					return true
				}
			}
			if s := stringText(e); sqlStart.MatchString(s) {
				flagged = append(flagged, n)
				t.Errorf("%s: SQL text in the relay root (move it to a package under relay/internal): %s", fset.Position(n.Pos()), shorten(s))
			}
			return true
		})
	}
}

// isString reports whether e is a string literal or a + of operands one of
// which is.
func isString(e ast.Expr) bool {
	switch e := e.(type) {
	case *ast.BasicLit:
		return e.Kind == token.STRING
	case *ast.BinaryExpr:
		return e.Op == token.ADD && (isString(e.X) || isString(e.Y))
	}
	return false
}

// stringText is e's text: its literals' values, each other operand "_".
func stringText(e ast.Expr) string {
	switch e := e.(type) {
	case *ast.BasicLit:
		if e.Kind == token.STRING {
			if s, err := strconv.Unquote(e.Value); err == nil {
				return s
			}
		}
	case *ast.BinaryExpr:
		if e.Op == token.ADD {
			return stringText(e.X) + stringText(e.Y)
		}
	case *ast.ParenExpr:
		return stringText(e.X)
	}
	return "_"
}

// shorten shortens s for a failure message.
func shorten(s string) string {
	if len(s) > 120 {
		return s[:120] + "..."
	}
	return s
}
