package outboxtest_test

import (
	"fmt"
	"sync"
)

// exampleT stands in for the t *testing.T of a test function, which an
// example does not have: each example's first line makes one, and its
// comment names the test function that replaces that line. Its cleanups
// run when every test and example has run (TestMain), as a test's run
// when the test ends; one that calls Errorf fails the package.
type exampleT struct{ cleanups []func() }

var examples struct {
	sync.Mutex
	ts     []*exampleT
	failed bool
}

func newExampleT() *exampleT {
	t := &exampleT{}
	examples.Lock()
	examples.ts = append(examples.ts, t)
	examples.Unlock()
	return t
}

func (*exampleT) Helper()                         {}
func (*exampleT) Logf(format string, args ...any) { fmt.Printf(format+"\n", args...) }
func (*exampleT) Errorf(format string, args ...any) {
	examples.Lock()
	examples.failed = true
	examples.Unlock()
	fmt.Printf("FAIL: "+format+"\n", args...)
}
func (*exampleT) Fatalf(format string, args ...any) { panic(fmt.Sprintf(format, args...)) }
func (t *exampleT) Cleanup(f func())                { t.cleanups = append(t.cleanups, f) }

// runExampleCleanups runs the examples' cleanups, each example's in
// reverse order, and reports whether none failed.
func runExampleCleanups() bool {
	examples.Lock()
	ts := examples.ts
	examples.ts = nil
	examples.Unlock()
	for _, t := range ts {
		for i := len(t.cleanups) - 1; i >= 0; i-- {
			t.cleanups[i]()
		}
	}
	examples.Lock()
	defer examples.Unlock()
	return !examples.failed
}
