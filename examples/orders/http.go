package orders

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
	"go.uber.org/fx"

	"github.com/fxoutbox/outbox"
	"github.com/fxoutbox/outbox/relay"
	"github.com/fxoutbox/outbox/unitofwork"
)

// Event types (outbox.Event.Type, the x-event-type header) and the aggregate
// type. With the service name "order-service" they go to the topics
// "order-service.order.created" and "order-service.order.confirmed".
const (
	EventOrderCreated   = "order.created.v1"
	EventOrderConfirmed = "order.confirmed.v1"
	AggregateOrder      = "Order"
)

// OrderEvent is the JSON payload of both events, with the fields of the
// spec's ConfirmOrderHandler. EventID equals the outbox event id (the
// x-event-id header), so a consumer may deduplicate by either.
type OrderEvent struct {
	EventID       string    `json:"eventId"`
	EventType     string    `json:"eventType"` // "OrderCreated.v1" or "OrderConfirmed.v1"
	OccurredAt    time.Time `json:"occurredAt"`
	AggregateType string    `json:"aggregateType"` // "Order"
	AggregateID   string    `json:"aggregateId"`   // the order id
	CustomerID    string    `json:"customerId"`
	TotalAmount   Amount    `json:"totalAmount"`
}

// orderEvent builds the outbox event for o. Its id is chosen here so that
// the payload's eventId and the x-event-id header agree.
func orderEvent(o Order, typ, payloadType string, at time.Time) (outbox.Event, error) {
	id, err := uuid.NewV7()
	if err != nil {
		return outbox.Event{}, err
	}
	return outbox.Event{
		ID:            id,
		AggregateType: AggregateOrder,
		AggregateID:   o.ID,
		Type:          typ,
		Payload: OrderEvent{
			EventID:       id.String(),
			EventType:     payloadType,
			OccurredAt:    at.UTC(),
			AggregateType: AggregateOrder,
			AggregateID:   o.ID,
			CustomerID:    o.CustomerID,
			TotalAmount:   o.TotalAmount,
		},
	}, nil
}

// Server is the HTTP API.
type Server struct {
	srv  *http.Server
	addr string
}

// URL returns the server's base URL, e.g. "http://127.0.0.1:8080", once
// the application has started.
func (s *Server) URL() string { return "http://" + s.addr }

// Handler returns the API's handler (with its tracing middleware).
func (s *Server) Handler() http.Handler { return s.srv.Handler }

type serverParams struct {
	fx.In

	Lifecycle fx.Lifecycle
	Config    Config
	Pool      *pgxpool.Pool
	UoW       *unitofwork.UnitOfWork
	Relay     *relay.Relay
	Store     *store
	Tracing   trace.TracerProvider
	Prop      propagation.TextMapPropagator
	Metrics   metricsHandler
	Logger    *slog.Logger
}

// api holds the handlers' dependencies.
type api struct {
	pool   *pgxpool.Pool
	uow    *unitofwork.UnitOfWork
	relay  *relay.Relay
	store  *store
	maxAge time.Duration
	log    *slog.Logger
}

func newServer(p serverParams) *Server {
	a := &api{pool: p.Pool, uow: p.UoW, relay: p.Relay, store: p.Store, maxAge: p.Config.MaxBacklogAge, log: p.Logger}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /orders", a.create)
	mux.HandleFunc("GET /orders/{id}", a.get)
	mux.HandleFunc("POST /orders/{id}/confirm", a.confirm)
	mux.HandleFunc("GET /healthz", a.healthz)
	mux.Handle("GET /metrics", p.Metrics)
	s := &Server{
		srv: &http.Server{
			Handler:           traced(p.Tracing, p.Prop, mux),
			ReadHeaderTimeout: 5 * time.Second,
			ErrorLog:          slog.NewLogLogger(p.Logger.Handler(), slog.LevelWarn),
		},
		addr: p.Config.HTTPAddr,
	}
	p.Lifecycle.Append(fx.Hook{
		OnStart: func(context.Context) error {
			// Listen here, not in the goroutine: a taken port fails the start.
			ln, err := net.Listen("tcp", p.Config.HTTPAddr)
			if err != nil {
				return fmt.Errorf("orders: listen on %s: %w", p.Config.HTTPAddr, err)
			}
			s.addr = ln.Addr().String()
			go func() {
				if err := s.srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
					p.Logger.Error("orders: HTTP server failed", "error", err)
				}
			}()
			p.Logger.Info("orders: HTTP API listening", "url", s.URL())
			return nil
		},
		// Stopped first (hooks stop in reverse order): requests in flight
		// finish, then the consumer and the relay stop.
		OnStop: s.srv.Shutdown,
	})
	return s
}

var errNotFound = errors.New("order not found")

// conflictError is answered with 409 and its text.
type conflictError struct{ msg string }

func (e *conflictError) Error() string { return e.msg }

func conflict(format string, args ...any) error {
	return &conflictError{fmt.Sprintf(format, args...)}
}

type createRequest struct {
	ID          string `json:"id"` // optional UUID; default a new UUIDv7
	CustomerID  string `json:"customerId"`
	TotalAmount Amount `json:"totalAmount"`
}

