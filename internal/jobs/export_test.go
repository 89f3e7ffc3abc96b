package jobs

// The statements of History and AtWork, for their plans.
const (
	HistoryQuery = historyQuery
	AtWorkQuery  = atWorkQuery
)
