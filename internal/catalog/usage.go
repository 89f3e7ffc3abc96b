package catalog

import (
	"context"
	"sort"
	"time"

	"github.com/jackc/pgx/v5"
)

// UsageRetention is how long hourly usage and size changes are kept: 400
// days, a year of invoices plus a month to settle a disputed one. The
// minute rollups (metrics.history_retention, 14 days by default) are for
// operators; these rows are what a bill is made from.
const UsageRetention = 400 * 24 * time.Hour

// UsageActivity is what the collector measured of one tenant in one hour on
// one cluster (usage_hours). Pointers are nil where the figure is not
// measured there: CPU without pg_stat_kcache, bytes without a front door.
type UsageActivity struct {
	Tenant            string
	Hour              time.Time
	Cluster           string
	RowsWritten       int64
	ConnectionSeconds float64
	CPUSeconds        *float64
	BytesIn           *int64
	BytesOut          *int64
	AnalyticsQueries  int64
}

// Zero says whether the hour holds no activity at all (not worth a row).
func (a UsageActivity) Zero() bool {
	return a.RowsWritten == 0 && a.ConnectionSeconds == 0 && (a.CPUSeconds == nil || *a.CPUSeconds == 0) &&
		(a.BytesIn == nil || *a.BytesIn == 0) && (a.BytesOut == nil || *a.BytesOut == 0) && a.AnalyticsQueries == 0
}

// InsertUsageActivity writes ended hours in one multi-row INSERT. A key
// another daemon (measuring the same cluster) wrote already keeps the larger
// of each figure: both saw the same hour, one maybe only part of it.
func (s *Store) InsertUsageActivity(ctx context.Context, as []UsageActivity) error {
	if len(as) == 0 {
		return nil
	}
	n := len(as)
	tenant, hour, cl := make([]string, n), make([]time.Time, n), make([]string, n)
	rows, conns, cpu := make([]int64, n), make([]float64, n), make([]*float64, n)
	in, out, aq := make([]*int64, n), make([]*int64, n), make([]int64, n)
	for i, a := range as {
		tenant[i], hour[i], cl[i] = a.Tenant, a.Hour, a.Cluster
		rows[i], conns[i], cpu[i], in[i], out[i], aq[i] = a.RowsWritten, a.ConnectionSeconds, a.CPUSeconds, a.BytesIn, a.BytesOut, a.AnalyticsQueries
	}
	_, err := s.pool.Exec(ctx, `
		INSERT INTO usage_hours AS u (tenant, hour, cluster, rows_written, connection_seconds, cpu_seconds, bytes_in, bytes_out, analytics_queries)
		SELECT * FROM unnest($1::text[], $2::timestamptz[], $3::text[], $4::bigint[], $5::float8[], $6::float8[], $7::bigint[], $8::bigint[], $9::bigint[])
		ON CONFLICT (tenant, hour, cluster) DO UPDATE SET
			analytics_queries = greatest(u.analytics_queries, excluded.analytics_queries),
			rows_written = greatest(u.rows_written, excluded.rows_written),
			connection_seconds = greatest(u.connection_seconds, excluded.connection_seconds),
			cpu_seconds = greatest(u.cpu_seconds, excluded.cpu_seconds),
			bytes_in = greatest(u.bytes_in, excluded.bytes_in),
			bytes_out = greatest(u.bytes_out, excluded.bytes_out)`,
		tenant, hour, cl, rows, conns, cpu, in, out, aq)
	return err
}

// UsageSize is a tenant's size from a time on (usage_sizes).
type UsageSize struct {
	Tenant string
	At     time.Time
	Bytes  int64
}

