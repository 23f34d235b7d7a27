// Command chart draws docs/benchmarks.png from bench/results.json: drain
// throughput per contender, commit-to-consumer latency per contender (the
// streaming relay's beside polling), write throughput per variant, the
// inbox's rate against a plain consumer group, and the streaming relay's
// highest followed rate against polling. With -md it also writes the results as the
// markdown tables docs/benchmarks.md quotes.
//
//	cd bench && go run ./chart [-in results.json] [-out ../docs/benchmarks.png] [-md out/tables.md]
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"image/color"
	"log"
	"math"
	"os"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/font"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
)

// The subset of results.json the chart reads.
type results struct {
	Command string `json:"command"`
	Broker  string `json:"broker"`
	Machine struct {
		NProc     int     `json:"nproc"`
		CPU       string  `json:"cpu"`
		MemoryGiB float64 `json:"memory_gib"`
		PGVersion string  `json:"pg_version"`
	} `json:"machine"`
	Params struct {
		Backlog int `json:"drain_backlog_events"`
	} `json:"params"`
	Drain *struct {
		Contenders []struct {
			Name string  `json:"name"`
			Kind string  `json:"kind"`
			EPS  float64 `json:"median_eps"`
		} `json:"contenders"`
	} `json:"drain"`
	Latency *struct {
		Series []struct {
			Contender string  `json:"contender"`
			Rate      int     `json:"offered_eps"`
			P50       float64 `json:"p50_ms"`
			P99       float64 `json:"p99_ms"`
			Saturated bool    `json:"saturated"`
		} `json:"series"`
	} `json:"latency"`
	Write *struct {
		Series []struct {
			Variant string  `json:"variant"`
			Writers int     `json:"writers"`
			Kind    string  `json:"kind"`
			TPS     float64 `json:"tps"`
		} `json:"series"`
	} `json:"write"`
	Inbox *struct {
		InboxEPS        float64 `json:"inbox_eps"`
		PlainEPS        float64 `json:"plain_eps"`
		InboxSerialEPS  float64 `json:"inbox_serial_eps"`
		PlainSerialEPS  float64 `json:"plain_serial_eps"`
		Inbox1EPS       float64 `json:"inbox_1p_eps"`
		InboxSerial1EPS float64 `json:"inbox_serial_1p_eps"`
		InboxBatchEPS   float64 `json:"inbox_batch_eps"`
		PlainBatchEPS   float64 `json:"plain_batch_eps"`
		HandDedupeEPS   float64 `json:"handwritten_dedupe_eps"`
		Partitions      int     `json:"partitions"`
	} `json:"inbox"`
	Wal *struct {
		P50         float64 `json:"latency_p50_ms"`
		P99         float64 `json:"latency_p99_ms"`
		PollP50     float64 `json:"poll_latency_p50_ms"`
		PollP99     float64 `json:"poll_latency_p99_ms"`
		Rate        int     `json:"latency_rate_eps"`
		MaxRate     float64 `json:"max_rate_eps"`
		PollMaxRate float64 `json:"poll_max_rate_eps"`
		PGUs        float64 `json:"pg_us_per_event"`
		PollPGUs    float64 `json:"poll_pg_us_per_event"`
	} `json:"wal"`
}

var (
	colFx    = color.RGBA{R: 0x1f, G: 0x77, B: 0xb4, A: 0xff} // fxoutbox
	colOther = color.RGBA{R: 0xd6, G: 0x61, B: 0x2c, A: 0xff} // seed, watermill
	colLimit = color.RGBA{R: 0x88, G: 0x88, B: 0x88, A: 0xff} // ceilings
	colP99   = color.RGBA{R: 0x9e, G: 0xc9, B: 0xe8, A: 0xff}
)

