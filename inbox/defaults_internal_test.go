package inbox

import (
	"go/ast"
	"go/parser"
	"go/token"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestDefaultsInComments checks that each Config field comment states the
// default its constant holds, so the constants stay the one source of each
// default.
func TestDefaultsInComments(t *testing.T) {
	want := map[string]any{
		"Concurrency": defaultConcurrency, "BatchSize": defaultBatchSize, "MaxAttempts": defaultMaxAttempts,
		"MinBackoff": defaultMinBackoff, "MaxBackoff": defaultMaxBackoff, "TryTimeout": defaultTryTimeout,
		"DrainTimeout": defaultDrainTimeout, "Retention": defaultRetention, "CleanupInterval": defaultCleanupInterval,
	}
	docs := map[string]string{}
	f, err := parser.ParseFile(token.NewFileSet(), "config.go", nil, parser.ParseComments)
	if err != nil {
		t.Fatal(err)
	}
	ast.Inspect(f, func(n ast.Node) bool {
		if ts, ok := n.(*ast.TypeSpec); ok && ts.Name.Name == "Config" {
			for _, fl := range ts.Type.(*ast.StructType).Fields.List {
				for _, id := range fl.Names {
					docs[id.Name] = strings.Join(strings.Fields(fl.Doc.Text()), " ")
				}
			}
		}
		return true
	})
	re := regexp.MustCompile(`Default ([0-9][0-9a-z]*(,[0-9]{3})*)`)
	for field, def := range want {
		m := re.FindStringSubmatch(docs[field])
		if m == nil {
			t.Errorf("%s: comment states no default:\n%s", field, docs[field])
			continue
		}
		var got any
		switch def.(type) {
		case time.Duration:
			got, err = time.ParseDuration(m[1])
		default:
			got, err = strconv.Atoi(strings.ReplaceAll(m[1], ",", ""))
		}
		if err != nil || got != def {
			t.Errorf("%s: comment says Default %s, the constant is %v", field, m[1], def)
		}
	}
}
