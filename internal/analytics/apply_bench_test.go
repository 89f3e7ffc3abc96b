package analytics

import (
	"cmp"
	"context"
	"database/sql"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"

	"github.com/pgtenant/pgtenant/internal/catalog"
	"github.com/pgtenant/pgtenant/internal/tenant"
)

// BenchmarkApply: the apply's CPU per change on bench analytics' table
// (1 M rows of 22 columns; upserts of random ids), without PostgreSQL:
// pgoutput messages as the walsender sends them are decoded, gathered and
// applied to a DuckDB file opened as a mirror's is. It reports the CPU of
// the gathering (decode and fold, Go) and of the apply (Go and DuckDB's
// threads, checkpoints included) per change, and of a checkpoint after
// the last batch. Run it with
//
//	go test -run X -bench Apply -benchtime 200x ./internal/analytics
//
// (b.N batches); the environment sets PGTENANT_APPLY_ROWS (1000000),
// PGTENANT_APPLY_BATCH (changes per batch, 5000), PGTENANT_APPLY_THREADS
// (DuckDB's threads, 2), PGTENANT_APPLY_MEMORY (1024MB) and
// PGTENANT_APPLY_CKPT (DuckDB's checkpoint_threshold, checkpointWAL) and
// PGTENANT_APPLY_INSERTS (1: each change inserts a new id instead).

// pgout builds pgoutput messages.
type pgout []byte

func (p pgout) u8(v byte) pgout    { return append(p, v) }
func (p pgout) u16(v uint16) pgout { return binary.BigEndian.AppendUint16(p, v) }
func (p pgout) u32(v uint32) pgout { return binary.BigEndian.AppendUint32(p, v) }
func (p pgout) u64(v uint64) pgout { return binary.BigEndian.AppendUint64(p, v) }
func (p pgout) str(s string) pgout { return append(append(p, s...), 0) }

const benchCols = 22 // id, int1..int10, text1..text10, crt_time

func benchRelation() []byte {
	p := pgout{'R'}.u32(16384).str("public").str("t").u8('d').u16(benchCols)
	p = p.u8(1).str("id").u32(20).u32(0xffffffff)
	for i := 1; i <= 10; i++ {
		p = p.u8(0).str(fmt.Sprintf("int%d", i)).u32(23).u32(0xffffffff)
	}
	for i := 1; i <= 10; i++ {
		p = p.u8(0).str(fmt.Sprintf("text%d", i)).u32(25).u32(0xffffffff)
	}
	return p.u8(0).str("crt_time").u32(1114).u32(0xffffffff)
}

func benchRow(r *rand.Rand, id int) [][]byte {
	vals := [][]byte{fmt.Appendf(nil, "%d", id)}
	for range 10 {
		vals = append(vals, fmt.Appendf(nil, "%d", r.IntN(1000)))
	}
	for range 10 {
		vals = append(vals, fmt.Appendf(nil, "%032x", r.IntN(10000)*2654435761))
	}
	return append(vals, []byte("2026-12-02 22:41:25.123456"))
}

func benchTxn(r *rand.Rand, kind byte, id int, lsn uint64) [][]byte {
	begin := pgout{'B'}.u64(lsn).u64(0).u32(uint32(lsn))
	upd := pgout{kind}.u32(16384).u8('N').u16(benchCols)
	for _, v := range benchRow(r, id) {
		upd = upd.u8('t').u32(uint32(len(v)))
		upd = append(upd, v...)
	}
	commit := pgout{'C'}.u8(0).u64(lsn).u64(lsn + 1).u64(0)
	return [][]byte{begin, upd, commit}
}

