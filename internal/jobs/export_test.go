package jobs

// The statements of History and AtWork, for their plans.
const (
	HistoryQuery = historyQuery
	AtWorkQuery  = atWorkQuery
	PruneQuery   = pruneQuery
)

// ListQuery is List's statement for f.
func ListQuery(f Filter) (string, []any) { return listQuery(f) }