func main() {
	in := flag.String("in", "results.json", "results file")
	out := flag.String("out", "../docs/benchmarks.png", "PNG to write")
	md := flag.String("md", "", "also write the results as markdown tables to this file")
	flag.Parse()
	b, err := os.ReadFile(*in)
	if err != nil {
		log.Fatal(err)
	}
	if *md != "" {
		f, err := os.Create(*md)
		if err != nil {
			log.Fatal(err)
		}
		if err := writeMarkdown(f, b); err != nil {
			log.Fatal(err)
		}
		if err := f.Close(); err != nil {
			log.Fatal(err)
		}
	}
	var r results
	if err := json.Unmarshal(b, &r); err != nil {
		log.Fatal(err)
	}
	plot.DefaultFont = font.Font{Typeface: "Liberation", Variant: "Sans"}
	var plots []*plot.Plot
	if r.Drain != nil {
		plots = append(plots, drainPlot(&r))
	}
	if r.Latency != nil || r.Wal != nil {
		plots = append(plots, latencyPlot(&r))
	}
	if r.Write != nil {
		plots = append(plots, writePlot(&r))
	}
	if r.Inbox != nil {
		plots = append(plots, inboxPlot(&r))
	}
	if r.Wal != nil && r.Wal.MaxRate > 0 {
		plots = append(plots, walPlot(&r))
	}
	if len(plots) == 0 {
		log.Fatal("results hold no section to draw")
	}
	// One plot per row, so the image stays readable when a page scales it down.
	const w, h, head = 10 * vg.Inch, 3.4 * vg.Inch, 0.7 * vg.Inch
	img := vgimg.NewWith(vgimg.UseWH(w, h*vg.Length(len(plots))+head), vgimg.UseDPI(110))
	dc := draw.New(img)
	dc.SetColor(color.White)
	dc.Fill(dc.Rectangle.Path())
	ts := draw.TextStyle{Color: color.Black, Font: font.From(plot.DefaultFont, 14), Handler: plot.DefaultTextHandler, XAlign: draw.XCenter}
	mid := dc.Min.X + (dc.Max.X-dc.Min.X)/2
	dc.FillText(ts, vg.Point{X: mid, Y: dc.Max.Y - 0.25*vg.Inch}, "fxoutbox vs the seed's relay vs watermill's Forwarder (same PostgreSQL, same broker, one run)")
	ts.Font = font.From(plot.DefaultFont, 10)
	dc.FillText(ts, vg.Point{X: mid, Y: dc.Max.Y - 0.5*vg.Inch}, fmt.Sprintf("%d x %s, %.0f GiB RAM, %s (fsync on), broker: %s;  %s",
		r.Machine.NProc, r.Machine.CPU, r.Machine.MemoryGiB, r.Machine.PGVersion, r.Broker, r.Command))
	body := draw.Canvas{Canvas: dc.Canvas, Rectangle: vg.Rectangle{Min: dc.Min, Max: vg.Point{X: dc.Max.X, Y: dc.Max.Y - head}}}
	tiles := draw.Tiles{Rows: len(plots), Cols: 1, PadY: 0.2 * vg.Inch, PadLeft: 0.1 * vg.Inch, PadRight: 0.2 * vg.Inch, PadBottom: 0.1 * vg.Inch}
	grid := make([][]*plot.Plot, len(plots))
	for i, p := range plots {
		grid[i] = []*plot.Plot{p}
	}
	canvases := plot.Align(grid, tiles, body)
	for i, p := range plots {
		p.Draw(canvases[i][0])
	}
	f, err := os.Create(*out)
	if err != nil {
		log.Fatal(err)
	}
	defer f.Close()
	if _, err := (vgimg.PngCanvas{Canvas: img}).WriteTo(f); err != nil {
		log.Fatal(err)
	}
	log.Printf("wrote %s", *out)
}

func drainPlot(r *results) *plot.Plot {
	p := plot.New()
	p.Title.Text = fmt.Sprintf("1. Drain a %dk-event backlog: events/s (log scale)", r.Params.Backlog/1000)
	p.X.Label.Text = "events/s, median of rounds"
	var bars []bar
	for _, c := range r.Drain.Contenders {
		if c.Kind == "diagnostic" || c.EPS <= 0 {
			continue
		}
		col := colOther
		switch {
		case c.Kind == "limit":
			col = colLimit
		case strings.HasPrefix(c.Name, "fxoutbox"):
			col = colFx
		}
		name := c.Name
		if c.Kind == "limit" {
			name += " (ceiling)"
		}
		bars = append(bars, bar{name: name, v: c.EPS, col: col, label: humanEPS(c.EPS)})
	}
	hbar(p, bars, true)
	return p
}

