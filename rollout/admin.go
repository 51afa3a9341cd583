package rollout

import (
	"encoding/json"
	"errors"
	"net/http"
)

// AdminPath is where the admin endpoint serves rollouts: GET lists them (?model= narrows to one), POST
// AdminPath/{command}?model= runs an operator's command.
const AdminPath = "/v1/rollouts"

// AdminHeader must accompany every command (any value): a browser cannot send it cross-site without a CORS
// preflight, which this endpoint never grants, so a web page cannot steer a rollout through a loopback port.
const AdminHeader = "X-Infergate-Admin"

// Handler is the admin endpoint infergate serve exposes and the CLI talks to. It has no authentication of its
// own: serve binds it to loopback, or beyond only behind mutual TLS.
func (c *Controller) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET "+AdminPath, func(w http.ResponseWriter, r *http.Request) {
		all := c.Statuses()
		model := r.URL.Query().Get("model")
		if model == "" {
			writeJSON(w, http.StatusOK, all)
			return
		}
		for _, s := range all {
			if s.Model == model {
				writeJSON(w, http.StatusOK, []Status{s})
				return
			}
		}
		writeError(w, http.StatusNotFound, ErrNoRollout)
	})
	mux.HandleFunc("POST "+AdminPath+"/{command}", func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get(AdminHeader) == "" || r.Header.Get("Origin") != "" {
			writeError(w, http.StatusForbidden, errors.New("commands need the "+AdminHeader+" header and come from no web page"))
			return
		}
		cmd := Command(r.PathValue("command"))
		switch cmd {
		case Pause, Resume, Abort, Promote:
		default:
			writeError(w, http.StatusBadRequest, errors.New("the command must be pause, resume, abort or promote"))
			return
		}
		st, err := c.Command(r.Context(), r.URL.Query().Get("model"), cmd)
		switch {
		case errors.Is(err, ErrNoRollout):
			writeError(w, http.StatusNotFound, err)
		case errors.Is(err, ErrNotApplicable), errors.Is(err, ErrConflict):
			writeError(w, http.StatusConflict, err)
		case err != nil:
			writeError(w, http.StatusServiceUnavailable, err)
		default:
			writeJSON(w, http.StatusOK, st)
		}
	})
	return mux
}

// AdminError is the admin endpoint's error body.
type AdminError struct {
	Error string `json:"error"`
}

func writeError(w http.ResponseWriter, status int, err error) {
	writeJSON(w, status, AdminError{Error: err.Error()})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("content-type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}
