package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fxoutbox/outbox"
	"github.com/fxoutbox/outbox/unitofwork"
)

// writerApp is the application_name of the writer processes' sessions, so
// that their backends' CPU is told apart from the relays'.
const writerApp = "fxbench-writer"

// runWriterChild is a process of writers (FXBENCH_CHILD=writer), as the
// pods of a service that writes would be, apart from the relay: its own
// pool, a unit of work with what fxoutbox.Module wires for writers (the
// coalesced NOTIFY after commit, unitofwork.Notifier, unless
// FXBENCH_NOTIFY=0; FXBENCH_NOTIFY_MS sets its interval, in milliseconds,
// instead of its default). It prints "ready", then runs one command per stdin
// line:
//
//	run <events/s> <seconds> <events per transaction> <writers> <record>
//
// events/s 0 writes as fast as the writers can (closed loop). With record
// 1 it prints "c <event id> <commit unix ns>" for every event committed.
// Each run ends with "done <events committed> <elapsed s>". It exits when
// stdin closes.
func runWriterChild() error {
	ctx := context.Background()
	cfg, err := pgxpool.ParseConfig(os.Getenv("DATABASE_URL"))
	if err != nil {
		return err
	}
	cfg.ConnConfig.RuntimeParams["application_name"] = writerApp
	cfg.MaxConns = 64
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return err
	}
	defer pool.Close()
	table := tableNamed(os.Getenv("FXBENCH_TABLE"))
	ucfg := &unitofwork.Config{Table: table}
	if os.Getenv("FXBENCH_NOTIFY") != "0" {
		ms, _ := strconv.Atoi(os.Getenv("FXBENCH_NOTIFY_MS"))
		n, err := unitofwork.NewNotifier(pool, table, time.Duration(ms)*time.Millisecond, nil)
		if err != nil {
			return err
		}
		defer n.Close()
		ucfg.OnCommit = n.OnCommit
	}
	uow, err := unitofwork.New(pool, ucfg)
	if err != nil {
		return err
	}
	topic := os.Getenv("FXBENCH_TOPIC")
	keys, _ := strconv.Atoi(os.Getenv("FXBENCH_KEYS"))
	keys = max(keys, 1)
	out := bufio.NewWriterSize(os.Stdout, 1<<16)
	var mu sync.Mutex
	fmt.Fprintln(out, "ready")
	_ = out.Flush()
	sc := bufio.NewScanner(os.Stdin)
	for sc.Scan() {
		var rate, perTx, writers, record int
		var secs float64
		if _, err := fmt.Sscanf(sc.Text(), "run %d %g %d %d %d", &rate, &secs, &perTx, &writers, &record); err != nil {
			return fmt.Errorf("writer process: command %q: %w", sc.Text(), err)
		}
		perTx, writers = max(perTx, 1), max(writers, 1)
		d := time.Duration(secs * float64(time.Second))
		var seq atomic.Int64
		write := func() error {
			ids := make([]uuid.UUID, perTx)
			err := uow.Do(ctx, func(ctx context.Context, tx unitofwork.Tx) error {
				for i := range ids {
					ids[i], _ = uuid.NewV7()
					k := randKey(keys)
					if err := tx.Add(ctx, outbox.Event{ID: ids[i], AggregateType: aggregateType, AggregateID: orderID(k), Type: eventType,
						Topic: topic, Payload: json.RawMessage(payload(k, int(seq.Add(1))))}); err != nil {
						return err
					}
				}
				return nil
			})
			if err != nil || record == 0 {
				return err
			}
			at := time.Now().UnixNano()
			mu.Lock()
			for _, id := range ids {
				fmt.Fprintf(out, "c %s %d\n", id, at)
			}
			mu.Unlock()
			return nil
		}
		var committed atomic.Int64
		var werr atomic.Value
		var wg sync.WaitGroup
		t0 := time.Now()
		if rate <= 0 {
			for range writers {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for time.Since(t0) < d {
						if err := write(); err != nil {
							werr.CompareAndSwap(nil, err)
							return
						}
						committed.Add(int64(perTx))
					}
				}()
			}
		} else {
			// Open loop: transaction i is due at t0 + i*perTx/rate.
			total := int(float64(rate) * d.Seconds() / float64(perTx))
			tokens := make(chan struct{}, total)
			for range writers {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for range tokens {
						if err := write(); err != nil {
							werr.CompareAndSwap(nil, err)
							continue
						}
						committed.Add(int64(perTx))
					}
				}()
			}
			txRate := float64(rate) / float64(perTx)
			for i := 0; i < total; {
				due := min(total, int(time.Since(t0).Seconds()*txRate)+1)
				for ; i < due; i++ {
					tokens <- struct{}{}
				}
				time.Sleep(200 * time.Microsecond)
			}
			close(tokens)
		}
		wg.Wait()
		elapsed := time.Since(t0)
		if err, _ := werr.Load().(error); err != nil {
			return fmt.Errorf("writer process: %w", err)
		}
		mu.Lock()
		fmt.Fprintf(out, "done %d %.6f\n", committed.Load(), elapsed.Seconds())
		err := out.Flush()
		mu.Unlock()
		if err != nil {
			return err
		}
	}
	return sc.Err()
}

