package adminui

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"

	"github.com/fxoutbox/outbox"
	"github.com/fxoutbox/outbox/admin"
)

// actionRequest is the body of POST api/count and api/actions: an action
// on one event, a selection, or everything that matches a filter, chosen
// on the server (not only the rows a page shows).
type actionRequest struct {
	// Action is requeue, delete or replay for an outbox table; delete for
	// an inbox's parked records (retrying runs the application's handler:
	// inbox.Consumer.Retry, in the consuming service).
	Action string `json:"action"`
	// Table names the outbox table; Inbox an inbox table instead.
	Table string `json:"table,omitempty"`
	Inbox string `json:"inbox,omitempty"`
	// EventIDs (outbox) or IDs (inbox records) select rows. When both are
	// empty, Matching must be set: the action is on every row that matches
	// Filter (or InboxFilter), every row when the filter is empty.
	EventIDs    []string    `json:"event_ids,omitempty"`
	IDs         []int64     `json:"ids,omitempty"`
	Matching    bool        `json:"matching,omitempty"`
	Filter      eventFilter `json:"filter"`
	InboxFilter inboxFilter `json:"inbox_filter"`
}

// bulkJob is a running or finished action, as api/jobs/{id} reports it.
type bulkJob struct {
	ID     string `json:"id"`
	Action string `json:"action"`
	Table  string `json:"table"`
	// Filter is what the action works on, as the audit line says it.
	Filter string `json:"filter"`
	Who    string `json:"who"`
	Role   string `json:"role"`
	// Total is the count taken before the action started; Done the rows
	// changed so far.
	Total int `json:"total"`
	Done  int `json:"done"`
	// State is running, done or failed.
	State   string     `json:"state"`
	Error   string     `json:"error,omitempty"`
	Started time.Time  `json:"started"`
	Ended   *time.Time `json:"ended,omitempty"`
}

// jobs keeps the actions of the last while.
type jobs struct {
	mu    sync.Mutex
	byID  map[string]*bulkJob
	order []string
}

const (
	maxJobsKept    = 200
	maxJobsRunning = 4
)

func (js *jobs) add(j *bulkJob) error {
	js.mu.Lock()
	defer js.mu.Unlock()
	running := 0
	for _, o := range js.byID {
		if o.State == "running" {
			running++
		}
	}
	if running >= maxJobsRunning {
		return errors.New("too many actions are running: wait for one to finish")
	}
	for len(js.order) >= maxJobsKept {
		if old := js.byID[js.order[0]]; old != nil && old.State == "running" {
			break
		}
		delete(js.byID, js.order[0])
		js.order = js.order[1:]
	}
	js.byID[j.ID] = j
	js.order = append(js.order, j.ID)
	return nil
}

func (js *jobs) get(id string) (bulkJob, bool) {
	js.mu.Lock()
	defer js.mu.Unlock()
	j, ok := js.byID[id]
	if !ok {
		return bulkJob{}, false
	}
	return *j, true
}

func (js *jobs) update(j *bulkJob, f func(*bulkJob)) {
	js.mu.Lock()
	defer js.mu.Unlock()
	f(j)
}

// op is an action resolved against the configuration: what it counts and
// what it runs.
type op struct {
	table, filter string
	count         func(ctx context.Context) (int, error)
	run           func(ctx context.Context, progress func(int)) (int, error)
}

// resolve checks an action request and returns its op, or an error for a
// 400 answer.
func (h *Handler) resolve(a actionRequest) (op, error) {
	if a.Inbox != "" {
		return h.resolveInbox(a)
	}
	var t outbox.Table
	found := false
	for _, c := range h.cfg.Tables {
		if a.Table == c.String() || a.Table == "" && !found {
			t, found = c, true
		}
	}
	if !found {
		return op{}, errors.New("no such table")
	}
	var f admin.Filter
	o := op{table: t.String()}
	switch {
	case len(a.EventIDs) > 0:
		for _, s := range a.EventIDs {
			id, err := uuid.Parse(strings.TrimSpace(s))
			if err != nil {
				return o, fmt.Errorf("%q is not an event id", s)
			}
			f.EventIDs = append(f.EventIDs, id)
		}
		o.filter = fmt.Sprintf("%d selected events", len(f.EventIDs))
		if len(f.EventIDs) <= 10 {
			o.filter = "events " + strings.Join(a.EventIDs, ",")
		}
	case a.Matching:
		var err error
		if f, err = a.Filter.admin(); err != nil {
			return o, err
		}
		f.All = true
		o.filter = "matching " + a.Filter.String()
	default:
		return o, errors.New("name event_ids, or set matching to act on everything matching the filter")
	}
	bulk := &admin.BulkOptions{ChunkSize: h.cfg.ChunkSize}
	db := h.cfg.DB
	o.count = func(ctx context.Context) (int, error) { return admin.CountParked(ctx, db, t, f) }
	withProgress := func(p func(int)) *admin.BulkOptions { b := *bulk; b.Progress = p; return &b }
	switch a.Action {
	case "requeue":
		o.run = func(ctx context.Context, p func(int)) (int, error) {
			return admin.Requeue(ctx, db, t, f, withProgress(p))
		}
	case "delete":
		o.run = func(ctx context.Context, p func(int)) (int, error) {
			return admin.Delete(ctx, db, t, f, withProgress(p))
		}
	case "replay":
		if a.Filter.Reason != "" {
			return o, errors.New("replay works on published events, which have no reason: filter by topic, type, key or event id")
		}
		o.count = func(ctx context.Context) (int, error) { return admin.CountPublished(ctx, db, t, f) }
		o.run = func(ctx context.Context, p func(int)) (int, error) {
			return admin.Replay(ctx, db, t, f, withProgress(p))
		}
	default:
		return o, fmt.Errorf("unknown action %q: use requeue, delete or replay", a.Action)
	}
	return o, nil
}

