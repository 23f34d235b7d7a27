package relay

import (
	"go/ast"
	"go/parser"
	"go/token"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestDefaultsInComments checks that each Config and StreamConfig field
// comment states the default its constant holds, so the constants stay the
// one source of each default.
func TestDefaultsInComments(t *testing.T) {
	want := map[string]map[string]any{
		"Config": {
			"PollInterval": defaultPollInterval, "BatchSize": defaultBatchSize, "MaxBatchSize": defaultMaxBatchSize,
			"Workers": defaultWorkers, "Lanes": defaultLanes, "MaxAttempts": defaultMaxAttempts,
			"MaxMessageBytes": defaultMaxMessageBytes, "Retention": defaultRetention, "CleanupInterval": defaultCleanupInterval,
			"CleanupBatch": defaultCleanupBatch, "BatchTimeout": defaultBatchTimeout, "MaxBackoff": defaultMaxBackoff,
			"StatsInterval": defaultStatsInterval,
		},
		"StreamConfig": {
			"MaxLagBytes": defaultStreamMaxLagBytes, "MaxLag": defaultStreamMaxLag, "StandbyRetry": defaultStreamStandbyRetry,
			"StatusInterval": defaultStreamStatusInterval, "SweepInterval": defaultStreamSweepInterval,
			"Linger": defaultStreamLinger, "RetryInterval": defaultStreamRetryInterval,
		},
	}
	comments := fieldComments(t, "config.go", "stream.go")
	if doc := strings.Join(strings.Fields(comments["Config.MaxBatchSize"]), " "); !strings.Contains(doc, "or "+defaultText(defaultEOMaxBatchSize)+" under ExactlyOnce in Mode Poll") {
		t.Errorf("Config.MaxBatchSize: comment does not say the ExactlyOnce default, %d:\n%s", defaultEOMaxBatchSize, doc)
	}
	for typ, fields := range want {
		for field, def := range fields {
			doc, ok := comments[typ+"."+field]
			if !ok {
				t.Errorf("%s.%s: no field comment found", typ, field)
				continue
			}
			if s := "Default " + defaultText(def); !strings.Contains(strings.Join(strings.Fields(doc), " "), s) {
				t.Errorf("%s.%s: comment does not say %q (the constant's value):\n%s", typ, field, s, doc)
			}
		}
	}
}

// defaultText writes a default as the field comments do: 500ms, 1m, 72h,
// 1 GiB, 1,048,588.
func defaultText(v any) string {
	switch v := v.(type) {
	case time.Duration:
		s := v.String()
		for _, z := range []string{"m0s", "h0m"} {
			if strings.HasSuffix(s, z) {
				s = strings.TrimSuffix(s, z[1:])
			}
		}
		return s
	case int:
		return intText(int64(v))
	case int64:
		return intText(v)
	}
	panic("unexpected default type")
}

func intText(n int64) string {
	if n >= 1<<30 && n%(1<<30) == 0 {
		return strconv.FormatInt(n>>30, 10) + " GiB"
	}
	s := strconv.FormatInt(n, 10)
	if n < 100000 {
		return s
	}
	var b strings.Builder
	for i, r := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(r)
	}
	return b.String()
}

// fieldComments returns the doc comments of the struct fields declared in
// files, keyed by "Type.Field".
func fieldComments(t *testing.T, files ...string) map[string]string {
	t.Helper()
	out := map[string]string{}
	fset := token.NewFileSet()
	for _, name := range files {
		f, err := parser.ParseFile(fset, name, nil, parser.ParseComments)
		if err != nil {
			t.Fatal(err)
		}
		ast.Inspect(f, func(n ast.Node) bool {
			ts, ok := n.(*ast.TypeSpec)
			if !ok {
				return true
			}
			st, ok := ts.Type.(*ast.StructType)
			if !ok {
				return false
			}
			for _, fl := range st.Fields.List {
				for _, id := range fl.Names {
					out[ts.Name.Name+"."+id.Name] = fl.Doc.Text()
				}
			}
			return false
		})
	}
	return out
}

// TestMaxBatchSizeDefault: batches grow to 500 by default, to 5000 under
// ExactlyOnce in Mode Poll, never below BatchSize, and a set value stays.
func TestMaxBatchSizeDefault(t *testing.T) {
	for _, c := range []struct {
		cfg  Config
		want int
	}{
		{Config{}, defaultMaxBatchSize},
		{Config{BatchSize: 800}, 800},
		{Config{Delivery: ExactlyOnce}, defaultEOMaxBatchSize},
		{Config{Delivery: ExactlyOnce, BatchSize: 8000}, 8000},
		{Config{Delivery: ExactlyOnce, MaxBatchSize: 300}, 300},
		{Config{Delivery: ExactlyOnce, Mode: Stream, Progress: ProgressCursor}, defaultMaxBatchSize},
	} {
		if got := c.cfg.withDefaults().MaxBatchSize; got != c.want {
			t.Errorf("%+v: MaxBatchSize %d, want %d", c.cfg, got, c.want)
		}
	}
}
