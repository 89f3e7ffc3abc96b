package api

import (
	"net/http"

	"github.com/pgtenant/pgtenant/internal/catalog"
)

// CreateCredentialRequest asks POST /v1/tenants/{id}/credentials for
// another login of the tenant.
type CreateCredentialRequest struct {
	Name     string `json:"name"`
	ReadOnly bool   `json:"read_only,omitempty"`
	Replica  bool   `json:"replica,omitempty"` // served by a standby: read-only
}

// CredentialResponse answers a new login or a rotated one: its password
// and DSN are shown only here.
type CredentialResponse struct {
	Credential catalog.Login `json:"credential"`
	User       string        `json:"user"` // the login's role
	Password   string        `json:"password"`
	DSN        string        `json:"dsn"`
}

// createCredential gives a tenant another login (POST /v1/tenants/{id}/credentials).
func (s *Server) createCredential(w http.ResponseWriter, r *http.Request) error {
	var req CreateCredentialRequest
	if err := decode(r, &req); err != nil {
		return err
	}
	if req.Name == "" {
		return invalid("name: the credential's name is required (a lowercase letter, then up to 19 lowercase letters and digits)")
	}
	out, err := s.Credentials.CreateLogin(r.Context(), r.PathValue("id"), catalog.Login{Name: req.Name, ReadOnly: req.ReadOnly, Replica: req.Replica})
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusCreated, CredentialResponse{Credential: out.Login, User: out.Role, Password: out.Password, DSN: out.DSN})
	return nil
}

// listCredentials lists a tenant's logins (GET /v1/tenants/{id}/credentials).
func (s *Server) listCredentials(w http.ResponseWriter, r *http.Request) error {
	ls, err := s.Credentials.Logins(r.Context(), r.PathValue("id"))
	if err != nil {
		return err
	}
	if ls == nil {
		ls = []catalog.Login{}
	}
	writeJSON(w, http.StatusOK, ls)
	return nil
}

// rotateCredential gives a login a new password
// (POST /v1/tenants/{id}/credentials/{name}/password).
func (s *Server) rotateCredential(w http.ResponseWriter, r *http.Request) error {
	out, err := s.Credentials.RotateLogin(r.Context(), r.PathValue("id"), r.PathValue("name"))
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, CredentialResponse{Credential: out.Login, User: out.Role, Password: out.Password, DSN: out.DSN})
	return nil
}

// revokeCredential drops a login and answers the tenant's remaining ones
// (DELETE /v1/tenants/{id}/credentials/{name}).
func (s *Server) revokeCredential(w http.ResponseWriter, r *http.Request) error {
	id := r.PathValue("id")
	if err := s.Credentials.RevokeLogin(r.Context(), id, r.PathValue("name")); err != nil {
		return err
	}
	return s.listCredentials(w, r)
}
