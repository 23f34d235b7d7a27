package adminui

import (
	"errors"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/fxoutbox/outbox"
	"github.com/fxoutbox/outbox/admin"
	"github.com/fxoutbox/outbox/internal/tablesql"
)

// Each page has a JSON twin under api/ with the same query parameters and
// the same data: the page renders it with html/template (every stored value
// escaped), and its script refreshes and acts through the twin.

// table is the outbox table the request names (parameter table; default
// the first), or false after answering 404.
func (rq *request) table() (outbox.Table, bool) {
	name := rq.FormValue("table")
	for _, t := range rq.h.cfg.Tables {
		if name == "" || name == t.String() {
			return t, true
		}
	}
	rq.fail(http.StatusNotFound, "no such table: the UI shows "+strings.Join(tableNames(rq.h.cfg.Tables), ", "))
	return outbox.Table{}, false
}

// inbox is the inbox table the request names (parameter inbox; default the
// first), or false after answering 404.
func (rq *request) inbox() (outbox.Table, bool) {
	name := rq.FormValue("inbox")
	for _, t := range rq.h.cfg.Inboxes {
		if name == "" || name == t.String() {
			return t, true
		}
	}
	rq.fail(http.StatusNotFound, "no such inbox table")
	return outbox.Table{}, false
}

func tableNames(ts []outbox.Table) []string {
	var out []string
	for _, t := range ts {
		out = append(out, t.String())
	}
	return out
}

func (h *Handler) apiOverview(rq *request) {
	ov, err := h.overview(rq.Context())
	if err != nil {
		rq.dbFail(err)
		return
	}
	rq.json(ov)
}

func (h *Handler) pageOverview(rq *request) {
	ov, err := h.overview(rq.Context())
	if err != nil {
		rq.dbFail(err)
		return
	}
	rq.page(http.StatusOK, "overview", ov)
}

// parkedPage is the JSON of /api/parked: the groups of the parked events
// that match the filter, how many match, and one page of them (keyset:
// the next page is after=Next).
type parkedPage struct {
	Table    string              `json:"table"`
	Filter   eventFilter         `json:"filter"`
	Groups   []parkedGroupRow    `json:"groups"`
	Matching int                 `json:"matching"`
	Events   []admin.ParkedEvent `json:"events"`
	After    int64               `json:"after"`
	// Next is the after of the next page; 0 on the last page.
	Next int64 `json:"next"`
}

func (rq *request) filter() eventFilter {
	return eventFilter{Topic: rq.FormValue("topic"), Type: rq.FormValue("type"), Key: rq.FormValue("key"),
		EventID: strings.TrimSpace(rq.FormValue("event_id")), Reason: rq.FormValue("reason"), Consumer: rq.FormValue("consumer")}
}

func (h *Handler) parked(rq *request) (parkedPage, bool) {
	t, ok := rq.table()
	if !ok {
		return parkedPage{}, false
	}
	pp := parkedPage{Table: t.String(), Filter: rq.filter()}
	pp.Filter.Consumer = ""
	pp.After, _ = strconv.ParseInt(rq.FormValue("after"), 10, 64)
	af, err := pp.Filter.admin()
	if err != nil {
		rq.fail(http.StatusBadRequest, err.Error())
		return pp, false
	}
	ctx := rq.Context()
	lf := af
	lf.After, lf.Limit = max(pp.After, 0), h.cfg.PageSize+1
	err = parallel(
		func() (err error) {
			pp.Groups, err = parkedGroups(ctx, h.cfg.DB, t, af, maxGroups)
			return err
		},
		func() (err error) {
			pp.Events, err = admin.ListParked(ctx, h.cfg.DB, t, lf)
			return err
		})
	if err != nil {
		rq.dbFail(err)
		return pp, false
	}
	for _, g := range pp.Groups {
		pp.Matching += int(g.Count)
	}
	if len(pp.Groups) == maxGroups {
		if pp.Matching, err = admin.CountParked(ctx, h.cfg.DB, t, af); err != nil {
			rq.dbFail(err)
			return pp, false
		}
	}
	if len(pp.Events) > h.cfg.PageSize {
		pp.Events = pp.Events[:h.cfg.PageSize]
		pp.Next = pp.Events[len(pp.Events)-1].ID
	}
	return pp, true
}

func (h *Handler) apiParked(rq *request) {
	if pp, ok := h.parked(rq); ok {
		rq.json(pp)
	}
}

func (h *Handler) pageParked(rq *request) {
	if pp, ok := h.parked(rq); ok {
		rq.page(http.StatusOK, "parked", pp)
	}
}

// eventPage is the JSON of /api/event.
type eventPage struct {
	Table string   `json:"table"`
	Event eventRow `json:"event"`
	// Payload is the payload indented; TraceURL the trace's link, if
	// Config.TraceURL is set.
	Payload  string `json:"payload_pretty"`
	TraceURL string `json:"trace_url,omitempty"`
}