// create handles POST /orders: it inserts the order and records
// order.created.v1 in the same transaction.
func (a *api) create(w http.ResponseWriter, r *http.Request) {
	var req createRequest
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, 64<<10))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil {
		writeError(w, http.StatusBadRequest, "invalid request body: "+err.Error())
		return
	}
	req.CustomerID = strings.TrimSpace(req.CustomerID)
	switch {
	case req.CustomerID == "" || len(req.CustomerID) > 100:
		writeError(w, http.StatusBadRequest, "customerId is required (at most 100 characters)")
		return
	case req.TotalAmount == "":
		writeError(w, http.StatusBadRequest, `totalAmount is required, e.g. "49.90"`)
		return
	}
	id := req.ID
	if id == "" {
		u, err := uuid.NewV7()
		if err != nil {
			a.fail(w, r, err)
			return
		}
		id = u.String()
	} else if u, err := uuid.Parse(id); err != nil {
		writeError(w, http.StatusBadRequest, "id must be a UUID")
		return
	} else {
		id = u.String()
	}

	var created Order
	err := a.uow.Do(r.Context(), func(ctx context.Context, tx unitofwork.Tx) error {
		o, err := a.store.insert(ctx, tx, id, req.CustomerID, req.TotalAmount)
		if errors.Is(err, pgx.ErrNoRows) {
			return conflict("order %s already exists", id)
		}
		if err != nil {
			return err
		}
		ev, err := orderEvent(o, EventOrderCreated, "OrderCreated.v1", o.CreatedAt)
		if err != nil {
			return err
		}
		if err := tx.Add(ctx, ev); err != nil {
			return err
		}
		created = o
		return nil
	})
	if err != nil {
		a.fail(w, r, err)
		return
	}
	w.Header().Set("Location", "/orders/"+created.ID)
	writeJSON(w, http.StatusCreated, created)
}

// confirm handles POST /orders/{id}/confirm like the spec's
// ConfirmOrderHandler: in one transaction it locks the order row, checks
// that the order can be confirmed, updates it and records
// order.confirmed.v1. A missing order is 404 and an order that is not
// pending 409; both roll back and record nothing.
func (a *api) confirm(w http.ResponseWriter, r *http.Request) {
	id, ok := orderID(r)
	if !ok {
		writeError(w, http.StatusNotFound, errNotFound.Error())
		return
	}
	var confirmed Order
	err := a.uow.Do(r.Context(), func(ctx context.Context, tx unitofwork.Tx) error {
		o, err := a.store.lockOrder(ctx, tx, id)
		if errors.Is(err, pgx.ErrNoRows) {
			return errNotFound
		}
		if err != nil {
			return err
		}
		if o.Status != StatusPending {
			return conflict("order %s is %s: only a %s order can be confirmed", id, o.Status, StatusPending)
		}
		if o, err = a.store.confirm(ctx, tx, id); err != nil {
			return err
		}
		ev, err := orderEvent(o, EventOrderConfirmed, "OrderConfirmed.v1", *o.ConfirmedAt)
		if err != nil {
			return err
		}
		if err := tx.Add(ctx, ev); err != nil {
			return err
		}
		confirmed = o
		return nil
	})
	if err != nil {
		a.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, confirmed)
}

// get handles GET /orders/{id}.
func (a *api) get(w http.ResponseWriter, r *http.Request) {
	id, ok := orderID(r)
	if !ok {
		writeError(w, http.StatusNotFound, errNotFound.Error())
		return
	}
	o, err := a.store.get(r.Context(), a.pool, id)
	if errors.Is(err, pgx.ErrNoRows) {
		err = errNotFound
	}
	if err != nil {
		a.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, o)
}

// healthz handles GET /healthz: 200 while the relay runs, the database and
// the broker answer and the oldest unpublished event is younger than
// MaxBacklogAge; 503 with the failed check otherwise.
func (a *api) healthz(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), 3*time.Second)
	defer cancel()
	if err := a.relay.Health(ctx, a.maxAge); err != nil {
		writeJSON(w, http.StatusServiceUnavailable, map[string]string{"status": "unavailable", "reason": err.Error()})
		return
	}
	writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
}

// orderID returns the {id} path value in canonical UUID form; a value that
// is not a UUID names no order.
func orderID(r *http.Request) (string, bool) {
	u, err := uuid.Parse(r.PathValue("id"))
	if err != nil {
		return "", false
	}
	return u.String(), true
}

// fail answers an error: 404 and 409 with their reason, 500 (logged with the
// request's trace id) for anything else.
func (a *api) fail(w http.ResponseWriter, r *http.Request, err error) {
	var ce *conflictError
	switch {
	case errors.Is(err, errNotFound):
		writeError(w, http.StatusNotFound, err.Error())
	case errors.As(err, &ce):
		writeError(w, http.StatusConflict, err.Error())
	case errors.Is(err, context.Canceled) && r.Context().Err() != nil:
		// The client went away; nothing was committed.
	default:
		a.log.Error("orders: request failed", "method", r.Method, "path", r.URL.Path,
			"trace_id", trace.SpanContextFromContext(r.Context()).TraceID().String(), "error", err)
		writeError(w, http.StatusInternalServerError, "internal error")
	}
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

func writeError(w http.ResponseWriter, status int, msg string) {
	writeJSON(w, status, map[string]string{"error": msg})
}
