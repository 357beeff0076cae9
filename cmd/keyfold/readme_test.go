//go:build unix

package main

// TestReadmeTryIt holds the README's "Try it" section true: it runs the
// section's shell blocks, in order, with the keyfold binary built from this
// source first on PATH, and compares what each command prints with what the
// README shows below it.
//
// The README's convention, which readmeSteps reads: in a ```sh block, a
// command (continued over lines by open quotes, a trailing | or \) is
// followed directly by its output as comment lines ("# " and the line); a
// comment after a blank line is prose. A command shown without output must
// print nothing. `keyfold serve` lines start a node in the background, as
// the README has the reader do in another terminal; the next one stops it
// first (the README's Ctrl-C).
//
// Where the test's run differs from a reader's, and why:
//
//   - The commands run in a new temporary directory holding a link to the
//     repository's examples/, so the data directories the configurations
//     name (./keyfold-data, ./keyfold-windows-data) are fresh ones in it,
//     shared exactly as a reader's would be.
//   - The nodes listen on free loopback ports, not 8080 and 9090 (another
//     process may hold those): serve lines get --http and --grpc
//     127.0.0.1:0, and the other commands are pointed at the bound ports
//     (rewriteAddrs).
//   - curl is not installed everywhere: a curl on PATH that is this test
//     binary makes the requests, with the subset of curl's options the
//     README uses (curlMain).
//   - Outputs that vary from run to run are normalized, in the README's
//     text and the command's alike (normalize); nothing else is.

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"
)

// readmeStep is one command of the README and the output it shows.
type readmeStep struct {
	line    int    // where the command starts in README.md
	command string // as the README writes it, lines joined by \n
	want    []string
}

func TestReadmeTryIt(t *testing.T) {
	steps := readmeSteps(t, "../../README.md", "Try it")
	examples, err := filepath.Abs("../../examples")
	if err != nil {
		t.Fatal(err)
	}
	work := t.TempDir()
	if err := os.Symlink(examples, filepath.Join(work, "examples")); err != nil {
		t.Fatal(err)
	}
	bin := keyfoldBinary(t)
	path := filepath.Dir(bin) + string(os.PathListSeparator) + curlOnPath(t) + string(os.PathListSeparator) + os.Getenv("PATH")

	var n *node     // the node the last serve line started
	var grpc string // its gRPC address
	for _, s := range steps {
		if args, ok := strings.CutPrefix(s.command, "keyfold serve "); ok {
			if len(s.want) > 0 {
				t.Errorf("README.md:%d: shows an output for a serve line: a node's output is its log", s.line)
			}
			if n != nil {
				stopLikeCtrlC(t, n)
			}
			if strings.ContainsAny(args, "'\"\\|;&$<>\n") {
				t.Fatalf("README.md:%d: %s: the test runs serve lines itself, not with sh: keep them to plain words", s.line, s.command)
			}
			n, grpc = serveStep(t, bin, work, s, strings.Fields(args))
			continue
		}
		if n == nil {
			t.Fatalf("README.md:%d: %q runs before any keyfold serve line started a node", s.line, s.command)
		}
		waitOutMinuteEnd()
		got, err := runStep(work, path, rewriteAddrs(s.command, strings.TrimPrefix(n.base, "http://"), grpc))
		if err != nil {
			t.Errorf("README.md:%d: %s\n%v; it printed:\n%s", s.line, s.command, err, got)
			continue
		}
		want := strings.Join(s.want, "\n")
		if normalize(got) != normalize(want) {
			t.Errorf("README.md:%d: %s\nprinted:\n%s\nthe README shows:\n%s", s.line, s.command, got, want)
		}
	}
	if n != nil {
		stopLikeCtrlC(t, n)
	}
}

