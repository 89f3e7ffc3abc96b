package console

import (
	"crypto/rand"
	"encoding/base64"
	"sync"
	"time"

	"github.com/pgtenant/pgtenant/internal/api"
)

// maxSessions bounds the logins kept at once; past it the one nearest its
// expiry goes. Only a holder of a valid token can add one, so this guards
// against a script that logs in in a loop, not against strangers.
const maxSessions = 1000

// session is one login: its expiry, the token its pages' forms carry
// (CSRF: a form posted from elsewhere cannot know it), and the API token
// it logged in with, with whom that token named at login. Every API call
// made for the session carries that token, so the API checks it (and its
// scope) and audits the call as it does a call from the CLI; the token
// stays in this daemon's memory, never in the browser.
type session struct {
	exp   time.Time
	csrf  string
	token string
	who   api.Principal
}

// sessions are the console's logins: a random id (the cookie's only
// content) mapped to its expiry, CSRF token and API token. They live in this daemon's memory only:
// a restart logs everyone out, and daemons sharing a catalog do not share
// them (a load balancer in front of several needs sticky sessions). The
// zero value is ready to use.
type sessions struct {
	mu   sync.Mutex
	byID map[string]session
}

// newSessionID returns 256 random bits, URL-safe.
func newSessionID() string {
	b := make([]byte, 32)
	_, _ = rand.Read(b) // crypto/rand.Read never fails (it crashes the program instead)
	return base64.RawURLEncoding.EncodeToString(b)
}

// create starts a session of token (who) lasting ttl from now, first
// dropping expired ones.
func (s *sessions) create(now time.Time, ttl time.Duration, token string, who api.Principal) string {
	id := newSessionID()
	s.mu.Lock()
	defer s.mu.Unlock()
	s.pruneLocked(now)
	if s.byID == nil {
		s.byID = map[string]session{}
	}
	if len(s.byID) >= maxSessions {
		var oldest string
		for k, exp := range s.byID {
			if oldest == "" || exp.exp.Before(s.byID[oldest].exp) {
				oldest = k
			}
		}
		delete(s.byID, oldest)
	}
	s.byID[id] = session{exp: now.Add(ttl), csrf: newSessionID(), token: token, who: who}
	return id
}

// get returns a live session; an expired one is deleted. Expiry is
// absolute: using a session does not extend it.
func (s *sessions) get(id string, now time.Time) (session, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	ss, ok := s.byID[id]
	if ok && !now.Before(ss.exp) {
		delete(s.byID, id)
		return session{}, false
	}
	return ss, ok
}

// delete ends a session (logout); an unknown id is no error.
func (s *sessions) delete(id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.byID, id)
}

// len counts the sessions kept, expired ones not yet pruned included.
func (s *sessions) len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.byID)
}

func (s *sessions) pruneLocked(now time.Time) {
	for id, ss := range s.byID {
		if !now.Before(ss.exp) {
			delete(s.byID, id)
		}
	}
}
