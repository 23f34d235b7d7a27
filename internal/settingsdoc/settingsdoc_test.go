package settingsdoc

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// The settings reference in docs/configuration.md is the one generated from
// the struct tags and doc comments as they are now.
func TestReferenceIsFresh(t *testing.T) {
	root := filepath.Join("..", "..")
	page, err := os.ReadFile(filepath.Join(root, File))
	if err != nil {
		t.Fatal(err)
	}
	got, err := Current(string(page))
	if err != nil {
		t.Fatalf("%s: %v", File, err)
	}
	want, err := Reference(root)
	if err != nil {
		t.Fatal(err)
	}
	if got != want {
		gl, wl := strings.Split(got, "\n"), strings.Split(want, "\n")
		for i := range min(len(gl), len(wl)) {
			if gl[i] != wl[i] {
				t.Errorf("first difference at line %d of the block:\n have: %s\n want: %s", i+1, gl[i], wl[i])
				break
			}
		}
		t.Fatalf("%s's settings reference is stale: run go generate ./... (from the module's root) and commit the result", File)
	}
}

// Every setting has a stated default, so that the reference's Default
// column is never empty.
func TestEverySettingStatesItsDefault(t *testing.T) {
	ref, err := Reference(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	rows := 0
	for _, line := range strings.Split(ref, "\n") {
		cells := strings.Split(line, " | ")
		if !strings.HasPrefix(line, "| `") || len(cells) < 6 {
			continue
		}
		rows++
		if cells[3] == "—" {
			t.Errorf("%s has no default in its doc comment (a sentence \"Default ...\" or a choice marked \"(default)\")", cells[0][2:])
		}
	}
	if rows < 70 {
		t.Errorf("only %d settings in the reference", rows)
	}
}
