package main

import (
	"net/http"

	"github.com/go-chi/chi/v5"

	"github.com/hubmesh/hub/api"
)

// adminHandler composes the admin port: the REST API with health, readiness
// and metrics (package api, with its own bearer-token auth) and, on every
// other path, the dashboard (package web, with its sessions, CSRF and
// cross-origin checks). A panic in either answers 500 (api.Mount's
// recoverer covers the whole router).
func adminHandler(apiCfg api.Config, dashboard http.Handler) http.Handler {
	r := chi.NewRouter()
	api.Mount(r, apiCfg)
	r.Mount("/", dashboard)
	return r
}
