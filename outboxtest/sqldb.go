package outboxtest

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
)

// RecordingDB is a [DBTX] for unit tests that records the SQL a handler
// runs, so that a test can assert on it with neither a database nor a mock
// library: pass it as [RecorderConfig.DB], run the handler, and check the
// statements with [RequireSQL], [RequireNoSQL] and [RequireRolledBack].
//
// Each statement is answered by the first rule set with [RecordingDB.On]
// whose text it contains; with none, Exec succeeds with no row affected,
// Query returns no rows and QueryRow's Scan returns pgx.ErrNoRows (with
// Strict, each fails with [ErrUnexpectedSQL] instead).
//
// It begins transactions as a database does (Begin; a savepoint on one of
// its transactions), and so does a Recorder's Do on it, once per call:
// the statements of a transaction that rolls back, such as those of a Do
// whose function returned an error, stay in [RecordingDB.Calls] marked
// RolledBack, and RequireSQL does not count them, as a database would not
// keep their rows. The zero value is ready; it is safe for concurrent use.
type RecordingDB struct {
	// Strict fails every statement that no rule matches with
	// ErrUnexpectedSQL. Default false: such statements succeed, empty.
	Strict bool

	mu    sync.Mutex
	rules []sqlRule
	calls []recordedCall
}

// ErrUnexpectedSQL is the error of a statement no rule of a strict
// RecordingDB matches.
var ErrUnexpectedSQL = errors.New("outboxtest: no RecordingDB.On rule matches the statement (the RecordingDB is Strict)")

// SQLResult is what a RecordingDB answers to the statements of a rule.
type SQLResult struct {
	// RowsAffected is Exec's count, in a command tag named after the
	// statement's first word ("INSERT 0 1", "UPDATE 3"). Default 0.
	RowsAffected int64
	// Columns and Rows are what Query and QueryRow return: one []any per
	// row, one value per column. Scan assigns each value to its
	// destination when its type is assignable or, between numbers or
	// between strings and byte slices, convertible; nil is NULL (a nil
	// pointer, or the zero value of an interface, slice or map; an error
	// for other types, as pgx gives). A destination that is an
	// sql.Scanner scans the value itself. Default: no rows.
	Columns []string
	Rows    [][]any
	// Err fails the statement: Exec, Query and CopyFrom return it,
	// QueryRow's Scan does. Default nil.
	Err error
}

// SQLCall is a statement a RecordingDB ran.
type SQLCall struct {
	// Method is Exec, Query, QueryRow, CopyFrom or SendBatch (one call per
	// queued statement).
	Method string
	// SQL is the statement as given; for CopyFrom, "COPY <table>
	// (<columns>) FROM STDIN".
	SQL string
	// Args are its arguments; for CopyFrom, its rows, each a []any.
	Args []any
	// RolledBack says it ran in a transaction that rolled back (or inside
	// a savepoint that did): a Recorder's Do whose function returned an
	// error, or a transaction of the code's own. A database would not
	// keep what it wrote.
	RolledBack bool
}

func (c SQLCall) String() string {
	s := c.Method + " " + oneLine(c.SQL)
	if len(c.Args) > 0 {
		s += fmt.Sprintf(" %v", c.Args)
	}
	if c.RolledBack {
		s += " (rolled back)"
	}
	return s
}

type sqlRule struct {
	sql    string // normalized
	result SQLResult
}

// recordedCall is a call and the transaction it ran in (nil: none).
type recordedCall struct {
	SQLCall
	in *recordingTx
}

var _ DBTX = (*RecordingDB)(nil)

// On answers the statements whose text contains sql (white space runs
// compared as one space, case ignored) with result, unless an earlier rule
// matches them. It returns db, so rules chain.
func (db *RecordingDB) On(sql string, result SQLResult) *RecordingDB {
	db.mu.Lock()
	defer db.mu.Unlock()
	db.rules = append(db.rules, sqlRule{sql: normSQL(sql), result: result})
	return db
}

// Calls returns every statement run so far, in order, those rolled back
// included (marked).
func (db *RecordingDB) Calls() []SQLCall {
	db.mu.Lock()
	defer db.mu.Unlock()
	out := make([]SQLCall, len(db.calls))
	for i, c := range db.calls {
		out[i] = c.SQLCall
		out[i].RolledBack = c.in.rolledBack()
	}
	return out
}