func (h *Handler) event(rq *request) (eventPage, bool) {
	t, ok := rq.table()
	if !ok {
		return eventPage{}, false
	}
	id, err := uuid.Parse(strings.TrimSpace(rq.FormValue("id")))
	if err != nil {
		rq.fail(http.StatusBadRequest, "id is not an event id (a UUID)")
		return eventPage{}, false
	}
	e, err := getEvent(rq.Context(), h.cfg.DB, t, id)
	switch {
	case errors.Is(err, admin.ErrNotFound):
		rq.fail(http.StatusNotFound, "no event "+id.String()+" in "+t.String()+" (never written, deleted, or cleaned up after its retention)")
		return eventPage{}, false
	case err != nil:
		rq.dbFail(err)
		return eventPage{}, false
	}
	ep := eventPage{Table: t.String(), Event: e, Payload: prettyJSON(e.Payload)}
	if e.TraceID != "" && h.cfg.TraceURL != "" {
		ep.TraceURL = strings.ReplaceAll(h.cfg.TraceURL, "{trace_id}", e.TraceID)
	}
	return ep, true
}

func (h *Handler) apiEvent(rq *request) {
	if ep, ok := h.event(rq); ok {
		rq.json(ep)
	}
}

func (h *Handler) pageEvent(rq *request) {
	if ep, ok := h.event(rq); ok {
		rq.page(http.StatusOK, "event", ep)
	}
}

// inboxPage is the JSON of /api/inbox: the inbox's parked records by
// consumer, topic and error type, and one page of those that match.
type inboxPage struct {
	Inbox   string                      `json:"inbox"`
	Filter  inboxFilter                 `json:"filter"`
	Groups  []tablesql.InboxParkedCount `json:"groups"`
	Records []tablesql.InboxParked      `json:"records"`
	After   int64                       `json:"after"`
	Next    int64                       `json:"next"`
}

// inboxFilter filters an inbox's parked records (parameters consumer,
// topic, error_type, event_id).
type inboxFilter struct {
	Consumer  string `json:"consumer,omitempty"`
	Topic     string `json:"topic,omitempty"`
	ErrorType string `json:"error_type,omitempty"`
	EventID   string `json:"event_id,omitempty"`
}

func (h *Handler) inboxParked(rq *request) (inboxPage, bool) {
	t, ok := rq.inbox()
	if !ok {
		return inboxPage{}, false
	}
	ip := inboxPage{Inbox: t.String(), Filter: inboxFilter{Consumer: rq.FormValue("consumer"), Topic: rq.FormValue("topic"),
		ErrorType: rq.FormValue("error_type"), EventID: strings.TrimSpace(rq.FormValue("event_id"))}}
	ip.After, _ = strconv.ParseInt(rq.FormValue("after"), 10, 64)
	var err error
	if ip.Groups, err = tablesql.CountInboxParked(rq.Context(), h.cfg.DB, t); err != nil {
		rq.dbFail(err)
		return ip, false
	}
	if ip.Records, err = listInboxParked(rq.Context(), h.cfg.DB, t, ip.Filter, max(ip.After, 0), h.cfg.PageSize+1); err != nil {
		rq.dbFail(err)
		return ip, false
	}
	if len(ip.Records) > h.cfg.PageSize {
		ip.Records = ip.Records[:h.cfg.PageSize]
		ip.Next = ip.Records[len(ip.Records)-1].ID
	}
	return ip, true
}

func (h *Handler) apiInbox(rq *request) {
	if ip, ok := h.inboxParked(rq); ok {
		rq.json(ip)
	}
}

func (h *Handler) pageInbox(rq *request) {
	if ip, ok := h.inboxParked(rq); ok {
		rq.page(http.StatusOK, "inbox", ip)
	}
}

// recordPage is the JSON of /api/inbox-record.
type recordPage struct {
	Inbox  string               `json:"inbox"`
	Record tablesql.InboxParked `json:"record"`
	// Key and Value are the record's as text (indented when JSON).
	Key   string `json:"key_text"`
	Value string `json:"value_text"`
}

func (h *Handler) record(rq *request) (recordPage, bool) {
	t, ok := rq.inbox()
	if !ok {
		return recordPage{}, false
	}
	id, err := strconv.ParseInt(rq.FormValue("id"), 10, 64)
	if err != nil {
		rq.fail(http.StatusBadRequest, "id is not a parked record's id")
		return recordPage{}, false
	}
	p, err := tablesql.GetInboxParked(rq.Context(), h.cfg.DB, t, "", id)
	switch {
	case errors.Is(err, admin.ErrNotFound):
		rq.fail(http.StatusNotFound, "no parked record "+strconv.FormatInt(id, 10)+" (retried or deleted)")
		return recordPage{}, false
	case err != nil:
		rq.dbFail(err)
		return recordPage{}, false
	}
	return recordPage{Inbox: t.String(), Record: p, Key: printable(p.Key), Value: prettyJSON(p.Value)}, true
}

func (h *Handler) apiRecord(rq *request) {
	if rp, ok := h.record(rq); ok {
		rq.json(rp)
	}
}

func (h *Handler) pageRecord(rq *request) {
	if rp, ok := h.record(rq); ok {
		rq.page(http.StatusOK, "record", rp)
	}
}

// ago is a short age: 3s, 5m, 2h, 4d.
func ago(t time.Time) string {
	if t.IsZero() {
		return ""
	}
	d := time.Since(t)
	switch {
	case d < 0:
		return "in the future"
	case d < time.Minute:
		return strconv.Itoa(int(d.Seconds())) + "s ago"
	case d < time.Hour:
		return strconv.Itoa(int(d.Minutes())) + "m ago"
	case d < 48*time.Hour:
		return strconv.Itoa(int(d.Hours())) + "h ago"
	}
	return strconv.Itoa(int(d.Hours()/24)) + "d ago"
}