// InsertUsageSizes records size changes in one INSERT.
func (s *Store) InsertUsageSizes(ctx context.Context, zs []UsageSize) error {
	if len(zs) == 0 {
		return nil
	}
	tenant, at, bytes := make([]string, len(zs)), make([]time.Time, len(zs)), make([]int64, len(zs))
	for i, z := range zs {
		tenant[i], at[i], bytes[i] = z.Tenant, z.At, z.Bytes
	}
	_, err := s.pool.Exec(ctx, `
		INSERT INTO usage_sizes (tenant, at, size_bytes)
		SELECT * FROM unnest($1::text[], $2::timestamptz[], $3::bigint[])
		ON CONFLICT (tenant, at) DO NOTHING`, tenant, at, bytes)
	return err
}

// EndUsageSizes records a size of 0 at `at` for those of ids that are gone
// (purged, or being purged) and whose last recorded size is not 0 already:
// their storage is billed no more. A tenant that left a cluster for
// another (a move) is still in tenants: it is left alone.
func (s *Store) EndUsageSizes(ctx context.Context, ids []string, at time.Time) error {
	if len(ids) == 0 {
		return nil
	}
	_, err := s.pool.Exec(ctx, `
		INSERT INTO usage_sizes (tenant, at, size_bytes)
		SELECT u.id, $2, 0 FROM unnest($1::text[]) AS u(id)
		WHERE NOT EXISTS (SELECT 1 FROM tenants t WHERE t.id = u.id AND t.state NOT IN ('purging', 'purged'))
		  AND (SELECT z.size_bytes FROM usage_sizes z WHERE z.tenant = u.id ORDER BY z.at DESC LIMIT 1) <> 0
		ON CONFLICT (tenant, at) DO NOTHING`, ids, at)
	return err
}

// LastUsageSizes returns the last recorded size of each tenant of a
// cluster: what a size sample is compared with before it is written.
func (s *Store) LastUsageSizes(ctx context.Context, cluster string) (map[string]int64, error) {
	rows, err := s.pool.Query(ctx, `
		SELECT DISTINCT ON (z.tenant) z.tenant, z.size_bytes
		FROM usage_sizes z JOIN tenants t ON t.id = z.tenant
		WHERE t.cluster = $1 ORDER BY z.tenant, z.at DESC`, cluster)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := map[string]int64{}
	for rows.Next() {
		var id string
		var n int64
		if err := rows.Scan(&id, &n); err != nil {
			return nil, err
		}
		out[id] = n
	}
	return out, rows.Err()
}

// DeleteUsageBefore removes usage older than t: hours, and size changes
// superseded by a later change that is itself before t (the size a tenant
// held at t is kept), or a purge's 0.
func (s *Store) DeleteUsageBefore(ctx context.Context, t time.Time) (int64, error) {
	tag, err := s.pool.Exec(ctx, `DELETE FROM usage_hours WHERE hour < $1`, t)
	if err != nil {
		return 0, err
	}
	n := tag.RowsAffected()
	tag, err = s.pool.Exec(ctx, `
		DELETE FROM usage_sizes z WHERE z.at < $1 AND (z.size_bytes = 0
			OR EXISTS (SELECT 1 FROM usage_sizes l WHERE l.tenant = z.tenant AND l.at > z.at AND l.at <= $1))`, t)
	return n + tag.RowsAffected(), err
}

// UsageHour is one tenant's usage in one hour, as a bill reads it.
// StorageByteHours is the bytes held integrated over the hour (a tenant
// holding 1 GiB all hour: 1073741824). CPUSeconds is nil when no cluster
// measured it (no pg_stat_kcache); BytesIn and BytesOut are nil when the
// tenant had no front door that hour.
type UsageHour struct {
	Tenant            string    `json:"tenant"`
	Hour              time.Time `json:"hour"`
	StorageByteHours  float64   `json:"storage_byte_hours"`
	CPUSeconds        *float64  `json:"cpu_seconds"`
	RowsWritten       int64     `json:"rows_written"`
	ConnectionSeconds float64   `json:"connection_seconds"`
	BytesIn           *int64    `json:"bytes_in"`
	BytesOut          *int64    `json:"bytes_out"`
	AnalyticsQueries  int64     `json:"analytics_queries"` // statements run on the analytics port
}

