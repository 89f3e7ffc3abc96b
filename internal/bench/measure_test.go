package bench

import (
	"strings"
	"testing"
	"time"
)

// Lines as pg_waldump 15 prints them.
const walDumpSample = `rmgr: XLOG        len (rec/tot):    114/   114, tx:          0, lsn: 0/01000028, prev 0/00000000, desc: CHECKPOINT_SHUTDOWN redo 0/1000028; tli 1; prev tli 1; fpw true; xid 0:3; oid 10000
rmgr: XLOG        len (rec/tot):     49/   137, tx:          1, lsn: 0/010000C0, prev 0/010000A0, desc: FPI , blkref #0: rel 1663/1/6117 blk 0 FPW
rmgr: Transaction len (rec/tot):  822155/822155, tx:        735, lsn: 1A/0B8178F0, prev 1A/0B7028A8, desc: COMMIT 2026-11-30 02:41:46.338325 UTC; rels: base/5/16384 base/5/16385; inval msgs: catcache 55 catcache 54 relcache 1260
rmgr: Heap2       len (rec/tot):     56/    56, tx:          0, lsn: 0/010B81E0, prev 0/010B8178, desc: PRUNE latestRemovedXid 3 nredirected 0 ndead 1, blkref #0: rel 1663/1/1259 blk 0
pg_waldump: error: error in WAL record at 0/1500718: invalid record length at 0/1500790: wanted 24, got 0
`

func TestParseWALDumpLine(t *testing.T) {
	lines := strings.Split(walDumpSample, "\n")
	got, ok := parseWALDumpLine(lines[1])
	want := WALRecord{Rmgr: "XLOG", Desc: "FPI", LSN: "0/010000C0", Rec: 49, Total: 137, DB: 1}
	if !ok || got != want {
		t.Errorf("parse FPI line = %+v, %v; want %+v", got, ok, want)
	}
	got, ok = parseWALDumpLine(lines[2])
	want = WALRecord{Rmgr: "Transaction", Desc: "COMMIT", LSN: "1A/0B8178F0", Rec: 822155, Total: 822155}
	if !ok || got != want {
		t.Errorf("parse COMMIT line = %+v, %v; want %+v", got, ok, want)
	}
	for _, line := range []string{lines[4], "", "rmgr: Heap len (rec/tot): x/y"} {
		if got, ok := parseWALDumpLine(line); ok {
			t.Errorf("parse %q = %+v, want no record", line, got)
		}
	}
}

func TestScanWALDump_LargestAndLongLines(t *testing.T) {
	// A commit record of a big drop lists every file: a line of megabytes.
	long := "rmgr: Transaction len (rec/tot):  999999/999999, tx: 9, lsn: 0/02000000, prev 0/01FFFFF0, desc: COMMIT; rels:" +
		strings.Repeat(" base/5/16384", 300000) + "\n"
	sum, err := scanWALDump(strings.NewReader(walDumpSample + long + walDumpSample))
	if err != nil {
		t.Fatal(err)
	}
	if sum.Records != 9 {
		t.Errorf("records = %d, want 9", sum.Records)
	}
	if sum.FPIBytes != 2*(137-49) {
		t.Errorf("FPI bytes = %d, want %d (the FPI record twice)", sum.FPIBytes, 2*(137-49))
	}
	if got := sum.Largest; got.Total != 999999 || got.LSN != "0/02000000" {
		t.Errorf("largest = %+v, want the 999999-byte commit at 0/02000000", got)
	}
	// What wrote the range: the commits' bytes first, and the database of
	// the records' blocks (1: the FPIs, the prune of pg_class).
	got := sum.top(2, map[uint32]string{1: "template1"})
	if want := "Transaction/COMMIT 100%, XLOG/FPI 0%; (none) 100%, template1 0%"; got != want {
		t.Errorf("top = %q, want %q", got, want)
	}
}

func TestFormatLSN(t *testing.T) {
	for n, want := range map[int64]string{0: "0/0", 0x1000028: "0/1000028", 0x1A0B8178F0: "1A/B8178F0"} {
		if got := formatLSN(n); got != want {
			t.Errorf("formatLSN(%#x) = %s, want %s", n, got, want)
		}
	}
}

func TestLatencyStats(t *testing.T) {
	var lat []time.Duration
	for i := 1; i <= 100; i++ {
		lat = append(lat, time.Duration(i)*time.Millisecond)
	}
	p50, p95, perSec := latencyStats(lat, 2*time.Second)
	if p50 != 50*time.Millisecond || p95 != 95*time.Millisecond || perSec != 50 {
		t.Errorf("latencyStats = %s, %s, %.1f/s; want 50ms, 95ms, 50/s", p50, p95, perSec)
	}
}
