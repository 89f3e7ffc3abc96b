package backup

import (
	"context"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sync/errgroup"
)

// Collector exports each backed-up cluster's backups on /metrics: the age
// of its newest backup of each type, the archive lag, the repository's
// size and whether archiving is failing. Each scrape runs one query on
// the primary per cluster and reads `pgbackrest info` at most once per
// infoTTL (at once after this daemon changed the repository), infoParallel
// clusters at a time; the repository's size is walked at most once a
// minute.
type Collector struct {
	s     *Service
	sizes sizeCache
	infos infoCache

	up, age, lag, failing, failures, size, running *prometheus.Desc
}

// NewCollector returns the backups collector of s. Without stanzas it
// exports nothing (it describes its series all the same).
func NewCollector(s *Service) *Collector {
	c := []string{"cluster"}
	return &Collector{s: s,
		up: prometheus.NewDesc("pgtenant_backup_up",
			"1 if the cluster's pgBackRest repository could be read (pgbackrest info), 0 if not.", c, nil),
		age: prometheus.NewDesc("pgtenant_backup_last_age_seconds",
			"Seconds since the newest backup of each type (full, diff, incr) of the cluster stopped.", []string{"cluster", "type"}, nil),
		lag: prometheus.NewDesc("pgtenant_backup_archive_lag_bytes",
			"WAL bytes written on the primary past the end of the newest segment in the repository (pg_current_wal_lsn against pgbackrest info's newest archived segment): what a lost primary would lose.", c, nil),
		failing: prometheus.NewDesc("pgtenant_backup_archive_failing",
			"1 if the primary's last archive attempt failed (pg_stat_archiver: last_failed_time newer than last_archived_time).", c, nil),
		failures: prometheus.NewDesc("pgtenant_backup_archive_failures_total",
			"Failed archive_command runs on the primary since its statistics were reset (pg_stat_archiver.failed_count).", c, nil),
		size: prometheus.NewDesc("pgtenant_backup_repository_size_bytes",
			"Bytes the cluster's repository takes on disk: backups and archived WAL (walked again at each new or expired backup, else at most once a minute).", c, nil),
		running: prometheus.NewDesc("pgtenant_backup_running",
			"1 while a backup of the cluster holds pgBackRest's lock.", c, nil),
	}
}

// Describe implements prometheus.Collector.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.up, c.age, c.lag, c.failing, c.failures, c.size, c.running} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	now := time.Now()
	var g errgroup.Group
	g.SetLimit(infoParallel)
	for _, n := range c.s.clusters() {
		g.Go(func() error {
			c.collectCluster(ctx, ch, n, now)
			return nil
		})
	}
	_ = g.Wait()
}

// collectCluster sends one cluster's series.
func (c *Collector) collectCluster(ctx context.Context, ch chan<- prometheus.Metric, n string, now time.Time) {
	gauge := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}
	st := c.s.Stanzas[n]
	info, err := c.infos.get(ctx, st)
	if err != nil {
		gauge(c.up, 0, n)
		return
	}
	gauge(c.up, 1, n)
	if size, err := c.sizes.get(st, info); err == nil {
		gauge(c.size, float64(size), n)
	}
	gauge(c.running, b2f(info.Running), n)
	for _, typ := range []string{Full, Diff, Incr} {
		if b := newest(info, typ); b != nil {
			gauge(c.age, now.Sub(b.Stop).Seconds(), n, typ)
		}
	}
	if !c.answered(n) {
		return
	}
	a, err := c.s.Archiver(ctx, n)
	if err != nil {
		return // the primary is down: the cluster collector says so
	}
	gauge(c.failing, b2f(a.Failing()), n)
	ch <- prometheus.MustNewConstMetric(c.failures, prometheus.CounterValue, float64(a.FailedCount), n)
	if lag, ok := ArchiveLag(info, a); ok {
		gauge(c.lag, float64(lag), n)
	}
}

const (
	// infoTTL is how old the pgbackrest info behind a scrape may be. Each
	// read runs a process (20–30 ms): a daemon backing up 200 clusters
	// would otherwise spend seconds of every scrape on them.
	infoTTL = 15 * time.Second
	// infoParallel is how many clusters a scrape reads at once.
	infoParallel = 4
)

// infoCache keeps each stanza's info for infoTTL, or until the stanza ran
// another command than info (a backup, an expire) in this daemon.
// Another daemon's backup shows within infoTTL.
type infoCache struct {
	mu sync.Mutex
	m  map[*Stanza]infoAt
}

type infoAt struct {
	info    Info
	err     error
	at      time.Time
	changes int64
}

func (c *infoCache) get(ctx context.Context, st *Stanza) (Info, error) {
	changes := st.changes.Load()
	c.mu.Lock()
	v, ok := c.m[st]
	c.mu.Unlock()
	if ok && time.Since(v.at) < infoTTL && v.changes == changes {
		return v.info, v.err
	}
	info, err := st.Info(ctx)
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.m == nil {
		c.m = map[*Stanza]infoAt{}
	}
	c.m[st] = infoAt{info: info, err: err, at: time.Now(), changes: changes}
	return info, err
}

// answered says whether the cluster's primary answered its last probe
// (or was not probed yet): a scrape does not wait on one that did not, on
// each of a fleet's clusters down (the cluster collector says so).
func (c *Collector) answered(name string) bool {
	if c.s.Clusters == nil {
		return true // Archiver says why it cannot read
	}
	cl, err := c.s.Clusters.Get(name)
	return err == nil && cl.Answering()
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
