package analytics

import (
	"net"
	"testing"
	"time"
)

// TestPacedConn: a read that empties the socket makes the next one wait
// streamPace first, one that fills its buffer does not; the bytes come
// through whole and in order.
func TestPacedConn(t *testing.T) {
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	c := paced(a)
	go func() {
		b.Write([]byte("abc"))
		b.Write([]byte("defgh"))
		b.Write([]byte("0123456789"))
	}()
	buf := make([]byte, 100)
	n, err := c.Read(buf)
	if err != nil || string(buf[:n]) != "abc" {
		t.Fatalf("first read: %q, %v", buf[:n], err)
	}
	start := time.Now()
	n2, err := c.Read(buf[n:])
	if waited := time.Since(start); waited < streamPace {
		t.Errorf("the read after an emptied socket waited %s, want at least %s", waited, streamPace)
	}
	if err != nil || string(buf[:n+n2]) != "abcdefgh" {
		t.Fatalf("second read: %q, %v", buf[:n+n2], err)
	}
	small := make([]byte, 4)
	if n, err := c.Read(small); err != nil || string(small[:n]) != "0123" {
		t.Fatalf("third read: %q, %v", small[:n], err)
	}
	if c.(*pacedConn).drained {
		t.Error("a read that filled its buffer marked the socket emptied: the next read would wait")
	}
}
