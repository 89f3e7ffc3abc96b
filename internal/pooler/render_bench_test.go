package pooler_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/pgtenant/pgtenant/internal/pooler"
)

// BenchmarkRender: the files of a pooler with 1,000 tenants' entries, as
// each sync of the front door renders them (5.7 ms with regexps checking
// names and verifiers, fmt quoting them, and the admin's verifier made
// again each time).
func BenchmarkRender(b *testing.B) {
	v := pooler.AdminVerifier("pw", "/y")
	var es []pooler.Entry
	for i := range 1000 {
		name := fmt.Sprintf("t_%012d", i)
		es = append(es, pooler.Entry{Name: name, Database: name, Verifier: v, PoolMode: pooler.ModeSession, PoolSize: 2, MaxDBConnections: 4})
	}
	s := pooler.Settings{ListenHost: "127.0.0.1", ListenPort: 6432, ServerHost: "127.0.0.1", ServerPort: 5432, MaxClientConn: 10,
		ServerIdleTimeout: time.Second, QueryWaitTimeout: time.Second, AdminVerifier: pooler.AdminVerifier("pw", "/x")}
	for b.Loop() {
		if _, err := pooler.Render("/d", s, es); err != nil {
			b.Fatal(err)
		}
	}
}
