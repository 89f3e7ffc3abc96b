package cluster_test

import (
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/pgtenant/pgtenant/internal/cluster"
)

// TestWithHostPort_KeepsEverythingButWhere: a URL or key=value DSN pointed
// at another host and port keeps its role, password (quoted, escaped),
// database and options, and loses every host and port it had.
func TestWithHostPort_KeepsEverythingButWhere(t *testing.T) {
	for _, dsn := range []string{
		"postgres://admin:s%20cret@10.0.0.1:5432/app?sslmode=disable&application_name=x",
		"postgresql://admin:s%20cret@h1:5432,h2:5433/app?sslmode=disable&application_name=x&port=7",
		`host=10.0.0.1 port=5432 user=admin password='s cret' dbname=app sslmode=disable application_name=x`,
		`host=h1,h2 port=1,2 hostaddr=10.0.0.9 user=admin password=s\ cret dbname=app  sslmode=disable application_name=x`,
	} {
		got, err := cluster.WithHostPort(dsn, "127.0.0.1", 6543)
		if err != nil {
			t.Fatalf("%s: %v", cluster.RedactDSN(dsn), err)
		}
		cc, err := pgx.ParseConfig(got)
		if err != nil {
			t.Fatalf("%s: parse %s: %v", dsn, got, err)
		}
		if cc.Host != "127.0.0.1" || cc.Port != 6543 || len(cc.Fallbacks) != 0 || cc.User != "admin" || cc.Password != "s cret" ||
			cc.Database != "app" || cc.TLSConfig != nil || cc.RuntimeParams["application_name"] != "x" {
			t.Errorf("%s → %s: got host %s port %d (%d fallbacks) user %s password %q db %s tls %v app %q",
				dsn, got, cc.Host, cc.Port, len(cc.Fallbacks), cc.User, cc.Password, cc.Database, cc.TLSConfig != nil, cc.RuntimeParams["application_name"])
		}
	}
	if _, err := cluster.WithHostPort("host=x password='unterminated", "h", 1); err == nil {
		t.Error("unterminated quote: got no error")
	}
}
