package unitofwork

import (
	"context"
	"sync"
)

// background is the one shape of the write side's long-running parts, the
// Notifier and the AddTx commit watcher: a goroutine started on first use
// by poke, woken by poke, and ended by stop, which waits for it. (The relay
// and the inbox's consumer start theirs with Start and end them with Stop;
// these start on first use, because a writer that never commits needs
// none.) The goroutine watches ctx and signal.
type background struct {
	ctx    context.Context // canceled by stop: ends the goroutine and its work in flight
	cancel context.CancelFunc
	signal chan struct{} // one pending wake-up at most
	start  sync.Once
	done   chan struct{} // closed when the goroutine has returned, or by stop if it never started
}

func newBackground() background {
	ctx, cancel := context.WithCancel(context.Background())
	return background{ctx: ctx, cancel: cancel, signal: make(chan struct{}, 1), done: make(chan struct{})}
}

// poke starts run in the goroutine on first use (not after stop) and wakes
// it. It never blocks.
func (b *background) poke(run func()) {
	b.start.Do(func() {
		if b.ctx.Err() != nil {
			close(b.done)
			return
		}
		go func() {
			defer close(b.done)
			run()
		}()
	})
	select {
	case b.signal <- struct{}{}:
	default:
	}
}

// stop ends the goroutine and waits for it; poke after stop does nothing.
func (b *background) stop() {
	b.cancel()
	b.start.Do(func() { close(b.done) }) // never started
	<-b.done
}