// Reset forgets the recorded statements; the rules stay.
func (db *RecordingDB) Reset() {
	db.mu.Lock()
	db.calls = nil
	db.mu.Unlock()
}

// run records a call made in tx (nil: outside a transaction) and returns
// the result of its rule.
func (db *RecordingDB) run(tx *recordingTx, method, sql string, args []any) SQLResult {
	db.mu.Lock()
	defer db.mu.Unlock()
	db.calls = append(db.calls, recordedCall{SQLCall: SQLCall{Method: method, SQL: sql, Args: args}, in: tx})
	n := normSQL(sql)
	for _, r := range db.rules {
		if strings.Contains(n, r.sql) {
			return r.result
		}
	}
	if db.Strict {
		return SQLResult{Err: fmt.Errorf("%w: %s %s", ErrUnexpectedSQL, method, oneLine(sql))}
	}
	return SQLResult{}
}

func (db *RecordingDB) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	return db.exec(nil, sql, args)
}

func (db *RecordingDB) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	return db.query(nil, "Query", sql, args)
}

func (db *RecordingDB) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	return db.queryRow(nil, "QueryRow", sql, args)
}

func (db *RecordingDB) CopyFrom(ctx context.Context, table pgx.Identifier, columns []string, src pgx.CopyFromSource) (int64, error) {
	return db.copyFrom(nil, table, columns, src)
}

func (db *RecordingDB) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	return db.sendBatch(nil, b)
}

// Begin starts a transaction whose statements are marked RolledBack when
// it rolls back.
func (db *RecordingDB) Begin(context.Context) (pgx.Tx, error) {
	return &recordingTx{db: db}, nil
}

func (db *RecordingDB) exec(tx *recordingTx, sql string, args []any) (pgconn.CommandTag, error) {
	res := db.run(tx, "Exec", sql, args)
	if res.Err != nil {
		return pgconn.CommandTag{}, res.Err
	}
	return commandTag(sql, res.RowsAffected), nil
}

func (db *RecordingDB) query(tx *recordingTx, method, sql string, args []any) (pgx.Rows, error) {
	res := db.run(tx, method, sql, args)
	if res.Err != nil {
		return nil, res.Err
	}
	return &recordedRows{cols: res.Columns, data: res.Rows}, nil
}

func (db *RecordingDB) queryRow(tx *recordingTx, method, sql string, args []any) pgx.Row {
	rows, err := db.query(tx, method, sql, args)
	if err != nil {
		return errRow{err}
	}
	return recordedRow{rows.(*recordedRows)}
}

func (db *RecordingDB) copyFrom(tx *recordingTx, table pgx.Identifier, columns []string, src pgx.CopyFromSource) (int64, error) {
	var rows []any
	for src.Next() {
		v, err := src.Values()
		if err != nil {
			return 0, err
		}
		rows = append(rows, v)
	}
	if err := src.Err(); err != nil {
		return 0, err
	}
	cols := make([]string, len(columns))
	for i, c := range columns {
		cols[i] = pgx.Identifier{c}.Sanitize()
	}
	res := db.run(tx, "CopyFrom", "COPY "+table.Sanitize()+" ("+strings.Join(cols, ", ")+") FROM STDIN", rows)
	if res.Err != nil {
		return 0, res.Err
	}
	return int64(len(rows)), nil
}

func (db *RecordingDB) sendBatch(tx *recordingTx, b *pgx.Batch) pgx.BatchResults {
	br := &recordedBatch{}
	for _, q := range b.QueuedQueries {
		br.results = append(br.results, db.run(tx, "SendBatch", q.SQL, q.Arguments))
	}
	return br
}

// recordingTx is a transaction of a RecordingDB (a savepoint when parent
// is set).
type recordingTx struct {
	db     *RecordingDB
	parent *recordingTx

	mu   sync.Mutex
	done bool
	back bool // rolled back
}

var _ pgx.Tx = (*recordingTx)(nil)

