// Package settingsdoc generates the settings reference of
// docs/configuration.md from the one settings source: outboxconfig's
// Variables (each variable and the field it sets, from the struct tags)
// and the doc comments of the fields, read from the packages' sources. The
// reference lists every setting with its variable, its field in
// fxoutbox.Config or InboxConfig, the values it takes, its default and
// range (as the comment states them) and its meaning (the comment).
package settingsdoc

import (
	"bytes"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"strings"

	"github.com/fxoutbox/outbox"
	"github.com/fxoutbox/outbox/outboxconfig"
)

// The markers around the generated part of docs/configuration.md.
const (
	Begin = "<!-- BEGIN GENERATED: settings reference (go generate ./...; edit the fields' doc comments, not this table) -->"
	End   = "<!-- END GENERATED -->"
)

// File is the page the reference is part of, relative to the module root.
const File = "docs/configuration.md"

const module = "github.com/fxoutbox/outbox"

// Reference returns the generated block (between and without the
// markers), reading the sources under root, the module's directory.
func Reference(root string) (string, error) {
	docs := &comments{root: root, byType: map[string]map[string]string{}}
	var b strings.Builder
	for _, cfg := range []struct {
		name  string
		typ   reflect.Type
		title string
	}{
		{"Config", reflect.TypeFor[outboxconfig.Config](), "The outbox: `fxoutbox.Config` (`outboxconfig.Config`), `fxoutbox.ConfigFromEnv`"},
		{"InboxConfig", reflect.TypeFor[outboxconfig.InboxConfig](), "The inbox: `fxoutbox.InboxConfig` (`outboxconfig.InboxConfig`), `fxoutbox.InboxConfigFromEnv`"},
	} {
		fmt.Fprintf(&b, "\n### %s\n\n", cfg.title)
		b.WriteString("| Variable | Field | Values | Default | Range | Meaning |\n|---|---|---|---|---|---|\n")
		for _, v := range outboxconfig.Variables() {
			if v.Config != cfg.name {
				continue
			}
			doc, err := docs.of(cfg.typ, v.Field)
			if err != nil {
				return "", err
			}
			def, rng := defaultOf(doc), rangeOf(doc)
			fmt.Fprintf(&b, "| `%s` | `%s.%s` | %s | %s | %s | %s |\n", v.Name, cfg.name, v.Field, cell(v.Values), cell(def), cell(rng), cell(doc))
		}
	}
	b.WriteString("\n")
	return b.String(), nil
}

// Update rewrites the block between the markers of File under root.
func Update(root string) error {
	path := filepath.Join(root, File)
	page, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	ref, err := Reference(root)
	if err != nil {
		return err
	}
	out, err := Replace(string(page), ref)
	if err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	return os.WriteFile(path, []byte(out), 0o644)
}

// Replace returns page with the block between the markers replaced by ref.
func Replace(page, ref string) (string, error) {
	i, j := strings.Index(page, Begin), strings.Index(page, End)
	if i < 0 || j < i {
		return "", fmt.Errorf("no %q ... %q markers in order", Begin, End)
	}
	return page[:i+len(Begin)] + "\n" + ref + page[j:], nil
}

// Current returns the block between the markers of page.
func Current(page string) (string, error) {
	i, j := strings.Index(page, Begin), strings.Index(page, End)
	if i < 0 || j < i {
		return "", fmt.Errorf("no %q ... %q markers in order", Begin, End)
	}
	return page[i+len(Begin)+1 : j], nil
}

// comments reads the doc comments of struct fields from the sources of
// this module, one package at a time.
type comments struct {
	root   string
	byType map[string]map[string]string // "pkgpath.Type" -> field -> doc
	parsed map[string]bool
}