// readmeSteps returns the commands of the ```sh blocks in the section of
// README path under the heading "## "+section, up to the next "## ".
func readmeSteps(t *testing.T, path, section string) []readmeStep {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var (
		steps    []readmeStep
		in       bool // in the section
		block    bool // in one of its sh blocks
		cur      *readmeStep
		open     bool // cur's command goes on on the next line
		quotes   shellQuotes
		lineNo   int
		sections int
	)
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		lineNo++
		line := sc.Text()
		switch {
		case !block && strings.HasPrefix(line, "## "):
			in = line == "## "+section
			if in {
				sections++
			}
			continue
		case !in:
			continue
		case !block:
			block = line == "```sh"
			continue
		case line == "```":
			if open {
				t.Fatalf("README.md:%d: a command is still open (a quote, | or \\) at the end of its block", cur.line)
			}
			block, cur = false, nil
			continue
		}
		switch {
		case open:
			cur.command += "\n" + line
			open = quotes.scan(line)
		case strings.TrimSpace(line) == "":
			cur = nil // what follows is not the last command's output
		case strings.HasPrefix(line, "#"):
			if cur != nil { // right below a command: its output
				out := strings.TrimPrefix(strings.TrimPrefix(line, "#"), " ")
				cur.want = append(cur.want, out)
			}
		default:
			steps = append(steps, readmeStep{line: lineNo, command: line})
			cur = &steps[len(steps)-1]
			quotes = shellQuotes{}
			open = quotes.scan(line)
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	if sections != 1 || len(steps) == 0 {
		t.Fatalf("%s: want one section %q with sh blocks, found %d sections and %d commands", path, section, sections, len(steps))
	}
	return steps
}

// shellQuotes follows sh's quoting over a command's lines, far enough to
// know where the command ends.
type shellQuotes struct{ single, double bool }

// scan reads one more line of a command and reports whether the command
// goes on: a quote is open, or the line ends with | or \.
func (q *shellQuotes) scan(line string) bool {
	escaped := false
	for i, c := range line {
		switch {
		case q.single:
			q.single = c != '\''
		case escaped:
			escaped = false
		case c == '\\':
			escaped = true
		case c == '"':
			q.double = !q.double
		case q.double:
		case c == '\'':
			q.single = true
		case c == '#' && (i == 0 || line[i-1] == ' ' || line[i-1] == '\t'):
			line = line[:i] // a comment: the rest of the line is not the command's
			return q.continues(line, false)
		}
	}
	return q.continues(line, escaped)
}

func (q *shellQuotes) continues(line string, escaped bool) bool {
	return q.single || q.double || escaped || strings.HasSuffix(strings.TrimRight(line, " \t"), "|")
}

// serveStep starts the node of a `keyfold serve ARGS` line in dir, on free
// loopback ports, and returns it once ready, with its gRPC address.
func serveStep(t *testing.T, bin, dir string, s readmeStep, args []string) (*node, string) {
	t.Helper()
	cmd := exec.Command(bin, append(append([]string{"serve"}, args...), "--http", "127.0.0.1:0", "--grpc", "127.0.0.1:0")...)
	cmd.Dir = dir
	n := launch(t, fmt.Sprintf("README.md:%d", s.line), cmd)
	n.waitReady(30 * time.Second)
	var grpc string
	grpcRE := regexp.MustCompile(`msg=listening grpc=(\S+)`)
	waitUntil(t, 10*time.Second, n.name+"'s gRPC address", func() (bool, error) {
		if m := n.logs.find(grpcRE); m != nil {
			grpc = m[1]
			return true, nil
		}
		return false, nil
	})
	return n, grpc
}

// stopLikeCtrlC stops the node as the README has the reader do, with
// SIGINT, and checks that it drained and exited cleanly.
func stopLikeCtrlC(t *testing.T, n *node) {
	t.Helper()
	n.stop(syscall.SIGINT)
	if code := n.cmd.ProcessState.ExitCode(); code != 0 {
		t.Fatalf("%s: exit %d after SIGINT, want 0:\n%s", n.name, code, n.logs.tail(30))
	}
}

// The README's addresses are the defaults of `keyfold serve`.
var (
	readmeHTTP   = regexp.MustCompile(`\blocalhost:8080\b`)
	readmeGRPC   = regexp.MustCompile(`\blocalhost:9090\b`)
	clientSubcmd = regexp.MustCompile(`\bkeyfold (send|get|delete|outputs|health)\b`)
)

// rewriteAddrs points a README command at the test's node, whose ports are
// free ones rather than serve's defaults: the HTTP and gRPC addresses the
// README writes, and the default --addr of the keyfold commands that talk
// to a node (given explicitly, first: an --addr the README gives wins).
func rewriteAddrs(command, httpAddr, grpcAddr string) string {
	command = readmeHTTP.ReplaceAllLiteralString(command, httpAddr)
	command = readmeGRPC.ReplaceAllLiteralString(command, grpcAddr)
	return clientSubcmd.ReplaceAllString(command, "keyfold $1 --addr "+grpcAddr)
}

// stepTimeout bounds one README command: each takes well under a second,
// but one waiting for an output that never comes (keyfold outputs
// --follow) would wait forever.
const stepTimeout = 30 * time.Second

// runStep runs a command with sh in dir and returns what it printed,
// stdout and stderr interleaved as on a terminal, without its final
// newline. The command gets a process group of its own, which a timeout
// kills whole: killing sh alone would leave what it started running,
// holding the output pipe open.
func runStep(dir, path, command string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), stepTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, "sh", "-c", command)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "PATH="+path)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) } // the group this test created
	cmd.WaitDelay = 5 * time.Second
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out // one pipe: the order they were written in
	err := cmd.Run()
	if ctx.Err() != nil {
		err = fmt.Errorf("still running after %v (killed): %w", stepTimeout, err)
	}
	return strings.TrimSuffix(out.String(), "\n"), err
}

