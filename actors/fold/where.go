package fold

import (
	"errors"
	"fmt"
	"strings"
	"sync"

	"github.com/expr-lang/expr"
	"github.com/expr-lang/expr/ast"
	"github.com/expr-lang/expr/vm"
)

// where is a compiled filter: an expr-lang expression over an event's
// fields that yields a bool.
type where struct {
	prog  *vm.Program
	paths [][]string // the field paths it reads (user, geo.country, …)
	// dynamic is set when the filter may read fields it does not name
	// ($env[expr], "x" in $env): it then sees every field of the event.
	dynamic bool
	// eq is set when the filter compares a top-level field with a text
	// (type == 'login_failed'): it is then evaluated on the field's raw
	// value, without expr (see textEq).
	eq *textEq
}

// textEq is a filter `field == 'text'` or `field != 'text'` (either way
// round). expr's == is true only for a string equal to the text: a field
// absent, null, a number, a bool, an object or an array is not equal, and
// no operand of == fails. So the filter needs neither the event's members
// decoded into a map nor expr's machine, which were an eighth of preparing
// an event with one such filter (BENCHMARKS.md, session 29).
// FuzzFilterTextEq holds it to expr's answers.
type textEq struct {
	field string
	read  int // the field's index in Pipeline.reads (indexFields)
	text  string
	neg   bool // !=
}

// matchRaw evaluates the filter on the field's raw JSON value (nil if
// absent), which the event's scan found valid.
func (e *textEq) matchRaw(raw []byte) bool {
	equal := len(raw) > 0 && raw[0] == '"' && decodesTo(raw, e.text)
	return equal != e.neg
}

// textEqOf returns the filter node as a textEq, or nil if it is not one.
func textEqOf(node ast.Node) *textEq {
	b, ok := node.(*ast.BinaryNode)
	if !ok || (b.Operator != "==" && b.Operator != "!=") {
		return nil
	}
	field, text := b.Left, b.Right
	if _, ok := field.(*ast.StringNode); ok {
		field, text = text, field
	}
	id, ok := field.(*ast.IdentifierNode)
	lit, ok2 := text.(*ast.StringNode)
	if !ok || !ok2 || strings.HasPrefix(id.Value, "$") {
		return nil
	}
	return &textEq{field: id.Value, text: lit.Value, neg: b.Operator == "!="}
}

// compileWhere compiles a filter. Fields absent from an event are nil. Calls
// are limited to expr's builtins, minus now(): a filter must be a pure
// function of the event, or replay would not be deterministic.
func compileWhere(src string) (*where, error) {
	prog, err := expr.Compile(src,
		expr.Env(map[string]any{}),
		expr.AllowUndefinedVariables(),
		expr.AsBool(),
		expr.DisableBuiltin("now"),
		// "type" is a common event field (type == 'login_failed'), more useful
		// as a field than as expr's type() builtin.
		expr.DisableBuiltin("type"),
	)
	if err != nil {
		return nil, err
	}
	v := &whereVisitor{seen: map[string]bool{}}
	node := prog.Node()
	ast.Walk(&node, v)
	if v.err != nil {
		return nil, v.err
	}
	return &where{prog: prog, paths: v.paths, dynamic: v.envRefs != v.envNamed, eq: textEqOf(node)}, nil
}

type whereVisitor struct {
	seen  map[string]bool
	paths [][]string
	err   error
	// envRefs counts the uses of $env, envNamed those that name a field
	// ($env["type"], $env.type): any other reads fields unknown here.
	envRefs, envNamed int
}

// orderDependent are the builtins whose result depends on Go's random map
// iteration order: a filter using them could answer differently on replay.
var orderDependent = map[string]bool{"keys": true, "values": true, "toPairs": true}

func (v *whereVisitor) Visit(node *ast.Node) {
	switch n := (*node).(type) {
	case *ast.BuiltinNode:
		if orderDependent[n.Name] && v.err == nil {
			v.err = fmt.Errorf("%s() is not allowed: its order varies from run to run, and a filter must give the same answer on replay", n.Name)
		}
	case *ast.CallNode:
		if m, ok := n.Callee.(*ast.MemberNode); ok && v.err == nil {
			if name, ok := m.Property.(*ast.StringNode); ok && name.Value == "Local" {
				v.err = errors.New("Local() is not allowed: it depends on the machine's time zone")
			}
		}
		if id, ok := n.Callee.(*ast.IdentifierNode); ok && v.err == nil {
			if id.Value == "now" {
				v.err = errors.New("now() is not allowed: a filter must depend only on the event")
			} else {
				v.err = fmt.Errorf("unknown function %s()", id.Value)
			}
		}
	case *ast.IdentifierNode:
		if n.Value == "$env" {
			v.envRefs++
		}
		v.add([]string{n.Value})
	case *ast.MemberNode:
		if id, ok := n.Node.(*ast.IdentifierNode); ok && id.Value == "$env" {
			if _, ok := n.Property.(*ast.StringNode); ok {
				v.envNamed++
			}
		}
		if p := memberPath(n); p != nil {
			v.add(p)
		}
	}
}

func (v *whereVisitor) add(path []string) {
	if len(path) > 0 && path[0] == "$env" {
		path = path[1:]
	}
	key := strings.Join(path, "\x00")
	if len(path) == 0 || v.seen[key] {
		return
	}
	v.seen[key] = true
	v.paths = append(v.paths, path)
}

// memberPath returns the field path of a chain like geo.country or
// $env["type"], or nil if the chain is not made of names.
func memberPath(n *ast.MemberNode) []string {
	prop, ok := n.Property.(*ast.StringNode)
	if !ok {
		return nil
	}
	var base []string
	switch b := n.Node.(type) {
	case *ast.IdentifierNode:
		base = []string{b.Value}
	case *ast.MemberNode:
		if base = memberPath(b); base == nil {
			return nil
		}
	default:
		return nil
	}
	return append(base, prop.Value)
}

// eval evaluates the filter on an event's members: on the raw value of
// its field if it is a textEq, else on env (filterEnv).
func (w *where) eval(f *fields, env map[string]any) (bool, error) {
	if w.eq != nil {
		if f.noFilterFields {
			return w.eq.matchRaw(nil), nil
		}
		return w.eq.matchRaw(f.vals[w.eq.read]), nil
	}
	return w.match(env)
}

// match evaluates the filter on an event. A filter that cannot be evaluated
// because a field it reads is absent (`amount > 10` without an amount) is
// false, just as an absent field leaves an aggregate unchanged; any other
// failure (`amount > 10` with "amount": "lots") is returned.
func (w *where) match(fields map[string]any) (bool, error) {
	m := vms.Get().(*vm.VM)
	out, err := m.Run(w.prog, fields)
	vms.Put(m)
	if err != nil {
		for _, p := range w.paths {
			if v, ok := walk(fields, p); !ok || v == nil {
				return false, nil
			}
		}
		return false, firstLine(err)
	}
	b, _ := out.(bool)
	return b, nil
}

// vms are machines to run filters on: a VM is reusable (Run resets it), and
// one per evaluation was an allocation of its stack per filter and event.
var vms = sync.Pool{New: func() any { return new(vm.VM) }}

// firstLine drops the source excerpt expr appends to its errors: messages
// end up in one-line JSON errors.
func firstLine(err error) error {
	msg := err.Error()
	if i := strings.IndexByte(msg, '\n'); i >= 0 {
		return errors.New(strings.TrimSpace(msg[:i]))
	}
	return err
}
