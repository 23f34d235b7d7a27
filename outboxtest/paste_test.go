package outboxtest_test

import (
	"bytes"
	"fmt"
	"go/ast"
	"go/format"
	"go/parser"
	"go/token"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// The examples of this package are whole tests to copy: each one's first
// line, t := newExampleT() with the comment "// in a test: func TestX(t
// *testing.T)", is the only line to replace. TestExamplesPastedIntoTests
// does exactly that: it pastes each example's body into that test
// function, in a package of its own beside the handlers of
// example_handler_test.go (the application's code), and runs go test on
// it against the same database. The Go blocks of the "Testing your
// handlers" section of docs/testing.md must each be one of those tests or
// handlers, word for word, so the guide shows what runs here.
func TestExamplesPastedIntoTests(t *testing.T) {
	if os.Getenv("DATABASE_URL") == "" {
		msg := "DATABASE_URL is not set: the pasted examples need a PostgreSQL server (run `make test`, which starts one)"
		if os.Getenv("OUTBOX_TEST_REQUIRE") == "1" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	goCmd, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("the go command is needed to run the pasted examples: %v", err)
	}
	tests, imports := pastedTests(t)
	handlers, err := os.ReadFile("example_handler_test.go")
	if err != nil {
		t.Fatal(err)
	}
	checkGuide(t, tests, string(handlers))

	var src bytes.Buffer
	src.WriteString("package pasted_test\n\nimport (\n\t\"testing\"\n")
	for _, path := range imports {
		fmt.Fprintf(&src, "\t%q\n", path)
	}
	src.WriteString(")\n")
	for _, name := range slices.Sorted(func(yield func(string) bool) {
		for n := range tests {
			if !yield(n) {
				return
			}
		}
	}) {
		src.WriteString("\n" + tests[name] + "\n")
	}
	formatted, err := format.Source(src.Bytes())
	if err != nil {
		t.Fatalf("the pasted tests do not parse: %v\n%s", err, src.Bytes())
	}
	// Inside this module, so that it imports this checkout; the go tool
	// leaves directories starting with "_" out of ./... .
	dir, err := os.MkdirTemp(".", "_pasted")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	pkg := regexp.MustCompile(`(?m)^package outboxtest_test$`).ReplaceAll(handlers, []byte("package pasted_test"))
	for name, b := range map[string][]byte{"handlers_test.go": pkg, "pasted_test.go": formatted} {
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	args := []string{"test", "-count=1", "-v"}
	if raceEnabled {
		args = append(args, "-race")
	}
	cmd := exec.Command(goCmd, append(args, "./"+filepath.Base(dir))...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("go test on the examples pasted into tests: %v\n%s\n--- pasted_test.go:\n%s", err, out, formatted)
	}
	for name := range tests {
		if !bytes.Contains(out, []byte("--- PASS: "+name+" ")) {
			t.Errorf("%s did not pass:\n%s", name, out)
		}
	}
}

// firstLine is an example's first line: the stand-in for the test's t.
var firstLine = regexp.MustCompile(`^\tt := newExampleT\(\) // in a test: (func (Test\w+)\(t \*testing\.T\))\n`)

// pastedTests returns each example's body pasted into its test function,
// by test name, and the imports they use.
func pastedTests(t *testing.T) (map[string]string, []string) {
	t.Helper()
	files, _ := filepath.Glob("example_*_test.go")
	tests := map[string]string{}
	var imports []string
	fset := token.NewFileSet()
	for _, name := range files {
		src, err := os.ReadFile(name)
		if err != nil {
			t.Fatal(err)
		}
		f, err := parser.ParseFile(fset, name, src, parser.ParseComments)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range f.Decls {
			fn, ok := d.(*ast.FuncDecl)
			if !ok || !strings.HasPrefix(fn.Name.Name, "Example") {
				continue
			}
			// From the line after the opening brace to the closing one.
			body := string(src[fset.Position(fn.Body.Lbrace).Offset+2 : fset.Position(fn.Body.Rbrace).Offset])
			m := firstLine.FindStringSubmatch(body)
			if m == nil {
				t.Errorf("%s: %s does not start with t := newExampleT() // in a test: func TestX(t *testing.T)", fset.Position(fn.Pos()), fn.Name.Name)
				continue
			}
			rest := body[len(m[0]):]
			if strings.Contains(rest, "exampleT") {
				t.Errorf("%s: %s uses exampleT beyond its first line: pasted into a test, it would not compile", fset.Position(fn.Pos()), fn.Name.Name)
			}
			if _, dup := tests[m[2]]; dup {
				t.Errorf("two examples paste into %s", m[2])
			}
			tests[m[2]] = m[1] + " {\n" + rest + "}"
		}
		for _, is := range f.Imports {
			path, _ := strconv.Unquote(is.Path.Value)
			if !slices.Contains(imports, path) && usedIn(path, tests) {
				imports = append(imports, path)
			}
		}
	}
	if len(tests) < 5 {
		t.Fatalf("found %d examples to paste, want at least 5: %v", len(tests), tests)
	}
	slices.Sort(imports)
	return tests, imports
}

// usedIn reports whether a test of tests uses the package of path.
func usedIn(path string, tests map[string]string) bool {
	name := filepath.Base(path)
	if regexp.MustCompile(`^v[0-9]+$`).MatchString(name) {
		name = filepath.Base(filepath.Dir(path))
	}
	use := regexp.MustCompile(`\b` + regexp.QuoteMeta(name) + `\.`)
	for _, src := range tests {
		if use.MatchString(src) {
			return true
		}
	}
	return false
}

// checkGuide fails unless every Go block of docs/testing.md's "Testing
// your handlers" section is one of the pasted tests (without the example's
// closing "// Output:" comment), or a piece of the handlers' file, word for
// word (tabs as in gofmt'ed code).
func checkGuide(t *testing.T, tests map[string]string, handlers string) {
	t.Helper()
	const guide = "../docs/testing.md"
	doc, err := os.ReadFile(guide)
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(doc), "\n## Testing your handlers\n")
	if !ok {
		t.Fatalf("%s has no section \"Testing your handlers\"", guide)
	}
	if i := strings.Index(section, "\n## "); i >= 0 {
		section = section[:i]
	}
	blocks := regexp.MustCompile("(?s)\n```go\n(.*?)```\n").FindAllStringSubmatch(section, -1)
	if len(blocks) == 0 {
		t.Fatalf("%s's \"Testing your handlers\" shows no Go code", guide)
	}
	for _, b := range blocks {
		code := strings.TrimSpace(b[1])
		found := strings.Contains(handlers, code)
		for _, test := range tests {
			if i := strings.Index(test, "\n\t// Output:"); i >= 0 {
				test = test[:i] + "\n}"
			}
			found = found || test == code
		}
		if !found {
			t.Errorf("%s's \"Testing your handlers\" shows code that is neither an example pasted into a test nor in example_handler_test.go; "+
				"make it one of them, word for word:\n%s", guide, code)
		}
	}
}
