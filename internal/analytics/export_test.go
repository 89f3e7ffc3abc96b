package analytics

import "time"

// ForwardParam and ForwardSecret name the forwarding proof's startup
// parameter and the catalog secret it is made with.
const (
	ForwardParam  = forwardParam
	ForwardSecret = forwardSecret
)

// ForwardToken makes a forwarding proof (for the hostile tests' forgeries).
func ForwardToken(key []byte, id, addr string, exp time.Time) string {
	return forwardToken(key, id, addr, exp)
}
