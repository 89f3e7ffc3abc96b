package api

import (
	"errors"
	"fmt"
	"net/http"
)

// GET /v1/doctor?cluster=C
func (s *Server) doctor(w http.ResponseWriter, r *http.Request) error {
	if s.Doctor == nil {
		return errors.New("doctor is not wired in this daemon")
	}
	rep, err := s.Doctor.Run(r.Context(), r.URL.Query().Get("cluster"))
	if err != nil {
		return fmt.Errorf("doctor: %w", err)
	}
	writeJSON(w, http.StatusOK, rep)
	return nil
}
