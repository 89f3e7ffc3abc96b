package cluster

import (
	"net/url"
	"regexp"
	"strings"
)

var kvPassword = regexp.MustCompile(`(?i)(password\s*=\s*)('(?:[^'\\]|\\.)*'|\S+)`)

// RedactDSN hides the password of a URL or key=value DSN, for printing and
// logging. DSN passwords are never shown.
func RedactDSN(dsn string) string {
	if u, err := url.Parse(dsn); err == nil && (u.Scheme == "postgres" || u.Scheme == "postgresql") {
		if u.User != nil {
			if _, has := u.User.Password(); has {
				u.User = url.UserPassword(u.User.Username(), "xxxxx")
			}
		}
		q := u.Query()
		if q.Has("password") {
			q.Set("password", "xxxxx")
			u.RawQuery = q.Encode()
		}
		return u.String()
	}
	return kvPassword.ReplaceAllString(dsn, "${1}xxxxx")
}

// RedactError removes any trace of the DSN's password from an error message
// (pgx parse errors quote the DSN).
func RedactError(err error, dsn string) string {
	msg := err.Error()
	msg = strings.ReplaceAll(msg, dsn, RedactDSN(dsn))
	if u, perr := url.Parse(dsn); perr == nil && u.User != nil {
		if pw, ok := u.User.Password(); ok && pw != "" {
			msg = strings.ReplaceAll(msg, pw, "xxxxx")
		}
	}
	return msg
}
