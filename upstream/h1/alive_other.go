//go:build !linux

package h1

import "net"

// aliveCheck has no non-blocking peek here: a pooled connection is taken
// as open, and a request on one the peer closed is retried by the rule
// of Client.RoundTrip.
type aliveCheck struct{}

func newAliveCheck(net.Conn) aliveCheck { return aliveCheck{} }

func (*aliveCheck) ok() bool { return true }
