package prepull

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"time"

	"github.com/modelpack/modelpack/internal/unixsock"
)

// maxWait bounds a long poll so idle connections do not pile up behind a proxy or a slow client.
const maxWait = 30 * time.Second

// Serve runs the prepull API on the unix socket at path until ctx ends, then stops accepting, cancels running
// pulls (their pins stay) and returns. Pins an earlier run left are adopted first.
func Serve(ctx context.Context, path string, be Backend, opts Options) error {
	m := newManager(ctx, be, opts)
	if err := m.restore(ctx); err != nil {
		return err
	}
	defer m.close()
	// Whoever reaches the socket can make the node pull and pin: it is the driver's user's alone (package unixsock).
	l, err := unixsock.Listen(path, m.log)
	if err != nil {
		return fmt.Errorf("prepull: %w", err)
	}
	srv := &http.Server{
		Handler:           newHandler(m),
		ReadHeaderTimeout: 10 * time.Second,
		BaseContext:       func(net.Listener) context.Context { return ctx },
	}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(l) }()
	m.log.Info("prepull API listening", "socket", path, "concurrency", m.opts.Concurrency)
	select {
	case err := <-errc:
		return fmt.Errorf("prepull: %w", err)
	case <-ctx.Done():
	}
	shut, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	_ = srv.Shutdown(shut) // closes l, which removes the socket if it is still ours
	return nil
}

type request struct {
	List string   `json:"list,omitempty"`
	Refs []string `json:"refs"`
}

type apiError struct {
	Error string `json:"error"`
}

func newHandler(m *manager) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/prepulls", func(w http.ResponseWriter, r *http.Request) {
		list := r.URL.Query().Get("list")
		since := r.URL.Query().Get("since")
		if since == "" {
			writeJSON(w, http.StatusOK, m.snapshot(list))
			return
		}
		v, err := strconv.ParseUint(since, 10, 64)
		if err != nil {
			writeErr(w, http.StatusBadRequest, fmt.Errorf("since: %w", err))
			return
		}
		ctx, cancel := context.WithTimeout(r.Context(), maxWait)
		defer cancel()
		writeJSON(w, http.StatusOK, m.wait(ctx, list, v))
	})
	mux.HandleFunc("POST /v1/prepulls", func(w http.ResponseWriter, r *http.Request) {
		var req request
		if !readJSON(w, r, &req) {
			return
		}
		if req.List == "" {
			req.List = DefaultList
		}
		if err := m.add(req.List, req.Refs); err != nil {
			writeErr(w, http.StatusBadRequest, err)
			return
		}
		writeJSON(w, http.StatusOK, m.snapshot(req.List))
	})
	mux.HandleFunc("PUT /v1/lists/{list}", func(w http.ResponseWriter, r *http.Request) {
		var req request
		if !readJSON(w, r, &req) {
			return
		}
		list := r.PathValue("list")
		if err := m.setList(r.Context(), list, req.Refs); err != nil {
			code := http.StatusBadRequest
			if r.Context().Err() != nil {
				code = http.StatusServiceUnavailable
			}
			writeErr(w, code, err)
			return
		}
		writeJSON(w, http.StatusOK, m.snapshot(list))
	})
	mux.HandleFunc("DELETE /v1/prepulls", func(w http.ResponseWriter, r *http.Request) {
		q := r.URL.Query()
		list := q.Get("list")
		if list == "" {
			list = DefaultList
		}
		if err := m.remove(r.Context(), list, q.Get("ref")); err != nil {
			code := http.StatusServiceUnavailable
			if errors.Is(err, errNotFound) {
				code = http.StatusNotFound
			}
			writeErr(w, code, err)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	})
	mux.HandleFunc("GET /v1/cache", func(w http.ResponseWriter, r *http.Request) {
		entries, err := m.be.Cache(r.Context())
		if err != nil {
			writeErr(w, http.StatusInternalServerError, err)
			return
		}
		if entries == nil {
			entries = []CacheEntry{}
		}
		writeJSON(w, http.StatusOK, entries)
	})
	return mux
}

func readJSON(w http.ResponseWriter, r *http.Request, v any) bool {
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, 1<<20))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		writeErr(w, http.StatusBadRequest, fmt.Errorf("request body: %w", err))
		return false
	}
	return true
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v)
}

func writeErr(w http.ResponseWriter, code int, err error) {
	writeJSON(w, code, apiError{Error: err.Error()})
}