// rolledBack reports whether x or a transaction it is in rolled back.
func (x *recordingTx) rolledBack() bool {
	for ; x != nil; x = x.parent {
		x.mu.Lock()
		back := x.back
		x.mu.Unlock()
		if back {
			return true
		}
	}
	return false
}

func (x *recordingTx) end(back bool) error {
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.done {
		return pgx.ErrTxClosed
	}
	x.done, x.back = true, back
	return nil
}

// closed returns pgx.ErrTxClosed once x has ended, as pgx does.
func (x *recordingTx) closed() error {
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.done {
		return pgx.ErrTxClosed
	}
	return nil
}

func (x *recordingTx) Begin(context.Context) (pgx.Tx, error) {
	if err := x.closed(); err != nil {
		return nil, err
	}
	return &recordingTx{db: x.db, parent: x}, nil
}

func (x *recordingTx) Commit(context.Context) error   { return x.end(false) }
func (x *recordingTx) Rollback(context.Context) error { return x.end(true) }

func (x *recordingTx) Exec(_ context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	if err := x.closed(); err != nil {
		return pgconn.CommandTag{}, err
	}
	return x.db.exec(x, sql, args)
}

func (x *recordingTx) Query(_ context.Context, sql string, args ...any) (pgx.Rows, error) {
	if err := x.closed(); err != nil {
		return nil, err
	}
	return x.db.query(x, "Query", sql, args)
}

func (x *recordingTx) QueryRow(_ context.Context, sql string, args ...any) pgx.Row {
	if err := x.closed(); err != nil {
		return errRow{err}
	}
	return x.db.queryRow(x, "QueryRow", sql, args)
}

func (x *recordingTx) CopyFrom(_ context.Context, table pgx.Identifier, columns []string, src pgx.CopyFromSource) (int64, error) {
	if err := x.closed(); err != nil {
		return 0, err
	}
	return x.db.copyFrom(x, table, columns, src)
}

func (x *recordingTx) SendBatch(_ context.Context, b *pgx.Batch) pgx.BatchResults {
	if err := x.closed(); err != nil {
		return errBatch{err}
	}
	return x.db.sendBatch(x, b)
}

func (x *recordingTx) LargeObjects() pgx.LargeObjects { return pgx.LargeObjects{} }

func (x *recordingTx) Prepare(context.Context, string, string) (*pgconn.StatementDescription, error) {
	return nil, errors.New("outboxtest: a RecordingDB does not prepare statements")
}

func (x *recordingTx) Conn() *pgx.Conn { return nil }

// recordedRows are the rows of a rule.
type recordedRows struct {
	cols   []string
	data   [][]any
	i      int // 1-based current row
	err    error
	closed bool
}

var _ pgx.Rows = (*recordedRows)(nil)

func (r *recordedRows) Close()     { r.closed = true }
func (r *recordedRows) Err() error { return r.err }

func (r *recordedRows) CommandTag() pgconn.CommandTag {
	return pgconn.NewCommandTag(fmt.Sprintf("SELECT %d", len(r.data)))
}

func (r *recordedRows) FieldDescriptions() []pgconn.FieldDescription {
	fds := make([]pgconn.FieldDescription, len(r.cols))
	for i, c := range r.cols {
		fds[i] = pgconn.FieldDescription{Name: c}
	}
	return fds
}

func (r *recordedRows) Next() bool {
	if r.closed || r.err != nil || r.i >= len(r.data) {
		r.closed = true
		return false
	}
	r.i++
	return true
}

func (r *recordedRows) Scan(dest ...any) error {
	if r.i == 0 || r.i > len(r.data) {
		return errors.New("outboxtest: Scan without a current row (call Next first)")
	}
	row := r.data[r.i-1]
	if len(dest) != len(row) {
		r.err = fmt.Errorf("outboxtest: Scan into %d destinations, but the RecordingDB's row has %d values", len(dest), len(row))
		return r.err
	}
	for i, d := range dest {
		if err := assign(d, row[i]); err != nil {
			r.err = fmt.Errorf("outboxtest: column %d: %w", i, err)
			return r.err
		}
	}
	return nil
}

func (r *recordedRows) Values() ([]any, error) {
	if r.i == 0 || r.i > len(r.data) {
		return nil, errors.New("outboxtest: Values without a current row (call Next first)")
	}
	return r.data[r.i-1], nil
}

