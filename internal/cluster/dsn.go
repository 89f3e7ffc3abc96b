package cluster

import (
	"fmt"
	"net"
	"net/url"
	"strconv"
	"strings"
)

// WithHostPort returns dsn (a URL or key=value DSN) pointed at host:port,
// everything else kept: the role, password, database and options. A
// cluster whose primary moves (a Patroni failover) keeps its credentials
// and settings; only where it connects changes. Any host, hostaddr or port
// the DSN had, several of them included, is replaced.
func WithHostPort(dsn, host string, port int) (string, error) {
	if host == "" || port <= 0 || port > 65535 {
		return "", fmt.Errorf("point a dsn at %q port %d: bad host or port", host, port)
	}
	if u, err := url.Parse(dsn); err == nil && (u.Scheme == "postgres" || u.Scheme == "postgresql") {
		u.Host = net.JoinHostPort(host, strconv.Itoa(port))
		q := u.Query()
		if q.Has("host") || q.Has("hostaddr") || q.Has("port") {
			q.Del("host")
			q.Del("hostaddr")
			q.Del("port")
			u.RawQuery = q.Encode()
		}
		return u.String(), nil
	}
	pairs, err := splitKeywords(dsn)
	if err != nil {
		return "", fmt.Errorf("point a dsn at %s:%d: %s", host, port, RedactError(err, dsn))
	}
	var b strings.Builder
	fmt.Fprintf(&b, "host=%s port=%d", quoteValue(host), port)
	for _, kv := range pairs {
		switch kv[0] {
		case "host", "hostaddr", "port":
			continue
		}
		fmt.Fprintf(&b, " %s=%s", kv[0], quoteValue(kv[1]))
	}
	return b.String(), nil
}

// splitKeywords parses a key=value DSN (libpq's syntax: values quoted with
// single quotes, \' and \\ escaped) into its pairs, in order.
func splitKeywords(dsn string) ([][2]string, error) {
	var out [][2]string
	s := strings.TrimSpace(dsn)
	for s != "" {
		eq := strings.IndexByte(s, '=')
		if eq <= 0 {
			// Not quoted: the rest may hold a password.
			return nil, fmt.Errorf("bad dsn: a keyword without =")
		}
		key := strings.TrimSpace(s[:eq])
		s = strings.TrimLeft(s[eq+1:], " \t\n")
		// A value ends at an unescaped quote (quoted) or at a space; a
		// backslash escapes the next character in both.
		quoted := strings.HasPrefix(s, "'")
		i := 0
		if quoted {
			i = 1
		}
		var val strings.Builder
		closed := !quoted
		for ; i < len(s); i++ {
			c := s[i]
			if c == '\\' && i+1 < len(s) {
				i++
				val.WriteByte(s[i])
				continue
			}
			if quoted && c == '\'' {
				closed = true
				i++
				break
			}
			if !quoted && (c == ' ' || c == '\t' || c == '\n') {
				break
			}
			val.WriteByte(c)
		}
		if !closed {
			return nil, fmt.Errorf("bad dsn: unterminated quoted value of %s", key)
		}
		s = s[i:]
		out = append(out, [2]string{key, val.String()})
		s = strings.TrimLeft(s, " \t\n")
	}
	return out, nil
}

// quoteValue quotes a key=value DSN value when it needs it.
func quoteValue(v string) string {
	if v != "" && !strings.ContainsAny(v, ` '\`+"\t\n") {
		return v
	}
	return "'" + strings.NewReplacer(`\`, `\\`, `'`, `\'`).Replace(v) + "'"
}