// writerProc is a writer process (see runWriterChild).
type writerProc struct {
	cmd   *exec.Cmd
	in    io.WriteCloser
	lines *bufio.Scanner
}

// writerRun is what one run of a writer process did.
type writerRun struct {
	events   int64
	elapsed  time.Duration
	commits  map[string]time.Time // with record
	achieved float64              // events/s
}

// startWriterProc starts a writer process on the database at url, writing
// events for topic.
// extra is added to its environment (FXBENCH_TABLE: another table).
func (e *env) startWriterProc(ctx context.Context, url, topic string, extra ...string) (*writerProc, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	cmd := exec.CommandContext(ctx, self)
	cmd.Env = append(os.Environ(), childEnv+"=writer", "DATABASE_URL="+url, "FXBENCH_TOPIC="+topic,
		"FXBENCH_KEYS="+strconv.Itoa(e.p.Keys))
	cmd.Env = append(cmd.Env, extra...)
	cmd.Stderr = os.Stderr
	in, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	w := &writerProc{cmd: cmd, in: in, lines: bufio.NewScanner(out)}
	w.lines.Buffer(make([]byte, 1<<16), 1<<20)
	if !w.lines.Scan() || w.lines.Text() != "ready" {
		_ = w.stop()
		return nil, fmt.Errorf("writer process did not start: %q %v", w.lines.Text(), w.lines.Err())
	}
	return w, nil
}

// run makes the process write rate events/s (0: as fast as it can) for d
// in transactions of perTx events, and waits for the end of the run.
func (w *writerProc) run(rate int, d time.Duration, perTx, writers int, record bool) (writerRun, error) {
	rec := 0
	if record {
		rec = 1
	}
	if _, err := fmt.Fprintf(w.in, "run %d %g %d %d %d\n", rate, d.Seconds(), perTx, writers, rec); err != nil {
		return writerRun{}, err
	}
	r := writerRun{}
	if record {
		r.commits = map[string]time.Time{}
	}
	for w.lines.Scan() {
		f := strings.Fields(w.lines.Text())
		switch {
		case len(f) == 3 && f[0] == "c":
			ns, err := strconv.ParseInt(f[2], 10, 64)
			if err != nil {
				return r, fmt.Errorf("writer process said %q", w.lines.Text())
			}
			r.commits[f[1]] = time.Unix(0, ns)
		case len(f) == 3 && f[0] == "done":
			r.events, _ = strconv.ParseInt(f[1], 10, 64)
			s, _ := strconv.ParseFloat(f[2], 64)
			r.elapsed = time.Duration(s * float64(time.Second))
			if s > 0 {
				r.achieved = float64(r.events) / s
			}
			return r, nil
		default:
			return r, fmt.Errorf("writer process said %q", w.lines.Text())
		}
	}
	return r, errors.Join(errors.New("writer process ended before its run did"), w.lines.Err())
}

// stop closes the process's stdin and waits for it.
func (w *writerProc) stop() error {
	_ = w.in.Close()
	return w.cmd.Wait()
}
