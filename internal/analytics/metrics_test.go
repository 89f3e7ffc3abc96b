package analytics_test

import (
	"context"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/pgtenant/pgtenant/internal/analytics"
	"github.com/pgtenant/pgtenant/internal/cluster"
	"github.com/pgtenant/pgtenant/internal/pgtest"
)

// TestCollector_AsksNoClusterThatIsDown: a scrape reads the mirrors'
// slots on the clusters that answer, never on one whose last probe
// failed: it would wait on each (199 refused connections were ~450 ms of
// every /metrics in bench density's simulated fleet), or for the whole
// timeout on a host that accepts and never answers, as this one does.
func TestCollector_AsksNoClusterThatIsDown(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	var accepted atomic.Int32
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			accepted.Add(1)
			t.Cleanup(func() { c.Close() })
		}
	}()
	cl, err := cluster.New("silent", "postgres://nobody@"+ln.Addr().String()+"/postgres", nil, pgtest.Logger(t))
	if err != nil {
		t.Fatal(err)
	}
	reg := cluster.NewRegistry()
	reg.Put(cl)
	t.Cleanup(reg.Close)
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	if _, err := cl.Probe(ctx); err == nil {
		t.Fatal("a probe of a server that never answers succeeded")
	}
	probed := accepted.Load()
	if probed == 0 {
		t.Fatal("the probe never reached the silent server")
	}

	metrics := prometheus.NewRegistry()
	metrics.MustRegister(analytics.NewCollector(&analytics.Service{Clusters: reg}))
	if _, err := metrics.Gather(); err != nil {
		t.Fatal(err)
	}
	if n := accepted.Load(); n != probed {
		t.Errorf("the scrape connected to a cluster whose last probe failed (%d connections, the probe's %d)", n, probed)
	}
}
