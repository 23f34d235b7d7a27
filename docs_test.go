package outbox_test

import (
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"unicode"
)

// readmeMaxLines bounds the README: it is the front door (what fxoutbox is,
// an example, the two commands, the guarantees, links); everything else
// lives in a guide under docs/.
const readmeMaxLines = 400

// pendingPages are pages the README links that another change adds. A
// link to one is checked once it exists; until then it is logged, not
// failed. Remove a page from here when it has landed.
var pendingPages = map[string]bool{}

// TestDocsLinksResolve checks every relative link of README.md,
// ARCHITECTURE.md and docs/*.md: the file (or folder) it names exists, and
// its #anchor, in the same page or in another markdown page, is a heading
// of that page, spelt as GitHub spells heading anchors. Links in code
// (fenced blocks and `spans`) are not links and are skipped; absolute URLs
// are not checked.
func TestDocsLinksResolve(t *testing.T) {
	t.Parallel()
	pages := docPages(t)
	anchors := map[string]map[string]bool{} // page -> its anchors
	for _, p := range pages {
		anchors[p] = headingAnchors(t, p)
	}
	checked := 0
	for _, page := range pages {
		for _, l := range markdownLinks(t, page) {
			checked++
			target, anchor, _ := strings.Cut(l.target, "#")
			file := page
			if target != "" {
				file = filepath.Join(filepath.Dir(page), filepath.FromSlash(target))
				if _, err := os.Stat(file); err != nil {
					if pendingPages[filepath.Clean(file)] && anchor == "" {
						t.Logf("%s:%d: link %q: %s is not there yet (pendingPages)", page, l.line, l.target, file)
						continue
					}
					t.Errorf("%s:%d: link %q: %s does not exist", page, l.line, l.target, file)
					continue
				}
			}
			if anchor == "" {
				continue
			}
			if !strings.HasSuffix(file, ".md") {
				t.Errorf("%s:%d: link %q: an anchor into %s, which is not a markdown page", page, l.line, l.target, file)
				continue
			}
			as, ok := anchors[filepath.Clean(file)]
			if !ok {
				as = headingAnchors(t, file)
			}
			if !as[anchor] {
				t.Errorf("%s:%d: link %q: %s has no heading with anchor #%s (it has: %s)",
					page, l.line, l.target, file, anchor, strings.Join(slices.Sorted(maps.Keys(as)), ", "))
			}
		}
	}
	if checked < 50 {
		t.Errorf("found %d links in %d pages: the link parser is broken", checked, len(pages))
	}
}

// TestReadmeIsShort keeps README.md the front door.
func TestReadmeIsShort(t *testing.T) {
	t.Parallel()
	b, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(string(b), "\n"); n > readmeMaxLines {
		t.Errorf("README.md has %d lines, at most %d: move the details into a guide under docs/ and link it", n, readmeMaxLines)
	}
}

