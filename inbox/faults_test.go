package inbox_test

import (
	"context"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fxoutbox/outbox/inbox"
	"github.com/fxoutbox/outbox/internal/testenv"
	"github.com/fxoutbox/outbox/unitofwork"
)

// Members join and leave a group of three while events flow: each event's
// effect happens exactly once and each key's effects are in order.
func TestRebalancesApplyEachEventOnceInKeyOrder(t *testing.T) {
	t.Parallel()
	modes(t, 6, func(t *testing.T, e *env) {
		g := group()
		member := func(name string) *inbox.Consumer {
			effect := e.effect(name)
			return e.start(e.config(g, func(ctx context.Context, tx unitofwork.Tx, m *inbox.Message) error {
				time.Sleep(time.Duration(rand.IntN(3)) * time.Millisecond) // work in flight at rebalances
				return effect(ctx, tx, m)
			}))
		}
		var all []ev
		batch := func(i int) {
			evs := events(100, 30)
			for j := range evs {
				evs[j].Seq += i * 100
			}
			all = append(all, e.produce(evs...)...)
		}
		a := member("a")
		batch(0)
		member("b")
		batch(1)
		member("c") // three members
		batch(2)
		e.waitEffects(150)
		stop(t, a) // one leaves while records are in progress
		batch(3)
		member("d") // another joins
		batch(4)
		e.waitEffects(len(all))
		e.waitCommitted(g, 6, len(all), 90*time.Second)
		e.checkOnce(all)
		var members int
		_ = e.pool.QueryRow(context.Background(), `SELECT count(DISTINCT member) FROM `+e.effects).Scan(&members)
		t.Logf("%d events applied by %d members", len(all), members)
		if members < 2 {
			t.Errorf("only %d member applied events: the group did not rebalance", members)
		}
	})
}

// PostgreSQL unreachable for a while (a proxy in front of it refuses and
// cuts connections): records are retried with backoff, nothing is parked
// even with MaxAttempts 1, and the consumer recovers by itself.
func TestDatabaseOutageParksNothing(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 2)
	px := newProxy(t)
	pool := px.pool(t)
	uow, err := unitofwork.New(pool, &unitofwork.Config{Table: e.table})
	if err != nil {
		t.Fatal(err)
	}
	effect := e.effect("o")
	cfg := e.config(group(), func(ctx context.Context, tx unitofwork.Tx, m *inbox.Message) error {
		if err := effect(ctx, tx, m); err != nil {
			return err
		}
		time.Sleep(2 * time.Millisecond) // the outage cuts transactions in progress too
		_, err := tx.Exec(ctx, "SELECT 1")
		return err
	})
	cfg.MaxAttempts = 1
	c, err := inbox.New(pool, uow, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	defer stop(t, c)
	first := e.produce(events(50, 10)...)
	e.waitEffects(50)
	px.setDown(true)
	more := events(100, 10)
	for i := range more {
		more[i].Seq += 50
	}
	more = e.produce(more...)
	time.Sleep(3 * time.Second) // tries fail meanwhile
	if n := e.count(); n != 50 {
		t.Fatalf("%d effects while the database was unreachable, want 50", n)
	}
	px.setDown(false)
	all := append(first, more...)
	e.waitEffects(len(all))

	// Then the server terminates the consumer's sessions again and again,
	// in the middle of its transactions (57P01, connection lost).
	last := events(100, 10)
	for i := range last {
		last[i].Seq += 150
	}
	done := make(chan struct{})
	var killed atomic.Int64
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			select {
			case <-done:
				return
			case <-time.After(20 * time.Millisecond):
			}
			var n int64
			_ = e.pool.QueryRow(context.Background(), `SELECT count(*) FROM pg_stat_activity, pg_terminate_backend(pid)
				WHERE application_name = $1 AND state = 'idle in transaction'`, px.app).Scan(&n)
			killed.Add(n)
		}
	})
	all = append(all, e.produce(last...)...)
	e.waitEffects(len(all))
	close(done)
	wg.Wait()
	t.Logf("terminated %d sessions in the middle of a transaction", killed.Load())
	e.checkOnce(all)
	var parked int
	_ = e.pool.QueryRow(context.Background(), `SELECT count(*) FROM `+e.inbox.Schema+`.outbox_inbox_parked`).Scan(&parked)
	if parked != 0 {
		t.Fatalf("%d records parked during a database outage", parked)
	}
}

// proxy forwards TCP to PostgreSQL until it is set down: then it closes
// every connection and refuses new ones.
type proxy struct {
	app    string
	ln     net.Listener
	target string
	down   atomic.Bool
	mu     sync.Mutex
	conns  map[net.Conn]bool
	wg     sync.WaitGroup
}

func newProxy(t *testing.T) *proxy {
	cfg, err := pgxpool.ParseConfig(os.Getenv("DATABASE_URL"))
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &proxy{app: testenv.Name("inbox_outage_"), ln: ln, target: net.JoinHostPort(cfg.ConnConfig.Host, strconv.Itoa(int(cfg.ConnConfig.Port))), conns: map[net.Conn]bool{}}
	p.wg.Go(p.accept)
	t.Cleanup(func() {
		_ = ln.Close()
		p.closeAll()
		p.wg.Wait()
	})
	return p
}

func (p *proxy) pool(t *testing.T) *pgxpool.Pool {
	cfg, err := pgxpool.ParseConfig(os.Getenv("DATABASE_URL"))
	if err != nil {
		t.Fatal(err)
	}
	host, port, _ := net.SplitHostPort(p.ln.Addr().String())
	n, _ := strconv.Atoi(port)
	cfg.ConnConfig.Host, cfg.ConnConfig.Port = host, uint16(n)
	cfg.ConnConfig.ConnectTimeout = 2 * time.Second
	cfg.ConnConfig.RuntimeParams["application_name"] = p.app
	cfg.MaxConns = 10
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

func (p *proxy) setDown(down bool) {
	p.down.Store(down)
	if down {
		p.closeAll()
	}
}

func (p *proxy) closeAll() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for c := range p.conns {
		_ = c.Close()
	}
}

func (p *proxy) track(c net.Conn, add bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if add {
		p.conns[c] = true
	} else {
		delete(p.conns, c)
	}
}

func (p *proxy) accept() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		if p.down.Load() {
			_ = c.Close()
			continue
		}
		s, err := net.Dial("tcp", p.target)
		if err != nil {
			_ = c.Close()
			continue
		}
		p.track(c, true)
		p.track(s, true)
		pipe := func(dst, src net.Conn) {
			_, _ = io.Copy(dst, src)
			_ = dst.Close()
			_ = src.Close()
			p.track(dst, false)
			p.track(src, false)
		}
		p.wg.Go(func() { pipe(c, s) })
		p.wg.Go(func() { pipe(s, c) })
	}
}
