package actors

import (
	"runtime"
	"sync"
	"sync/atomic"
)

// workerDispatcher runs the grains' mailboxes on long-lived goroutines.
// protoactor's default dispatcher starts a goroutine for every mailbox run,
// whose stack then grows anew through the grain's code: at a million keys
// runtime.newstack and copystack took a fifth of the CPU (BENCHMARKS.md).
// Workers keep their grown stacks.
//
// Schedule never blocks: it is called by whoever sends to a grain, often
// under the host's lock, while a busy worker may be waiting for that lock.
// When every worker is busy and the queue is full, the run gets a
// goroutine of its own, as with the default dispatcher.
//
// The workers start with the first run (New starts nothing) and stop with
// close; runs scheduled after close get a goroutine each.
type workerDispatcher struct {
	runs  chan func()
	start sync.Once
	stop  sync.Once
	done  chan struct{}
	wg    sync.WaitGroup
	// overflows counts the runs that found the queue full (Stats.Overflows).
	overflows atomic.Int64
}

// dispatchThroughput is how many messages a mailbox run processes before
// it yields its worker (protoactor's default).
const dispatchThroughput = 300

func newWorkerDispatcher() *workerDispatcher {
	return &workerDispatcher{runs: make(chan func(), 4096), done: make(chan struct{})}
}

func (d *workerDispatcher) startWorkers() {
	n := 2 * runtime.GOMAXPROCS(0)
	d.wg.Add(n)
	for range n {
		go d.work()
	}
}

func (d *workerDispatcher) work() {
	defer d.wg.Done()
	for {
		select {
		case fn := <-d.runs:
			fn()
		case <-d.done:
			return
		}
	}
}

func (d *workerDispatcher) Schedule(fn func()) {
	d.start.Do(d.startWorkers)
	select {
	case <-d.done:
		go fn()
		return
	default:
	}
	select {
	case d.runs <- fn:
	default:
		d.overflows.Add(1)
		go fn()
	}
}

func (d *workerDispatcher) Throughput() int { return dispatchThroughput }

// close stops the workers; runs still queued then get a goroutine each.
func (d *workerDispatcher) close() {
	d.stop.Do(func() {
		close(d.done)
		d.wg.Wait()
		for {
			select {
			case fn := <-d.runs:
				go fn()
			default:
				return
			}
		}
	})
}
