package doctor

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"strings"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgtenant/pgtenant/internal/cluster"
	"github.com/pgtenant/pgtenant/internal/config"
)

// TierExtension is one extension a tier lets its database tenants create
// (tiers.X.extensions), as the cluster has it.
type TierExtension struct {
	Tier, Name string
	Available  bool // the server has it (pg_available_extension_versions)
	Trusted    bool // a version of it is trusted: a tenant, not being superuser, may create it
}

// tierExtensionFacts reads, for every extension the tiers list, whether
// the cluster has it and whether it is trusted.
func tierExtensionFacts(ctx context.Context, admin *pgxpool.Pool, tiers map[string]config.Tier) ([]TierExtension, error) {
	var names []string
	for _, t := range tiers {
		for _, e := range t.Extensions {
			if !slices.Contains(names, e) {
				names = append(names, e)
			}
		}
	}
	if len(names) == 0 {
		return nil, nil
	}
	trusted, err := cluster.ExtensionTrust(ctx, admin, names)
	if err != nil {
		return nil, err
	}
	var out []TierExtension
	for tier, t := range tiers {
		for _, e := range t.Extensions {
			tr, ok := trusted[e]
			out = append(out, TierExtension{Tier: tier, Name: e, Available: ok, Trusted: tr})
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Tier+"\x00"+out[i].Name < out[j].Tier+"\x00"+out[j].Name })
	return out, nil
}

// tierExtensions: each extension a tier lists is one its tenants can
// create on this cluster: installed, and trusted.
func tierExtensions(exts []TierExtension) Check {
	c := Check{Name: "tier_extensions", Status: OK, Want: "every extension a tier lists installed on the server and trusted",
		Why: "A database tenant creates the extensions its tier lists itself (docs/tiers.md#extensions). One the server has not " +
			"got fails at CREATE EXTENSION; an untrusted one would need a superuser, which a tenant never is: listed, it only misleads."}
	var bad, got []string
	for _, e := range exts {
		switch {
		case !e.Available:
			bad = append(bad, fmt.Sprintf("tier %s lists %s, which the server has not installed", e.Tier, e.Name))
		case !e.Trusted:
			bad = append(bad, fmt.Sprintf("tier %s lists %s, which is not trusted: no tenant can create it", e.Tier, e.Name))
		default:
			got = append(got, e.Tier+": "+e.Name)
		}
	}
	if len(bad) > 0 {
		c.Status, c.Got = Warn, strings.Join(bad, "; ")
		c.Fix = "install the missing ones on the server (a contrib or an extension package), and take untrusted ones and typos out of tiers.X.extensions"
		return c
	}
	c.Got = strings.Join(got, ", ")
	return c
}
