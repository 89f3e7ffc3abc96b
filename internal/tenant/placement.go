package tenant

import (
	"cmp"
	"errors"
	"fmt"
	"slices"
	"strings"
)

// ErrNoCapacity says no cluster admits the tenant: every one is draining,
// at one of its caps, without the label the tier asks for, taken by a
// dedicated tenant, or out of connections.
var ErrNoCapacity = errors.New("no cluster admits this tenant")

// Candidate is one cluster as placement sees it: its load and the policy
// set on it (docs/operations/placement.md).
type Candidate struct {
	Name      string
	Tenants   int   // tenants it holds (spares not counted)
	SizeBytes int64 // their sizes, as the metrics collector last stored them
	// Caps: 0 is no cap.
	MaxTenants   int
	MaxSizeBytes int64
	Labels       map[string]string
	Draining     bool
	// Dedicated: it holds a tenant of a dedicated tier, which shares its
	// cluster with no one.
	Dedicated bool
	// Conns is its connections, nil when admission is off; Share what the
	// tenant would hold of them there (it depends on the cluster's pooler).
	Conns *Connections
	Share int
}

// Need is what a tenant asks of its cluster.
type Need struct {
	Tier       string
	Dedicated  bool     // the tier's placement: dedicated
	Label      string   // the tier's cluster_label, k=v ("" = any)
	Pins       []string // the tenant's own pins, labels k=v its cluster must carry
	SizeBytes  int64    // the tenant's size (0 for a new tenant)
	Overcommit float64
}

// Refusal is why cluster c does not admit a tenant with need n ("" when it
// does), with the fix, for an error an operator can act on.
func Refusal(c Candidate, n Need) string {
	switch {
	case c.Draining:
		return fmt.Sprintf("%s is draining (`pgtenant cluster undrain %s` to place tenants there again)", c.Name, c.Name)
	case c.Dedicated:
		return fmt.Sprintf("%s holds a tenant of a dedicated tier", c.Name)
	case n.Dedicated && c.Tenants > 0:
		return fmt.Sprintf("%s holds %d tenants and tier %s needs a cluster of its own", c.Name, c.Tenants, n.Tier)
	}
	if n.Label != "" && len(MissingPins(c.Labels, []string{n.Label})) > 0 {
		return fmt.Sprintf("%s lacks label %s that tier %s asks for (`pgtenant cluster set %s --label %s`)", c.Name, n.Label, n.Tier, c.Name, n.Label)
	}
	if missing := MissingPins(c.Labels, n.Pins); len(missing) > 0 {
		return fmt.Sprintf("%s lacks label %s that the tenant is pinned to (`pgtenant cluster set %s --label %s`)", c.Name, missing[0], c.Name, missing[0])
	}
	if c.MaxTenants > 0 && c.Tenants+1 > c.MaxTenants {
		return fmt.Sprintf("%s is at its cap of %d tenants (`pgtenant cluster set %s --max-tenants N`)", c.Name, c.MaxTenants, c.Name)
	}
	if c.MaxSizeBytes > 0 && (c.SizeBytes >= c.MaxSizeBytes || c.SizeBytes+n.SizeBytes > c.MaxSizeBytes) {
		return fmt.Sprintf("%s holds %d of its cap of %d bytes and the tenant is %d bytes (`pgtenant cluster set %s --max-size SIZE`)",
			c.Name, c.SizeBytes, c.MaxSizeBytes, n.SizeBytes, c.Name)
	}
	if c.Conns != nil && n.Overcommit > 0 && !c.Conns.Admits(c.Share, n.Overcommit) {
		return fmt.Sprintf("%s has no connections left for a tenant needing %d (limits add up to %d of %d; raise max_connections, "+
			"lower tier %s's connection_limit, or raise provision.connection_overcommit, now %g)",
			c.Name, c.Share, c.Conns.Used, c.Conns.Capacity(n.Overcommit), n.Tier, n.Overcommit)
	}
	return ""
}

// Less orders clusters by load: fewest tenants, then smallest size, then
// name (so that placement is deterministic).
func Less(a, b Candidate) int {
	return cmp.Or(cmp.Compare(a.Tenants, b.Tenants), cmp.Compare(a.SizeBytes, b.SizeBytes), cmp.Compare(a.Name, b.Name))
}

// Place chooses the least loaded cluster that admits a tenant with need n,
// or says, cluster by cluster, why none does.
func Place(cands []Candidate, n Need) (string, error) {
	if len(cands) == 0 {
		return "", errors.New("no cluster registered: add one with `pgtenant cluster add` or start `pgtenant up`")
	}
	var ok []Candidate
	var why []string
	for _, c := range cands {
		if r := Refusal(c, n); r != "" {
			why = append(why, r)
			continue
		}
		ok = append(ok, c)
	}
	if len(ok) == 0 {
		fix := "add a cluster (`pgtenant cluster add`, or `pgtenant up --clusters N`)"
		return "", fmt.Errorf("%w: a tenant of tier %s fits nowhere: %s; or %s", ErrNoCapacity, n.Tier, strings.Join(why, "; "), fix)
	}
	return slices.MinFunc(ok, Less).Name, nil
}

// MissingPins are the pins (labels k=v) a cluster with labels lacks.
func MissingPins(labels map[string]string, pins []string) []string {
	var out []string
	for _, p := range pins {
		k, v, _ := strings.Cut(p, "=")
		if got, ok := labels[k]; !ok || got != v {
			out = append(out, p)
		}
	}
	return out
}