func cpu() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func BenchmarkApply(b *testing.B) {
	rows := 1_000_000
	if v, err := strconv.Atoi(os.Getenv("PGTENANT_APPLY_ROWS")); err == nil && v > 0 {
		rows = v
	}
	perBatch := 5000
	if v, err := strconv.Atoi(os.Getenv("PGTENANT_APPLY_BATCH")); err == nil && v > 0 {
		perBatch = v
	}
	ctx := context.Background()
	dsn := fmt.Sprintf("%s?threads=%s&memory_limit=%s&checkpoint_threshold=%s&storage_compatibility_version=latest&enable_external_access=false",
		filepath.Join(b.TempDir(), "m.duckdb"), cmp.Or(os.Getenv("PGTENANT_APPLY_THREADS"), "2"), cmp.Or(os.Getenv("PGTENANT_APPLY_MEMORY"), "1024MB"),
		cmp.Or(os.Getenv("PGTENANT_APPLY_CKPT"), checkpointWAL))
	db := testFile(b, dsn, rows)
	defer db.Close()
	conn, err := db.Conn(ctx)
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Close()
	w := newWriter(conn)
	r := rand.New(rand.NewPCG(1, 2))
	t := catalog.Tenant{ID: "t1", Mode: tenant.ModeDatabase}
	rels := map[uint32]*relation{}
	lsn := uint64(100)
	// the batches' messages, made before the clock starts
	inserts := os.Getenv("PGTENANT_APPLY_INSERTS") == "1"
	msgs := make([][][]byte, b.N)
	for i := range msgs {
		msgs[i] = [][]byte{benchRelation()}
		for j := range perBatch {
			lsn += 10
			if inserts {
				msgs[i] = append(msgs[i], benchTxn(r, 'I', rows+1+i*perBatch+j, lsn)...)
			} else {
				msgs[i] = append(msgs[i], benchTxn(r, 'U', 1+r.IntN(rows), lsn)...)
			}
		}
	}
	var gather, apply time.Duration
	var dec rowDecoder
	b.ResetTimer()
	for i := range b.N {
		c0 := cpu()
		bt := newBatch(t, rels, map[string]pglogrepl.LSN{})
		for _, data := range msgs[i] {
			if _, err := bt.addMessage(data, 0, &dec); err != nil {
				b.Fatal(err)
			}
		}
		c1 := cpu()
		if _, err := bt.apply(ctx, w); err != nil {
			b.Fatal(err)
		}
		c2 := cpu()
		gather += c1 - c0
		apply += c2 - c1
	}
	c0 := cpu()
	if _, err := db.Exec("CHECKPOINT"); err != nil {
		b.Fatal(err)
	}
	ckpt := cpu() - c0
	b.StopTimer()
	n := float64(b.N * perBatch)
	b.ReportMetric(float64(gather.Microseconds())/n, "gather-µs/change")
	b.ReportMetric(float64(apply.Microseconds())/n, "apply-µs/change")
	b.ReportMetric(float64(ckpt.Microseconds())/n, "final-checkpoint-µs/change")
	var count int64
	want := int64(rows)
	if inserts {
		want += int64(b.N * perBatch)
	}
	if err := db.QueryRow(`SELECT count(*) FROM main.t`).Scan(&count); err != nil || count != want {
		b.Fatalf("the table has %d rows, want %d (%v)", count, want, err)
	}
}

// testFile opens a DuckDB file (dsn) as a mirror's with bench analytics'
// table of rows rows (ids 1..rows) in main.t, checkpointed.
func testFile(tb testing.TB, dsn string, rows int) *sql.DB {
	db, err := sql.Open("duckdb", dsn)
	if err != nil {
		tb.Fatal(err)
	}
	if _, err := db.Exec(`CREATE SCHEMA ` + stateSchema + `;
		CREATE TABLE ` + stateSchema + `.state (lsn UBIGINT NOT NULL, copied BOOLEAN NOT NULL, applied_rows BIGINT NOT NULL, applied_at TIMESTAMPTZ);
		CREATE TABLE ` + stateSchema + `.resync (tbl VARCHAR NOT NULL, pg_schema VARCHAR NOT NULL, pg_table VARCHAR NOT NULL, until UBIGINT NOT NULL);
		INSERT INTO ` + stateSchema + `.state VALUES (1, true, 0, now());
		CREATE TABLE main.t AS SELECT i::BIGINT AS id,
			(random()*1000)::INTEGER AS int1, (random()*1000)::INTEGER AS int2, (random()*1000)::INTEGER AS int3, (random()*1000)::INTEGER AS int4, (random()*1000)::INTEGER AS int5,
			(random()*1000)::INTEGER AS int6, (random()*1000)::INTEGER AS int7, (random()*1000)::INTEGER AS int8, (random()*1000)::INTEGER AS int9, (random()*1000)::INTEGER AS int10,
			md5((i % 10000)::VARCHAR) AS text1, md5((i % 9999)::VARCHAR) AS text2, md5((i % 9998)::VARCHAR) AS text3, md5((i % 9997)::VARCHAR) AS text4, md5((i % 9996)::VARCHAR) AS text5,
			md5((i % 9995)::VARCHAR) AS text6, md5((i % 9994)::VARCHAR) AS text7, md5((i % 9993)::VARCHAR) AS text8, md5((i % 9992)::VARCHAR) AS text9, md5((i % 9991)::VARCHAR) AS text10,
			TIMESTAMP '2026-01-01' AS crt_time FROM range(1, ` + fmt.Sprint(rows+1) + `) r(i);
		CHECKPOINT`); err != nil {
		db.Close()
		tb.Fatal(err)
	}
	return db
}
