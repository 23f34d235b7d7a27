package outbox_test

import (
	"os/exec"
	"slices"
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
	"relay":                                {".", "relay/internal/cursor", "relay/internal/failure", "relay/internal/kafkaproducer", "relay/internal/marks", "relay/internal/partition", "relay/internal/pgoutput", "relay/internal/tablestats", "internal/backoff", "internal/dberr", "internal/locks", "internal/parklog", "internal/record", "internal/tablesql", "internal/textcut", "internal/sqlname", "internal/partitioner", "internal/defaults"},
	"relay/internal/cursor":                {".", "internal/sqlname", "internal/tablesql"},
	"relay/internal/marks":                 {".", "internal/sqlname", "internal/tablesql"},
	"relay/internal/partition":             {".", "internal/sqlname", "internal/tablesql"},
	"relay/internal/failure":               {".", "internal/dberr", "internal/tablesql", "internal/textcut"},
	"relay/internal/kafkaproducer":         {"relay/internal/failure"},
	"relay/internal/pgoutput":              {"."},
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
