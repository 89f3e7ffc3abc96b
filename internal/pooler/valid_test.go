package pooler

import (
	"math/rand/v2"
	"regexp"
	"strings"
	"testing"
)

// TestValidNameAndVerifier_AsTheRegexps: the hand-written checks accept
// exactly what the regular expressions they replace accept, on the edges
// of each part and on random strings made of the parts' bytes.
func TestValidNameAndVerifier_AsTheRegexps(t *testing.T) {
	nameRE := regexp.MustCompile(`^[a-z][a-z0-9_]{0,62}$`)
	verifierRE := regexp.MustCompile(`^SCRAM-SHA-256\$[0-9]{1,7}:[A-Za-z0-9+/=]{1,100}\$[A-Za-z0-9+/=]{1,100}:[A-Za-z0-9+/=]{1,100}$`)
	good := AdminVerifier("pw", "/x")
	names := []string{"", "a", "t_", "_a", "9a", "A", "a-b", "a\x00", "é", strings.Repeat("a", 63), strings.Repeat("a", 64), "t_abc123", "t_abc'", "a b"}
	b64 := strings.Repeat("A", 100)
	const b64chars = "ABCXYZabcxyz0189+/="
	verifiers := []string{"", good, good + "\n", " " + good, "SCRAM-SHA-256$", "SCRAM-SHA-256$1:a$b:c", "SCRAM-SHA-256$:a$b:c",
		"SCRAM-SHA-256$1234567:a$b:c", "SCRAM-SHA-256$12345678:a$b:c", "SCRAM-SHA-256$1:" + b64 + "$" + b64 + ":" + b64,
		"SCRAM-SHA-256$1:" + b64 + "A$b:c", "SCRAM-SHA-256$1:a$b:" + b64 + "A", "SCRAM-SHA-256$1:a$$b:c", "SCRAM-SHA-256$1:a$b::c",
		"SCRAM-SHA-256$1:a$b:c:", "SCRAM-SHA-256$1:a$b", "SCRAM-SHA-256$1:a:b$c", "scram-sha-256$1:a$b:c", "SCRAM-SHA-256$1:a=+/$b:c\"",
		"md5" + strings.Repeat("0", 32), "SCRAM-SHA-256$1:a$b:c$"}
	r := rand.New(rand.NewPCG(1, 2))
	pick := func(alphabet string, n int) string {
		var b strings.Builder
		for range n {
			b.WriteByte(alphabet[r.IntN(len(alphabet))])
		}
		return b.String()
	}
	for range 20000 {
		names = append(names, pick("az09_A-", 1+r.IntN(66)))
		verifiers = append(verifiers, "SCRAM-SHA-256$"+pick("0123456789:$aZ+/=", 1+r.IntN(40)),
			// the verifier's shape, each part's length around its limits,
			// now and then a byte out of its class
			"SCRAM-SHA-256$"+pick("0123456789", r.IntN(9))+":"+pick(b64chars, 99+r.IntN(3)*r.IntN(2))+"$"+
				pick(b64chars, r.IntN(102))+":"+pick(b64chars+"$:", r.IntN(3)))
	}
	matched := 0
	for _, v := range verifiers {
		if verifierRE.MatchString(v) {
			matched++
		}
	}
	if matched < 1000 {
		t.Fatalf("only %d of the verifiers tried are valid: the test needs both kinds", matched)
	}
	for _, n := range names {
		if got, want := validName(n), nameRE.MatchString(n); got != want {
			t.Errorf("validName(%q) = %v, the regexp says %v", n, got, want)
		}
	}
	for _, v := range verifiers {
		if got, want := ValidVerifier(v), verifierRE.MatchString(v); got != want {
			t.Errorf("ValidVerifier(%q) = %v, the regexp says %v", v, got, want)
		}
	}
}