// waitOutMinuteEnd waits for the next minute when the current one ends
// within 3 s. The windows example shows its first result: a pattern that
// matches within a second of the send. Its minute windows (and every
// fifth minute, the sliding ones) emit as the wall-clock minute ends, and
// would come first if it ended meanwhile; a reader may see that too, which
// the README says.
func waitOutMinuteEnd() {
	now := time.Now()
	if next := now.Truncate(time.Minute).Add(time.Minute); next.Sub(now) < 3*time.Second {
		time.Sleep(next.Sub(now) + 100*time.Millisecond)
	}
}

// What varies from run to run in the outputs the README shows, and stands
// for it in the comparison. Each is the clock, or measured on the machine:
var normalizations = []struct {
	re   *regexp.Regexp
	with string
}{
	// How long `keyfold send` took, and its rate.
	{regexp.MustCompile(`in [0-9.]+[µnm]?s \([0-9.]+ events/s\)`), "in <elapsed> (<rate> events/s)"},
	// Times: the windows example has no time field, so its events' times
	// are when they were ingested; watermarks and "stored" are the clock.
	{regexp.MustCompile(`\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z`), "<time>"},
	// The same times in Unix milliseconds, in a result's id
	// (pipeline/key/name/start-end/n).
	{regexp.MustCompile(`/\d{13}-\d{13}/`), "/<ms>-<ms>/"},
}

func normalize(s string) string {
	for _, n := range normalizations {
		s = n.re.ReplaceAllString(s, n.with)
	}
	return s
}

// ---- curl ---------------------------------------------------------------

// curlName is the name under which this test binary is curl (TestMain).
const curlName = "curl"

// curlOnPath returns a directory holding a curl that is this test binary.
func curlOnPath(t *testing.T) string {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := os.Symlink(self, filepath.Join(dir, curlName)); err != nil {
		t.Fatal(err)
	}
	return dir
}

// curlMain does what curl does with the options the README uses: -s, -X
// (also -XPOST), -H, -d / --data / --data-binary (@- reads stdin, @FILE a
// file) and a URL without a scheme meaning http://. As curl, it prints the
// body whatever the status and exits 7 when it cannot connect; an option
// it does not know is an error naming it, so that a README using a new one
// fails here rather than passing untested.
func curlMain(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	req, err := curlRequest(args, stdin)
	if err != nil {
		fmt.Fprintf(stderr, "curl (readme_test.go): %v\n", err)
		return 2
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		fmt.Fprintf(stderr, "curl: (7) %v\n", err)
		return 7
	}
	defer resp.Body.Close()
	if _, err := io.Copy(stdout, resp.Body); err != nil {
		fmt.Fprintf(stderr, "curl: (56) %v\n", err)
		return 56
	}
	return 0
}

