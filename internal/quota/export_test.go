package quota

import (
	"context"

	"github.com/pgtenant/pgtenant/internal/cluster"
)

// SettingsLockSpace is the advisory lock space of the settings passes.
const SettingsLockSpace uint32 = settingsLockSpace

// SettingsPass is one cluster's settings pass as Run makes it: whether it
// ran, and its error.
func (c *Capper) SettingsPass(ctx context.Context, cl *cluster.Cluster) (bool, error) {
	return c.settingsPass(ctx, cl)
}