func latencyPlot(r *results) *plot.Plot {
	p := plot.New()
	p.Title.Text = "2. Commit-to-consumer latency: p50 (dark), p99 (light), ms"
	p.X.Label.Text = "milliseconds (log scale); offered load per row"
	var bars []bar
	if w := r.Wal; w != nil && w.P50 > 0 {
		// Section 6's runs: writers in another process, relays in processes of their own.
		for _, s := range []struct {
			name     string
			p50, p99 float64
		}{{"fxoutbox stream (WAL)", w.P50, w.P99}, {"fxoutbox poll, same runs", w.PollP50, w.PollP99}} {
			bars = append(bars, bar{name: fmt.Sprintf("%s @ %dk/s", s.name, w.Rate/1000), v: s.p50, v2: s.p99, col: colFx, col2: colP99,
				label: fmt.Sprintf("%s / %s", humanMS(s.p50), humanMS(s.p99))})
		}
	}
	var series []struct {
		Contender string  `json:"contender"`
		Rate      int     `json:"offered_eps"`
		P50       float64 `json:"p50_ms"`
		P99       float64 `json:"p99_ms"`
		Saturated bool    `json:"saturated"`
	}
	if r.Latency != nil {
		series = r.Latency.Series
	}
	for _, s := range series {
		name := fmt.Sprintf("%s @ %dk/s", s.Contender, s.Rate/1000)
		if s.Saturated {
			name += " (fell behind)"
		}
		col := colFx
		if !strings.HasPrefix(s.Contender, "fxoutbox") {
			col = colOther
		}
		bars = append(bars, bar{name: name, v: s.P50, v2: s.P99, col: col, col2: colP99,
			label: fmt.Sprintf("%s / %s", humanMS(s.P50), humanMS(s.P99))})
	}
	hbar(p, bars, true)
	return p
}

func writePlot(r *results) *plot.Plot {
	p := plot.New()
	p.Title.Text = "3. Write: business transactions/s, 16 writers"
	p.X.Label.Text = "transactions/s, median of rounds"
	var bars []bar
	for _, s := range r.Write.Series {
		if s.Writers != 16 || s.Kind == "diagnostic" {
			continue
		}
		col := colFx
		switch {
		case strings.HasPrefix(s.Variant, "plain"), strings.HasPrefix(s.Variant, "rawinsert"):
			col = colLimit
		case strings.Contains(s.Variant, "notify"):
			col = colOther
		}
		bars = append(bars, bar{name: s.Variant, v: s.TPS, col: col, label: fmt.Sprintf("%.0f", s.TPS)})
	}
	hbar(p, bars, false)
	return p
}

func inboxPlot(r *results) *plot.Plot {
	x := r.Inbox
	p := plot.New()
	p.Title.Text = "4. Inbox: records applied/s, a one-row write each (package inbox vs a plain sarama group)"
	p.X.Label.Text = "records/s, median of rounds"
	var bars []bar
	for _, b := range []struct {
		name  string
		v     float64
		plain bool
	}{
		{fmt.Sprintf("inbox, 16 in flight per partition (%d partitions)", x.Partitions), x.InboxEPS, false},
		{"plain group, 16 in flight, no dedupe", x.PlainEPS, true},
		{"plain group writing the inbox row by hand", x.HandDedupeEPS, true},
		{"inbox, BatchSize 50", x.InboxBatchEPS, false},
		{"plain group, batches of 50, no dedupe", x.PlainBatchEPS, true},
		{"inbox, partition-serial", x.InboxSerialEPS, false},
		{"plain group, partition-serial", x.PlainSerialEPS, true},
		{"inbox, one partition, 16 in flight", x.Inbox1EPS, false},
		{"inbox, one partition, serial", x.InboxSerial1EPS, false},
	} {
		if b.v <= 0 {
			continue
		}
		col := colFx
		if b.plain {
			col = colLimit
		}
		bars = append(bars, bar{name: b.name, v: b.v, col: col, label: fmt.Sprintf("%.0f", b.v)})
	}
	hbar(p, bars, false)
	return p
}

func walPlot(r *results) *plot.Plot {
	w := r.Wal
	p := plot.New()
	p.Title.Text = "5. Streaming from the WAL vs polling: highest write rate followed with lag under 1 s"
	p.X.Label.Text = "events/s (writers in another process); PostgreSQL CPU per event at 1k/s in the label"
	bars := []bar{
		{name: "fxoutbox stream (WAL)", v: w.MaxRate, col: colFx, label: fmt.Sprintf("%.0f/s, %.0f µs/event", w.MaxRate, w.PGUs)},
		{name: "fxoutbox poll (default settings)", v: w.PollMaxRate, col: colFx, label: fmt.Sprintf("%.0f/s, %.0f µs/event", w.PollMaxRate, w.PollPGUs)},
	}
	hbar(p, bars, false)
	return p
}

