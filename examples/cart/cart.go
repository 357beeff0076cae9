package main

import (
	"errors"
	"fmt"
	"maps"
	"time"

	"github.com/keyfold/keyfold"
)

// Cart is one user's shopping cart: the state of the user's key.
type Cart struct {
	Items map[string]Line `json:"items,omitempty"`
	// Views counts the product pages the user viewed (events).
	Views int `json:"views,omitempty"`
}

// Line is one item in a cart; prices are in cents.
type Line struct {
	Qty   int `json:"qty"`
	Price int `json:"price"`
}

// Request is a call to a user's cart: op is add, remove, get or checkout.
type Request struct {
	Op    string `json:"op"`
	Item  string `json:"item,omitempty"`
	Qty   int    `json:"qty,omitempty"`
	Price int    `json:"price,omitempty"`
}

// View is the reply to add, remove and get.
type View struct {
	Items map[string]Line `json:"items"`
	Total int             `json:"total"`
}

// Order is the reply to checkout, and the "order" output it emits.
type Order struct {
	Items int `json:"items"`
	Total int `json:"total"`
}

// carts is the handler of the carts pipeline (a keyfold.Caller[Cart]):
// calls change and read a cart, events count the user's product views,
// and a processing-time timer abandons a cart left alone for abandonAfter.
type carts struct {
	abandonAfter time.Duration
}

// OnEvent counts a product view ({"user": …, "event_id": …, "type": "viewed"}).
func (carts) OnEvent(k *keyfold.Key[Cart], ev keyfold.Event) error {
	var e struct {
		Type string `json:"type"`
	}
	if err := ev.Decode(&e); err != nil {
		return err
	}
	if e.Type != "viewed" {
		return fmt.Errorf("unknown event type %q", e.Type)
	}
	c := k.State()
	c.Views++
	k.Set(c)
	return nil
}

// OnCall answers a request. Its errors go back to the caller, and the
// cart is then unchanged.
func (h carts) OnCall(k *keyfold.Key[Cart], req keyfold.Request) (any, error) {
	var r Request
	if err := req.Decode(&r); err != nil {
		return nil, err
	}
	c := k.State()
	c.Items = maps.Clone(c.Items) // changed on a copy: a failed call changes nothing
	switch r.Op {
	case "get":
		return view(c), nil
	case "add":
		if r.Item == "" || r.Qty <= 0 || r.Price < 0 {
			return nil, errors.New("add needs an item, a quantity above 0 and a price of at least 0")
		}
		if c.Items == nil {
			c.Items = map[string]Line{}
		}
		l := c.Items[r.Item]
		l.Qty += r.Qty
		l.Price = r.Price
		c.Items[r.Item] = l
	case "remove":
		if _, ok := c.Items[r.Item]; !ok {
			return nil, fmt.Errorf("%q is not in the cart", r.Item)
		}
		delete(c.Items, r.Item)
	case "checkout":
		if len(c.Items) == 0 {
			return nil, errors.New("the cart is empty")
		}
		o := order(c)
		if err := k.Emit("order", o); err != nil {
			return nil, err
		}
		// The cart is emptied, the user's views stay. (A retried checkout
		// gets this reply again: it is kept, as every call's with an id.)
		k.Set(Cart{Views: c.Views})
		k.CancelTimer("abandon")
		return o, nil
	default:
		return nil, fmt.Errorf("unknown op %q", r.Op)
	}
	k.Set(c)
	// Each change restarts the wait before the cart counts as abandoned.
	if err := k.SetProcessingTimer("abandon", k.Now().Add(h.abandonAfter)); err != nil {
		return nil, err
	}
	return view(c), nil
}

// OnTimer abandons the cart: it emits what it held and deletes the key
// (its views too: a user gone that long starts afresh).
func (carts) OnTimer(k *keyfold.Key[Cart], t keyfold.Timer) error {
	if err := k.Emit("abandoned", order(k.State())); err != nil {
		return err
	}
	k.Delete()
	return nil
}

func view(c Cart) View {
	v := View{Items: c.Items, Total: order(c).Total}
	if v.Items == nil {
		v.Items = map[string]Line{}
	}
	return v
}

func order(c Cart) Order {
	var o Order
	for _, l := range c.Items {
		o.Items += l.Qty
		o.Total += l.Qty * l.Price
	}
	return o
}

// config is the node's configuration with the carts pipeline and its
// handler.
func config(dataDir, httpAddr, grpcAddr string, abandonAfter time.Duration) (keyfold.Config, error) {
	cfg := keyfold.Config{
		DataDir: dataDir, HTTPAddr: httpAddr, GRPCAddr: grpcAddr,
		Pipelines: map[string]keyfold.PipelineConfig{
			"carts": {Key: "user", ID: "event_id"},
		},
	}
	return cfg, keyfold.Handle(&cfg, "carts", carts{abandonAfter: abandonAfter})
}
