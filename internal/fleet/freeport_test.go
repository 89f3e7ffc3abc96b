package fleet

import (
	"net"
	"strconv"
	"testing"
)

// A picked port is free and, where the kernel says which ports it hands to
// outgoing connections, outside them: no connection can take it before the
// program started on it binds it.
func TestFreePort_BelowTheEphemeralRange(t *testing.T) {
	low := ephemeralLow()
	seen := map[int]bool{}
	for range 50 {
		port, err := FreePort()
		if err != nil {
			t.Fatal(err)
		}
		if low > 2048 && (port < 1024 || port >= low) {
			t.Fatalf("port %d is not in [1024, %d)", port, low)
		}
		seen[port] = true
	}
	if len(seen) < 25 {
		t.Fatalf("50 picks gave %d ports: not spread", len(seen))
	}
	port, _ := FreePort()
	l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(port))
	if err != nil {
		t.Fatalf("the picked port %d is not free: %v", port, err)
	}
	l.Close()
}