type bar struct {
	name      string
	v, v2     float64 // v2 > 0: a second, lighter bar behind (e.g. p99 behind p50)
	col, col2 color.Color
	label     string
}

// hbar draws horizontal bars, first bar on top.
func hbar(p *plot.Plot, bars []bar, logX bool) {
	n := len(bars)
	names := make([]string, n)
	maxV := 0.0
	minV := math.Inf(1)
	for i, b := range bars {
		names[n-1-i] = b.name
		maxV = max(maxV, b.v, b.v2)
		minV = min(minV, b.v)
	}
	base := 0.0
	if logX {
		base = math.Pow(10, math.Floor(math.Log10(max(minV, 1e-3)))-0.3)
		p.X.Scale = plot.LogScale{}
		p.X.Tick.Marker = humanTicks{}
	}
	p.Add(plotter.NewGrid())
	p.Add(&hbars{bars: bars, base: base, maxV: maxV, logX: logX})
	p.NominalY(names...)
	p.Y.Tick.Label.Font.Size = 10
}

// hbars is a horizontal bar plotter that works with a log X axis (bars start
// at base, not 0) and prints each bar's label at its end.
type hbars struct {
	bars []bar
	base float64
	maxV float64
	logX bool
}

func (h *hbars) Plot(c draw.Canvas, plt *plot.Plot) {
	trX, trY := plt.Transforms(&c)
	n := len(h.bars)
	height := (trY(1) - trY(0)) * 0.7
	ts := draw.TextStyle{Color: color.Black, Font: font.From(plot.DefaultFont, 9), Handler: plot.DefaultTextHandler, YAlign: draw.YCenter}
	for i, b := range h.bars {
		y := trY(float64(n - 1 - i))
		rect := func(v float64, col color.Color) {
			if v <= h.base {
				return
			}
			x0, x1 := trX(h.base), trX(v)
			pts := []vg.Point{{X: x0, Y: y - height/2}, {X: x1, Y: y - height/2}, {X: x1, Y: y + height/2}, {X: x0, Y: y + height/2}}
			c.FillPolygon(col, c.ClipPolygonXY(pts))
		}
		end := b.v
		if b.v2 > 0 {
			rect(b.v2, b.col2)
			end = max(end, b.v2)
		}
		rect(b.v, b.col)
		c.FillText(ts, vg.Point{X: trX(end) + 3, Y: y}, b.label)
	}
}

func (h *hbars) DataRange() (xmin, xmax, ymin, ymax float64) {
	xmax = h.maxV * 1.6 // room for the labels
	if h.logX {
		xmax = h.maxV * 12
	}
	return h.base, xmax, -0.5, float64(len(h.bars)) - 0.5
}

func humanEPS(v float64) string {
	switch {
	case v >= 10000:
		return fmt.Sprintf("%.0fk", v/1000)
	case v >= 1000:
		return fmt.Sprintf("%.1fk", v/1000)
	}
	return fmt.Sprintf("%.0f", v)
}

func humanMS(v float64) string {
	switch {
	case v >= 1000:
		return fmt.Sprintf("%.2f s", v/1000)
	case v >= 10:
		return fmt.Sprintf("%.0f ms", v)
	}
	return fmt.Sprintf("%.1f ms", v)
}

// humanTicks are log ticks labelled 1, 10, 100, 1k, 10k, 100k, 1M.
type humanTicks struct{}

func (humanTicks) Ticks(min, max float64) []plot.Tick {
	ts := plot.LogTicks{Prec: -1}.Ticks(min, max)
	for i := range ts {
		if ts[i].Label == "" {
			continue
		}
		v := ts[i].Value
		switch {
		case v >= 1e6:
			ts[i].Label = fmt.Sprintf("%gM", v/1e6)
		case v >= 1e3:
			ts[i].Label = fmt.Sprintf("%gk", v/1e3)
		default:
			ts[i].Label = fmt.Sprintf("%g", v)
		}
	}
	return ts
}