// Usage returns the usage of one tenant (or every tenant, tenant "") in
// the hours that start in [from, to), by tenant then hour. Storage is
// integrated from the size changes up to min(hour end, now); a tenant
// that held no bytes and did nothing in an hour has no row for it. It
// reads the catalog only.
func (s *Store) Usage(ctx context.Context, tenant string, from, to, now time.Time) ([]UsageHour, error) {
	type key struct {
		tenant string
		hour   int64
	}
	out := map[key]*UsageHour{}
	get := func(id string, h time.Time) *UsageHour {
		k := key{id, h.Unix()}
		if u := out[k]; u != nil {
			return u
		}
		u := &UsageHour{Tenant: id, Hour: h.UTC()}
		out[k] = u
		return u
	}
	rows, err := s.pool.Query(ctx, `
		SELECT tenant, hour, sum(rows_written)::bigint, sum(connection_seconds), sum(cpu_seconds), sum(bytes_in)::bigint, sum(bytes_out)::bigint,
			sum(analytics_queries)::bigint
		FROM usage_hours WHERE hour >= $1 AND hour < $2 AND ($3 = '' OR tenant = $3)
		GROUP BY tenant, hour`, from, to, tenant)
	if err != nil {
		return nil, err
	}
	for rows.Next() {
		var id string
		var h time.Time
		var a UsageHour
		if err := rows.Scan(&id, &h, &a.RowsWritten, &a.ConnectionSeconds, &a.CPUSeconds, &a.BytesIn, &a.BytesOut, &a.AnalyticsQueries); err != nil {
			rows.Close()
			return nil, err
		}
		u := get(id, h)
		u.RowsWritten, u.ConnectionSeconds, u.CPUSeconds, u.BytesIn, u.BytesOut = a.RowsWritten, a.ConnectionSeconds, a.CPUSeconds, a.BytesIn, a.BytesOut
		u.AnalyticsQueries = a.AnalyticsQueries
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, err
	}

	// Each tenant's size steps: the last change at or before from, and
	// every change before to.
	rows, err = s.pool.Query(ctx, `
		(SELECT DISTINCT ON (tenant) tenant, at, size_bytes FROM usage_sizes
		 WHERE at <= $1 AND ($3 = '' OR tenant = $3) ORDER BY tenant, at DESC)
		UNION ALL
		(SELECT tenant, at, size_bytes FROM usage_sizes WHERE at > $1 AND at < $2 AND ($3 = '' OR tenant = $3))
		ORDER BY 1, 2`, from, to, tenant)
	if err != nil {
		return nil, err
	}
	steps, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (UsageSize, error) {
		var z UsageSize
		return z, r.Scan(&z.Tenant, &z.At, &z.Bytes)
	})
	if err != nil {
		return nil, err
	}
	end := to
	if now.Before(end) {
		end = now
	}
	for i, z := range steps {
		until := end
		if i+1 < len(steps) && steps[i+1].Tenant == z.Tenant && steps[i+1].At.Before(until) {
			until = steps[i+1].At
		}
		start := z.At
		if start.Before(from) {
			start = from
		}
		if z.Bytes == 0 || !until.After(start) {
			continue
		}
		for h := start.Truncate(time.Hour); h.Before(until); h = h.Add(time.Hour) {
			a, b := maxTime(start, h), minTime(until, h.Add(time.Hour))
			if b.After(a) {
				get(z.Tenant, h).StorageByteHours += float64(z.Bytes) * b.Sub(a).Hours()
			}
		}
	}

	list := make([]UsageHour, 0, len(out))
	for _, u := range out {
		list = append(list, *u)
	}
	sort.Slice(list, func(i, j int) bool {
		if list[i].Tenant != list[j].Tenant {
			return list[i].Tenant < list[j].Tenant
		}
		return list[i].Hour.Before(list[j].Hour)
	})
	return list, nil
}

func maxTime(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

func minTime(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}