// curlRequest builds the request curl's args describe.
func curlRequest(args []string, stdin io.Reader) (*http.Request, error) {
	var (
		method, url string
		headers     []string
		body        []byte
		hasBody     bool
		form        bool // -d / --data: curl's default type is a form's
	)
	value := func(i *int, name string) (string, error) {
		if *i+1 >= len(args) {
			return "", fmt.Errorf("%s needs a value", name)
		}
		*i++
		return args[*i], nil
	}
	for i := 0; i < len(args); i++ {
		a := args[i]
		var err error
		switch {
		case a == "-s" || a == "--silent":
		case a == "-X" || a == "--request":
			method, err = value(&i, a)
		case strings.HasPrefix(a, "-X"):
			method = a[2:]
		case a == "-H" || a == "--header":
			var h string
			h, err = value(&i, a)
			headers = append(headers, h)
		case a == "-d" || a == "--data" || a == "--data-binary":
			if hasBody {
				return nil, fmt.Errorf("%s: only one body is supported", a)
			}
			var d string
			if d, err = value(&i, a); err == nil {
				body, err = curlData(d, a == "--data-binary", stdin)
			}
			hasBody, form = true, a != "--data-binary"
		case strings.HasPrefix(a, "-"):
			return nil, fmt.Errorf("option %s is not supported", a)
		case url != "":
			return nil, fmt.Errorf("a second URL %q", a)
		default:
			url = a
		}
		if err != nil {
			return nil, err
		}
	}
	if url == "" {
		return nil, errors.New("no URL")
	}
	if !strings.Contains(url, "://") {
		url = "http://" + url
	}
	if method == "" {
		method = http.MethodGet
		if hasBody {
			method = http.MethodPost
		}
	}
	var rd io.Reader
	if hasBody {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequest(method, url, rd)
	if err != nil {
		return nil, err
	}
	if form {
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	}
	for _, h := range headers {
		k, v, ok := strings.Cut(h, ":")
		if !ok {
			return nil, fmt.Errorf("header %q: want Name: value", h)
		}
		req.Header.Set(strings.TrimSpace(k), strings.TrimSpace(v))
	}
	return req, nil
}

// curlData is the body a -d or --data-binary value names: the text, or
// with @ the contents of a file (- for stdin), from which -d (not
// --data-binary) drops carriage returns and newlines, as curl does.
func curlData(v string, binary bool, stdin io.Reader) ([]byte, error) {
	name, ok := strings.CutPrefix(v, "@")
	if !ok {
		return []byte(v), nil
	}
	var b []byte
	var err error
	if name == "-" {
		b, err = io.ReadAll(stdin)
	} else {
		b, err = os.ReadFile(name)
	}
	if err != nil || binary {
		return b, err
	}
	return bytes.ReplaceAll(bytes.ReplaceAll(b, []byte("\r"), nil), []byte("\n"), nil), nil
}

// TestReadmeCurl: the test's curl builds the requests curl would, and
// refuses what it does not know rather than send something else.
func TestReadmeCurl(t *testing.T) {
	for _, c := range []struct {
		args                     []string
		stdin                    string
		method, url, ctype, body string
	}{
		{args: []string{"-s", "localhost:8080/v1/pipelines"}, method: "GET", url: "http://localhost:8080/v1/pipelines"},
		{args: []string{"-s", "-XPOST", "-H", "Content-Type: application/json", "h:1/e", "-d", "[1,\n2]"},
			method: "POST", url: "http://h:1/e", ctype: "application/json", body: "[1,\n2]"},
		{args: []string{"-d", "a=1", "http://h:1/e"}, method: "POST", url: "http://h:1/e", ctype: "application/x-www-form-urlencoded", body: "a=1"},
		{args: []string{"--data-binary", "@-", "-H", "Content-Type: application/x-ndjson", "h:1/e"}, stdin: "{}\n{}\n",
			method: "POST", url: "http://h:1/e", ctype: "application/x-ndjson", body: "{}\n{}\n"},
		{args: []string{"-d", "@-", "h:1/e"}, stdin: "{}\r\n{}\n", method: "POST", url: "http://h:1/e", ctype: "application/x-www-form-urlencoded", body: "{}{}"},
		{args: []string{"-X", "DELETE", "h:1/k"}, method: "DELETE", url: "http://h:1/k"},
	} {
		req, err := curlRequest(c.args, strings.NewReader(c.stdin))
		if err != nil {
			t.Errorf("%q: %v", c.args, err)
			continue
		}
		var body []byte
		if req.Body != nil {
			body, _ = io.ReadAll(req.Body)
		}
		if req.Method != c.method || req.URL.String() != c.url || req.Header.Get("Content-Type") != c.ctype || string(body) != c.body {
			t.Errorf("%q: %s %s type %q body %q, want %s %s type %q body %q", c.args, req.Method, req.URL, req.Header.Get("Content-Type"), body, c.method, c.url, c.ctype, c.body)
		}
	}
	for _, args := range [][]string{{"-o", "/dev/null", "h:1"}, {"-w", "%{http_code}", "h:1"}, {"-s"}, {"h:1", "h:2"}, {"-H", "nocolon", "h:1"}, {"-d"}} {
		if _, err := curlRequest(args, strings.NewReader("")); err == nil {
			t.Errorf("%q: no error", args)
		}
	}
}