func (r *recordedRows) RawValues() [][]byte  { return nil }
func (r *recordedRows) Conn() *pgx.Conn      { return nil }
func (r *recordedRows) TypeMap() *pgtype.Map { return pgtype.NewMap() }

// recordedRow is QueryRow's row: the first of the rule's rows.
type recordedRow struct{ rows *recordedRows }

func (r recordedRow) Scan(dest ...any) error {
	defer r.rows.Close()
	if !r.rows.Next() {
		return pgx.ErrNoRows
	}
	return r.rows.Scan(dest...)
}

// recordedBatch serves a batch's results in order.
type recordedBatch struct {
	results []SQLResult
	i       int
}

func (b *recordedBatch) next() (SQLResult, error) {
	if b.i >= len(b.results) {
		return SQLResult{}, errors.New("outboxtest: no more results in the batch")
	}
	b.i++
	return b.results[b.i-1], nil
}

func (b *recordedBatch) Exec() (pgconn.CommandTag, error) {
	res, err := b.next()
	if err == nil {
		err = res.Err
	}
	if err != nil {
		return pgconn.CommandTag{}, err
	}
	return pgconn.NewCommandTag(fmt.Sprintf("UPDATE %d", res.RowsAffected)), nil
}

func (b *recordedBatch) Query() (pgx.Rows, error) {
	res, err := b.next()
	if err == nil {
		err = res.Err
	}
	if err != nil {
		return nil, err
	}
	return &recordedRows{cols: res.Columns, data: res.Rows}, nil
}

func (b *recordedBatch) QueryRow() pgx.Row {
	rows, err := b.Query()
	if err != nil {
		return errRow{err}
	}
	return recordedRow{rows.(*recordedRows)}
}

func (b *recordedBatch) Close() error { return nil }
func (b *recordedBatch) Tx() pgx.Tx   { return nil }

// commandTag is Exec's tag for sql: its first word and n rows, as
// PostgreSQL writes it.
func commandTag(sql string, n int64) pgconn.CommandTag {
	verb := "EXEC"
	if f := strings.Fields(sql); len(f) > 0 {
		verb = strings.ToUpper(f[0])
	}
	if verb == "INSERT" {
		return pgconn.NewCommandTag(fmt.Sprintf("INSERT 0 %d", n))
	}
	return pgconn.NewCommandTag(fmt.Sprintf("%s %d", verb, n))
}

// assign scans v into dst (see SQLResult.Rows).
func assign(dst, v any) error {
	if s, ok := dst.(sql.Scanner); ok {
		return s.Scan(v)
	}
	dv := reflect.ValueOf(dst)
	if dv.Kind() != reflect.Pointer || dv.IsNil() {
		return fmt.Errorf("cannot scan into %T: pass a non-nil pointer", dst)
	}
	e := dv.Elem()
	if v == nil {
		switch e.Kind() {
		case reflect.Pointer, reflect.Interface, reflect.Slice, reflect.Map:
			e.SetZero()
			return nil
		}
		return fmt.Errorf("cannot scan NULL into %T", dst)
	}
	vv := reflect.ValueOf(v)
	if e.Kind() == reflect.Pointer && !vv.Type().AssignableTo(e.Type()) {
		p := reflect.New(e.Type().Elem())
		if err := assign(p.Interface(), v); err != nil {
			return err
		}
		e.Set(p)
		return nil
	}
	switch {
	case vv.Type().AssignableTo(e.Type()):
		e.Set(vv)
	case number(vv.Kind()) && number(e.Kind()), text(vv.Type()) && text(e.Type()):
		e.Set(vv.Convert(e.Type()))
	default:
		return fmt.Errorf("cannot scan %T (%v) into %T", v, v, dst)
	}
	return nil
}

func number(k reflect.Kind) bool {
	return k >= reflect.Int && k <= reflect.Float64
}

func text(t reflect.Type) bool {
	return t.Kind() == reflect.String || (t.Kind() == reflect.Slice && t.Elem().Kind() == reflect.Uint8)
}