// The checker itself: anchors as GitHub makes them, links found where
// markdown finds them.
func TestDocsLinkParser(t *testing.T) {
	t.Parallel()
	for heading, want := range map[string]string{
		"Cursor progress: delivery that writes nothing per event": "cursor-progress-delivery-that-writes-nothing-per-event",
		"WAL streaming (issue 16)":                                "wal-streaming-issue-16",
		"Consuming events: the inbox":                             "consuming-events-the-inbox",
		"Operating parked events with `outboxctl`":                "operating-parked-events-with-outboxctl",
		"Headline (medians of 3 rounds, 5 for writes; x)":         "headline-medians-of-3-rounds-5-for-writes-x",
		"**Bold** and [a link](https://example.com) here":         "bold-and-a-link-here",
		"1. Drain: 100000 events x 256 B":                         "1-drain-100000-events-x-256-b",
		"Names in Prometheus":                                     "names-in-prometheus",
		"Limits, start-up_checks":                                 "limits-start-up_checks",
		"Inbox: parked records":                                   "inbox-parked-records",
	} {
		if got := slug(heading); got != want {
			t.Errorf("slug(%q) = %q, want %q", heading, got, want)
		}
	}

	dir := t.TempDir()
	page := filepath.Join(dir, "p.md")
	src := "# Title\n\nSee [a](other.md#x) and ![img](i.png \"title\"), `[not](code.md)`.\n" +
		"```go\n[not](code.md)\n```\n## Title\n[http](https://example.com) [self](#title-1) [mail](mailto:a@b)\n"
	if err := os.WriteFile(page, []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, l := range markdownLinks(t, page) {
		got = append(got, fmt.Sprintf("%d:%s", l.line, l.target))
	}
	if want := []string{"3:other.md#x", "3:i.png", "8:#title-1"}; !slices.Equal(got, want) {
		t.Errorf("links %v, want %v", got, want)
	}
	if as := headingAnchors(t, page); !as["title"] || !as["title-1"] || len(as) != 2 {
		t.Errorf("anchors %v, want title and title-1", as)
	}
}

func docPages(t *testing.T) []string {
	t.Helper()
	pages, err := filepath.Glob(filepath.Join("docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	pages = append([]string{"README.md", "ARCHITECTURE.md"}, pages...)
	for _, p := range pages {
		if _, err := os.Stat(p); err != nil {
			t.Fatal(err)
		}
	}
	return pages
}

type mdLink struct {
	line   int
	target string
}

var (
	fence      = regexp.MustCompile("^\\s*(```+|~~~+)")
	codeSpan   = regexp.MustCompile("`+[^`]*`+")
	inlineLink = regexp.MustCompile(`!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+"[^"]*")?\s*\)`)
	headingRE  = regexp.MustCompile(`^(#{1,6})\s+(.*?)\s*#*\s*$`)
	absolute   = regexp.MustCompile(`^[a-zA-Z][a-zA-Z0-9+.-]*:`)
)

// markdownLines calls fn for each line of page outside fenced code blocks.
func markdownLines(t *testing.T, page string, fn func(n int, line string)) {
	t.Helper()
	b, err := os.ReadFile(page)
	if err != nil {
		t.Fatal(err)
	}
	var open string // the fence of the code block we are in
	for i, line := range strings.Split(string(b), "\n") {
		if m := fence.FindStringSubmatch(line); m != nil {
			switch {
			case open == "":
				open = m[1]
				continue
			case strings.HasPrefix(m[1], open[:1]) && len(m[1]) >= len(open) && strings.TrimSpace(line) == m[1]:
				open = ""
				continue
			}
		}
		if open != "" {
			continue
		}
		fn(i+1, line)
	}
	if open != "" {
		t.Errorf("%s: a code block opened with %s is never closed", page, open)
	}
}

func markdownLinks(t *testing.T, page string) []mdLink {
	t.Helper()
	var links []mdLink
	markdownLines(t, page, func(n int, line string) {
		for _, m := range inlineLink.FindAllStringSubmatch(codeSpan.ReplaceAllString(line, ""), -1) {
			if absolute.MatchString(m[1]) {
				continue
			}
			links = append(links, mdLink{n, m[1]})
		}
	})
	return links
}

// headingAnchors returns the anchors GitHub gives the headings of page:
// the slug of each, with -1, -2, ... for repeats.
func headingAnchors(t *testing.T, page string) map[string]bool {
	t.Helper()
	anchors := map[string]bool{}
	seen := map[string]int{}
	markdownLines(t, page, func(_ int, line string) {
		m := headingRE.FindStringSubmatch(line)
		if m == nil {
			return
		}
		s := slug(m[2])
		if k := seen[s]; k > 0 {
			anchors[fmt.Sprintf("%s-%d", s, k)] = true
		} else {
			anchors[s] = true
		}
		seen[s]++
	})
	return anchors
}

var (
	mdLinkText = regexp.MustCompile(`!?\[([^\]]*)\]\([^)]*\)`)
	mdEmphasis = regexp.MustCompile("[*`]")
)

// slug is GitHub's heading anchor: the heading's text (links by their text,
// no emphasis or code marks), lower case, without punctuation other than
// '-' and '_', spaces as '-'.
func slug(heading string) string {
	text := mdLinkText.ReplaceAllString(heading, "$1")
	text = mdEmphasis.ReplaceAllString(text, "")
	var b strings.Builder
	for _, r := range strings.ToLower(strings.TrimSpace(text)) {
		switch {
		case r == ' ':
			b.WriteByte('-')
		case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsNumber(r):
			b.WriteRune(r)
		}
	}
	return b.String()
}
