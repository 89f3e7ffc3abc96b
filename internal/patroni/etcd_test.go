package patroni

import (
	"bytes"
	"context"
	"encoding/base64"
	"fmt"
	"net/http"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/pgtenant/pgtenant/internal/background"
	"github.com/pgtenant/pgtenant/internal/fleet"
	"github.com/pgtenant/pgtenant/internal/pgtest"
)

// TestEtcdCluster_ThreeMembersKeepAQuorum: three members bootstrap
// together; with one SIGKILLed the other two stay healthy and take writes
// (a quorum of 2 of 3); a supervisor starts the dead one again and it
// rejoins; stopped and started again from the dir, the members are the same
// (the count and the ports kept), and another count is refused.
func TestEtcdCluster_ThreeMembersKeepAQuorum(t *testing.T) {
	if testing.Short() {
		t.Skip("starts etcd members")
	}
	if _, err := exec.LookPath("etcd"); err != nil {
		t.Skip("etcd not installed: apt-get install etcd-server")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	dir := filepath.Join(pgtest.TempDir(t), "etcd")
	c, err := StartEtcdCluster(ctx, EtcdClusterOptions{Dir: dir, Members: 3})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Stop(context.Background())
	if got, err := EtcdMembers(dir); got != 3 || err != nil {
		t.Fatalf("EtcdMembers = %d, %v; want 3", got, err)
	}
	endpoints := c.Endpoints()
	if len(endpoints) != 3 {
		t.Fatalf("endpoints %v; want 3", endpoints)
	}
	put(t, ctx, endpoints[0], "before")

	// One member lost: the two others have a quorum.
	_ = syscall.Kill(c.Members[0].proc.cmd.Process.Pid, syscall.SIGKILL)
	<-c.Members[0].Done()
	if c.Running("e1") {
		t.Fatal("e1 runs after its SIGKILL")
	}
	for _, e := range c.Members[1:] {
		wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		if err := e.waitHealthy(wctx); err != nil {
			t.Errorf("with e1 lost, %s: %v", e.opts.Name, err)
		}
		cancel()
		put(t, ctx, e.Endpoint(), "after")
	}

	// The supervisor starts it again; it rejoins on its data dir.
	sctx, stopSup := context.WithCancel(ctx)
	supDone := make(chan struct{})
	go func() {
		defer close(supDone)
		(&fleet.Supervisor{Cluster: c, Interval: 100 * time.Millisecond}).Run(sctx)
	}()
	if err := background.Until(ctx, 100*time.Millisecond, func(context.Context) error {
		if !c.Running("e1") {
			return fmt.Errorf("e1 down")
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	stopSup()
	<-supDone
	wctx, cancelWait := context.WithTimeout(ctx, 30*time.Second)
	defer cancelWait()
	if err := c.Members[0].waitHealthy(wctx); err != nil {
		t.Fatalf("e1 after its restart: %v", err)
	}
	put(t, ctx, endpoints[0], "rejoined")
	if err := c.Stop(ctx); err != nil {
		t.Fatal(err)
	}

	// Started again from the dir: the same members, at the same addresses.
	if _, err := StartEtcdCluster(ctx, EtcdClusterOptions{Dir: dir, Members: 1}); err == nil || !strings.Contains(err.Error(), "has 3 members, not 1") {
		t.Errorf("a start with 1 member on a dir of 3: %v; want a refusal naming 3", err)
	}
	again, err := StartEtcdCluster(ctx, EtcdClusterOptions{Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	defer again.Stop(context.Background())
	if got, want := strings.Join(again.Endpoints(), ","), strings.Join(endpoints, ","); got != want {
		t.Errorf("endpoints after a restart %s; want the same %s", got, want)
	}
	put(t, ctx, endpoints[2], "restarted")
	if err := again.Stop(ctx); err != nil {
		t.Fatal(err)
	}
}

// put writes a key through the member's v3 gateway, as Patroni's etcd3
// store does; a write needs a quorum.
func put(t *testing.T, ctx context.Context, endpoint, value string) {
	t.Helper()
	enc := base64.StdEncoding.EncodeToString
	body := fmt.Sprintf(`{"key": %q, "value": %q}`, enc([]byte("/test/key")), enc([]byte(value)))
	pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(pctx, http.MethodPost, "http://"+endpoint+"/v3/kv/put", bytes.NewBufferString(body))
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("put %s on %s: %v", value, endpoint, err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("put %s on %s: %s", value, endpoint, resp.Status)
	}
}