// of returns the doc comment of the field at path under t. The parts of a
// composite field (Table.Schema, Sarama.ClientID) take the comment of the
// field itself, whose type is documented elsewhere.
func (c *comments) of(t reflect.Type, path string) (string, error) {
	owner, field, cur := t, "", t
	for _, name := range strings.Split(path, ".") {
		f, ok := cur.FieldByName(name)
		if !ok {
			return "", fmt.Errorf("%s has no field %s", cur, name)
		}
		owner, field = cur, name
		ft := f.Type
		if ft.Kind() == reflect.Pointer {
			ft = ft.Elem()
		}
		if ft.Kind() != reflect.Struct || !strings.HasPrefix(ft.PkgPath(), module) || ft == reflect.TypeFor[outbox.Table]() {
			break
		}
		cur = ft
	}
	if err := c.parse(owner.PkgPath()); err != nil {
		return "", err
	}
	doc := c.byType[owner.PkgPath()+"."+owner.Name()][field]
	if doc == "" {
		return "", fmt.Errorf("%s.%s has no doc comment: document it where it is defined", owner, field)
	}
	return doc, nil
}

func (c *comments) parse(pkgPath string) error {
	if c.parsed == nil {
		c.parsed = map[string]bool{}
	}
	if c.parsed[pkgPath] {
		return nil
	}
	c.parsed[pkgPath] = true
	dir := filepath.Join(c.root, strings.TrimPrefix(strings.TrimPrefix(pkgPath, module), "/"))
	pkgs, err := parser.ParseDir(token.NewFileSet(), dir, func(fi os.FileInfo) bool { return !strings.HasSuffix(fi.Name(), "_test.go") }, parser.ParseComments)
	if err != nil {
		return err
	}
	for _, p := range pkgs {
		for _, f := range p.Files {
			ast.Inspect(f, func(n ast.Node) bool {
				ts, ok := n.(*ast.TypeSpec)
				if !ok {
					return true
				}
				st, ok := ts.Type.(*ast.StructType)
				if !ok {
					return true
				}
				fields := map[string]string{}
				for _, fl := range st.Fields.List {
					for _, id := range fl.Names {
						fields[id.Name] = strings.Join(strings.Fields(fl.Doc.Text()), " ")
					}
				}
				c.byType[pkgPath+"."+ts.Name.Name] = fields
				return false
			})
		}
	}
	return nil
}

var (
	defaultRE = regexp.MustCompile(`(?:^|\. |; )(Default(?: \(zero\))?[:,]? .*?)(?:\.(?: |$)|$)`)
	choiceRE  = regexp.MustCompile(`([A-Za-z][\w.]*) \((?:the )?default\b`)
	rangeRE   = regexp.MustCompile(`\b((?:\d[\d,]*|[A-Z]\w+)-\d[\d,]*|\d+\w* to [A-Z]\w+(?: \(\S+\))?|at least \w+|at most [\d,]+ bytes)\b`)
)

// defaultOf is the sentence of doc that states the default: "Default
// 500ms", or the value a list of choices marks "(default)".
func defaultOf(doc string) string {
	if m := defaultRE.FindStringSubmatch(doc); m != nil {
		def, _, _ := strings.Cut(m[1], "; ")
		def = strings.TrimPrefix(strings.TrimPrefix(strings.TrimPrefix(def, "Default"), " (zero)"), ":")
		return strings.TrimSpace(strings.TrimPrefix(def, ","))
	}
	if m := choiceRE.FindStringSubmatch(doc); m != nil {
		return m[1]
	}
	if strings.Contains(doc, "Required") {
		return "none (required)"
	}
	return ""
}

// rangeOf is the range doc states, e.g. 1-10000 or 1s to BatchSize.
func rangeOf(doc string) string {
	return rangeRE.FindString(doc)
}

// cell makes s fit a Markdown table cell.
func cell(s string) string {
	if s == "" {
		return "—"
	}
	var b bytes.Buffer
	for _, r := range s {
		switch r {
		case '|':
			b.WriteString(`\|`)
		case '<':
			b.WriteString("&lt;")
		case '>':
			b.WriteString("&gt;")
		default:
			b.WriteRune(r)
		}
	}
	return b.String()
}
