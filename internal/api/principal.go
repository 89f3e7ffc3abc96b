package api

import (
	"context"
	"net/http"
)

// Principal is whom a bearer token names: the admin token (TokenID nil,
// Actor "admin token") or a live scoped token (its id, its name as the
// audit log writes it, its scope).
type Principal struct {
	TokenID *int64
	Actor   string
	Scope   Scope
}

// Authenticate checks token exactly as every request's "Authorization:
// Bearer" header is checked (authenticate: the admin token in constant
// time, else a live scoped token by its hash, no cache) and says whose it
// is. A missing, wrong, revoked or expired token is ErrUnauthorized; a
// catalog that does not answer is another error. The console calls it at
// login and again at each of its requests, so that a token revoked while
// a console session lives is refused at the session's next request.
func (s *Server) Authenticate(ctx context.Context, token string) (Principal, error) {
	r, err := http.NewRequestWithContext(ctx, http.MethodGet, "/", nil)
	if err != nil {
		return Principal{}, err
	}
	r.Header.Set("Authorization", "Bearer "+token)
	p, err := s.authenticate(r)
	if err != nil {
		return Principal{}, err
	}
	return Principal{TokenID: p.tokenID, Actor: p.actor, Scope: p.scope}, nil
}