// normSQL is sql as rules and wants compare it: white space runs as one
// space, lower case.
func normSQL(sql string) string {
	return strings.ToLower(strings.Join(strings.Fields(sql), " "))
}

// oneLine is sql on one line, for messages.
func oneLine(sql string) string { return strings.Join(strings.Fields(sql), " ") }

// WantSQL describes the statements RequireSQL, RequireNoSQL and
// RequireRolledBack look for. Zero fields match anything.
type WantSQL struct {
	// SQL is text the statement contains: white space runs compared as one
	// space, case ignored.
	SQL string
	// Args, when not nil, are the statement's arguments, each equal to the
	// one given: numbers of any type by value, times by Equal, others as
	// reflect.DeepEqual.
	Args []any
}

func (w WantSQL) matches(c SQLCall) bool {
	if !strings.Contains(normSQL(c.SQL), normSQL(w.SQL)) {
		return false
	}
	if w.Args == nil {
		return true
	}
	if len(w.Args) != len(c.Args) {
		return false
	}
	for i := range w.Args {
		if !argEqual(w.Args[i], c.Args[i]) {
			return false
		}
	}
	return true
}

func (w WantSQL) String() string {
	s := fmt.Sprintf("containing %q", oneLine(w.SQL))
	if w.Args != nil {
		s += fmt.Sprintf(" with args %v", w.Args)
	}
	return s
}

func argEqual(a, b any) bool {
	if reflect.DeepEqual(a, b) {
		return true
	}
	if ta, ok := a.(time.Time); ok {
		tb, ok := b.(time.Time)
		return ok && ta.Equal(tb)
	}
	va, vb := reflect.ValueOf(a), reflect.ValueOf(b)
	if !va.IsValid() || !vb.IsValid() || !number(va.Kind()) || !number(vb.Kind()) {
		return false
	}
	return fmt.Sprint(va.Convert(reflect.TypeFor[float64]()).Float()) == fmt.Sprint(vb.Convert(reflect.TypeFor[float64]()).Float())
}

// RequireSQL fails the test unless exactly one statement db kept (not
// rolled back) matches want, and returns it. The failure lists every
// statement db ran.
func RequireSQL(t T, db *RecordingDB, want WantSQL) SQLCall {
	t.Helper()
	calls := db.Calls()
	var found []SQLCall
	for _, c := range calls {
		if !c.RolledBack && want.matches(c) {
			found = append(found, c)
		}
	}
	if len(found) != 1 {
		t.Fatalf("outboxtest: RequireSQL: want one statement %s (not rolled back), found %d; %s", want, len(found), listCalls(calls))
		return SQLCall{}
	}
	return found[0]
}

// RequireNoSQL fails the test if a statement db kept (not rolled back)
// matches want: one of a Do that returned an error does not count, as a
// database would not have kept what it wrote.
func RequireNoSQL(t T, db *RecordingDB, want WantSQL) {
	t.Helper()
	calls := db.Calls()
	for _, c := range calls {
		if !c.RolledBack && want.matches(c) {
			t.Fatalf("outboxtest: RequireNoSQL: want no statement %s that was kept, found %s; %s", want, c, listCalls(calls))
			return
		}
	}
}

// RequireRolledBack fails the test unless exactly one statement db rolled
// back matches want (one that ran in a Do whose function returned an
// error), and returns it.
func RequireRolledBack(t T, db *RecordingDB, want WantSQL) SQLCall {
	t.Helper()
	calls := db.Calls()
	var found []SQLCall
	for _, c := range calls {
		if c.RolledBack && want.matches(c) {
			found = append(found, c)
		}
	}
	if len(found) != 1 {
		t.Fatalf("outboxtest: RequireRolledBack: want one rolled-back statement %s, found %d; %s", want, len(found), listCalls(calls))
		return SQLCall{}
	}
	return found[0]
}

func listCalls(calls []SQLCall) string {
	if len(calls) == 0 {
		return "the RecordingDB ran no statement"
	}
	var b strings.Builder
	fmt.Fprintf(&b, "the RecordingDB ran %d:", len(calls))
	for i, c := range calls {
		fmt.Fprintf(&b, "\n  %d. %s", i+1, c)
	}
	return b.String()
}