func (h *Handler) resolveInbox(a actionRequest) (op, error) {
	var t outbox.Table
	found := false
	for _, c := range h.cfg.Inboxes {
		if a.Inbox == c.String() {
			t, found = c, true
		}
	}
	if !found {
		return op{}, errors.New("no such inbox table")
	}
	if a.Action != "delete" {
		return op{}, errors.New("an inbox's parked records can only be deleted here: retrying runs the application's handler, in the consuming service (inbox Consumer.Retry)")
	}
	f, ids := a.InboxFilter, a.IDs
	o := op{table: t.String()}
	switch {
	case len(ids) > 0:
		f = inboxFilter{}
		o.filter = fmt.Sprintf("records %v", ids)
	case a.Matching:
		ids = nil
		b, _ := json.Marshal(f)
		o.filter = "matching " + string(b)
	default:
		return o, errors.New("name ids, or set matching to act on everything matching the filter")
	}
	db, chunk := h.cfg.DB, h.cfg.ChunkSize
	o.count = func(ctx context.Context) (int, error) { return countInboxParked(ctx, db, t, f, ids) }
	o.run = func(ctx context.Context, p func(int)) (int, error) {
		return deleteInboxParked(ctx, db, t, f, ids, chunk, p)
	}
	return o, nil
}

func (h *Handler) readAction(rq *request) (actionRequest, op, bool) {
	var a actionRequest
	dec := json.NewDecoder(http.MaxBytesReader(rq.w, rq.Body, 1<<20))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&a); err != nil {
		rq.fail(http.StatusBadRequest, "the body is not an action: "+err.Error())
		return a, op{}, false
	}
	o, err := h.resolve(a)
	if err != nil {
		rq.fail(http.StatusBadRequest, err.Error())
		return a, o, false
	}
	return a, o, true
}

// apiCount answers how many rows an action would change, for its
// confirmation. Reading suffices.
func (h *Handler) apiCount(rq *request) {
	_, o, ok := h.readAction(rq)
	if !ok {
		return
	}
	n, err := o.count(rq.Context())
	if err != nil {
		rq.dbFail(err)
		return
	}
	rq.json(map[string]any{"count": n, "table": o.table, "filter": o.filter})
}

// apiAction starts an action as a job and answers 202 with it; the page
// polls api/jobs/{id} for its progress. Only RoleOperate may.
func (h *Handler) apiAction(rq *request) {
	if rq.p.Role != RoleOperate {
		h.cfg.Logger.Warn("adminui: action refused", "who", rq.p.Name, "role", rq.p.Role.String(), "path", rq.path)
		rq.fail(http.StatusForbidden, "forbidden: "+rq.p.Name+" may read but not act (role "+rq.p.Role.String()+")")
		return
	}
	a, o, ok := h.readAction(rq)
	if !ok {
		return
	}
	total, err := o.count(rq.Context())
	if err != nil {
		rq.dbFail(err)
		return
	}
	idb := make([]byte, 8)
	_, _ = rand.Read(idb)
	j := &bulkJob{ID: hex.EncodeToString(idb), Action: a.Action, Table: o.table, Filter: o.filter, Who: rq.p.Name, Role: rq.p.Role.String(),
		Total: total, State: "running", Started: time.Now()}
	if a.Inbox != "" {
		j.Action = "inbox " + a.Action
	}
	if err := h.jobs.add(j); err != nil {
		rq.fail(http.StatusTooManyRequests, err.Error())
		return
	}
	h.wg.Add(1)
	go func() {
		defer h.wg.Done()
		n, err := o.run(h.ctx, func(done int) { h.jobs.update(j, func(j *bulkJob) { j.Done = done }) })
		// The audit line is written before the job shows its end: whoever
		// sees the job done or failed finds its line in the log.
		var snap bulkJob
		h.jobs.update(j, func(j *bulkJob) { snap = *j })
		now := time.Now()
		snap.Done, snap.Ended, snap.State = n, &now, "done"
		if err != nil {
			snap.State, snap.Error = "failed", err.Error()
		}
		h.audit(&snap)
		h.jobs.update(j, func(j *bulkJob) { j.Done, j.Ended, j.State, j.Error = snap.Done, snap.Ended, snap.State, snap.Error })
	}()
	snap, _ := h.jobs.get(j.ID)
	rq.w.Header().Set("Content-Type", "application/json")
	rq.w.WriteHeader(http.StatusAccepted)
	rq.json(snap)
}

func (h *Handler) apiJob(rq *request, id string) {
	j, ok := h.jobs.get(id)
	if !ok {
		rq.fail(http.StatusNotFound, "no such job")
		return
	}
	rq.json(j)
}
