package daemon_test

import (
	"net/url"
	"testing"
)

func pgPassword(t *testing.T) string {
	u, err := url.Parse(pg.PrimaryDSN("postgres"))
	if err != nil {
		t.Fatal(err)
	}
	pw, _ := u.User.Password()
	return pw
}
