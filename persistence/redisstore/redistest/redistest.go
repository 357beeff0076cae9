// Package redistest runs a real redis-server for tests: on a free loopback
// port, in a temporary directory, with the append-only file synced on every
// write (appendfsync always), so a test can kill it with SIGKILL, start it
// again and expect every acknowledged write back.
//
// If redis-server is not installed the test fails and says how to install
// it (.ci/run does): a skipped Redis test would hide a failure.
package redistest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// Server is a redis-server process started by the test.
type Server struct {
	t     testing.TB
	bin   string
	dir   string
	port  int
	extra []string
	cmd   *exec.Cmd
	done  chan struct{} // closed when cmd has exited
}

// Start starts a redis-server that is stopped when the test ends. Extra
// arguments are passed to redis-server after the defaults, which they
// override (e.g. "--appendfsync", "everysec").
func Start(t testing.TB, extra ...string) *Server {
	t.Helper()
	s, err := startServer(t, redisServer(t), func(string) []string { return extra })
	if err != nil {
		t.Fatalf("redistest: start redis-server: %v", err)
	}
	return s
}

// redisServer returns the path of redis-server, failing the test with how
// to install it if it is missing.
func redisServer(t testing.TB) string {
	t.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		t.Fatalf("redistest: the Redis tests run a real redis-server, which is not on PATH (%v): "+
			"install it (Debian: apt-get install redis-server; .ci/run does)", err)
	}
	return bin
}

// startServer starts a redis-server in a new temporary directory on a free
// port, with the arguments extra returns for the directory after the
// defaults; it tries new ports (and arguments) when one was taken before
// redis-server bound it. The server is stopped when the test ends.
func startServer(t testing.TB, bin string, extra func(dir string) []string) (*Server, error) {
	t.Helper()
	s := &Server{t: t, bin: bin, dir: t.TempDir()}
	var err error
	for range 5 {
		s.port, s.extra = freePort(t), extra(s.dir)
		if err = s.start(); err == nil {
			// Registered after TempDir: cleanups run last-in first-out,
			// so the process is gone before its directory is removed.
			t.Cleanup(s.Stop)
			return s, nil
		}
	}
	return nil, err
}

func freePort(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("redistest: free port: %v", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// Addr is the server's host:port.
func (s *Server) Addr() string { return "127.0.0.1:" + strconv.Itoa(s.port) }

// URL is the server's redis:// URL (database 0).
func (s *Server) URL() string { return "redis://" + s.Addr() + "/0" }

// Client returns a new client of the server, closed when the test ends.
func (s *Server) Client() *redis.Client {
	c := redis.NewClient(&redis.Options{Addr: s.Addr()})
	s.t.Cleanup(func() { _ = c.Close() })
	return c
}

func (s *Server) start() error {
	args := []string{
		"--port", strconv.Itoa(s.port),
		"--bind", "127.0.0.1",
		"--dir", s.dir,
		"--appendonly", "yes",
		"--appendfsync", "always",
		"--save", "",
		"--daemonize", "no",
		"--logfile", filepath.Join(s.dir, "redis.log"),
	}
	cmd := exec.Command(s.bin, append(args, s.extra...)...)
	if err := cmd.Start(); err != nil {
		return err
	}
	s.cmd, s.done = cmd, make(chan struct{})
	go func(done chan struct{}) { _ = cmd.Wait(); close(done) }(s.done)

	c := redis.NewClient(&redis.Options{Addr: s.Addr(), MaxRetries: -1})
	defer c.Close()
	deadline := time.Now().Add(10 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		err := c.Ping(ctx).Err()
		cancel()
		// The server answered: ready, also when the answer is an error such
		// as NOAUTH with --requirepass, but not while it answers LOADING (it
		// is still reading its append-only file after a restart and refuses
		// every command).
		var reply redis.Error
		if err == nil || errors.As(err, &reply) && !strings.HasPrefix(reply.Error(), "LOADING") {
			return nil
		}
		if s.exited() {
			s.cmd = nil
			return fmt.Errorf("redis-server exited: %s", s.logTail())
		}
		if time.Now().After(deadline) {
			s.kill()
			return fmt.Errorf("redis-server on %s not ready after 10s: %w", s.Addr(), err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func tail(b []byte) string {
	if len(b) > 2000 {
		b = b[len(b)-2000:]
	}
	return string(b)
}

// exited reports whether the process has exited.
func (s *Server) exited() bool {
	select {
	case <-s.done:
		return true
	default:
		return false
	}
}

func (s *Server) logTail() string {
	b, err := os.ReadFile(filepath.Join(s.dir, "redis.log"))
	if err != nil {
		return fmt.Sprintf("(no log: %v)", err)
	}
	return tail(b)
}

// busPort returns the --cluster-port argument, 0 if there is none.
func (s *Server) busPort() int {
	for i, a := range s.extra {
		if a == "--cluster-port" && i+1 < len(s.extra) {
			p, _ := strconv.Atoi(s.extra[i+1])
			return p
		}
	}
	return 0
}

// kill sends SIGKILL and waits for the exit.
func (s *Server) kill() {
	if s.cmd == nil {
		return
	}
	_ = s.cmd.Process.Signal(syscall.SIGCONT) // in case it was paused
	_ = s.cmd.Process.Kill()
	<-s.done
	s.cmd = nil
}

// Kill kills the server with SIGKILL: what it had not written to its
// append-only file is lost, as in a crash.
func (s *Server) Kill() {
	s.t.Helper()
	s.kill()
}

// Restart starts the server again, on the same port and data, after Kill
// or Stop. It reloads the append-only file.
func (s *Server) Restart() {
	s.t.Helper()
	if s.cmd != nil {
		s.t.Fatal("redistest: Restart of a running server")
	}
	if err := s.start(); err != nil {
		s.t.Fatalf("redistest: restart: %v", err)
	}
}

// Pause stops the server process (SIGSTOP): it accepts connections but
// answers nothing until Resume, like a hung or very slow Redis.
func (s *Server) Pause() {
	s.t.Helper()
	if s.cmd == nil || s.cmd.Process.Signal(syscall.SIGSTOP) != nil {
		s.t.Fatal("redistest: Pause of a server that is not running")
	}
}

// Resume continues a paused server.
func (s *Server) Resume() {
	s.t.Helper()
	if s.cmd == nil || s.cmd.Process.Signal(syscall.SIGCONT) != nil {
		s.t.Fatal("redistest: Resume of a server that is not running")
	}
}

// Stop kills the server if it is running. It is registered as a cleanup by
// Start.
func (s *Server) Stop() { s.kill() }
