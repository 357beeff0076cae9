package fold

import (
	"errors"
	"fmt"

	"github.com/expr-lang/expr"
	"github.com/expr-lang/expr/ast"
	"github.com/expr-lang/expr/vm"
)

// where is a compiled filter: an expr-lang expression over an event's
// fields that yields a bool.
type where struct {
	prog   *vm.Program
	fields []string // the top-level fields it reads
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
	return &where{prog: prog, fields: v.fields}, nil
}

type whereVisitor struct {
	seen   map[string]bool
	fields []string
	err    error
}

func (v *whereVisitor) Visit(node *ast.Node) {
	switch n := (*node).(type) {
	case *ast.CallNode:
		if id, ok := n.Callee.(*ast.IdentifierNode); ok && v.err == nil {
			if id.Value == "now" {
				v.err = errors.New("now() is not allowed: a filter must depend only on the event")
			} else {
				v.err = fmt.Errorf("unknown function %s()", id.Value)
			}
		}
	case *ast.IdentifierNode:
		if !v.seen[n.Value] {
			v.seen[n.Value] = true
			v.fields = append(v.fields, n.Value)
		}
	}
}

// match evaluates the filter on an event. A filter that cannot be evaluated
// because a field it reads is absent (`amount > 10` without an amount) is
// false, just as an absent field leaves an aggregate unchanged; any other
// failure (`amount > 10` with "amount": "lots") is returned.
func (w *where) match(fields map[string]any) (bool, error) {
	var m vm.VM
	out, err := m.Run(w.prog, fields)
	if err != nil {
		for _, f := range w.fields {
			if v, ok := fields[f]; !ok || v == nil {
				return false, nil
			}
		}
		return false, err
	}
	b, _ := out.(bool)
	return b, nil
}
