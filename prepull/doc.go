// Package prepull warms a node before pods ask for a model. The CSI driver serves a small HTTP+JSON API on a
// unix socket (Serve); clients (the CLI, and the prepull DaemonSet in watch mode) add references, replace named
// lists, cancel entries and follow progress through Client. Whatever is listed is pulled through the same Backend
// the driver mounts from, checked against the same trust policy first, and pinned so cache GC keeps it until the
// entry leaves its list.
//
// The Backend of a real node is cachebackend's Prepuller: the driver's own backend, with the bandwidth cap of
// --prepull-bandwidth. Here: backend.go is that interface, manager.go runs the entries (concurrency, retries,
// pins), entry.go is an entry and its pin's name, server.go and client.go are the API's two ends, list.go reads
// list files, watch.go follows a ConfigMap.
//
// HTTP API (all bodies JSON):
//
//	GET    /v1/prepulls?list=L&since=V  snapshot of entries; with since, waits (≤30s) until the version passes V
//	POST   /v1/prepulls                 {"list":L,"refs":[…]}  add entries (a failed entry is retried)
//	PUT    /v1/lists/{list}             {"refs":[…]}           make list L exactly these refs; the rest is cancelled and unpinned
//	DELETE /v1/prepulls?list=L&ref=R    cancel one entry and unpin it
//	GET    /v1/cache                    cache entries and their owners, as the backend reports them
package prepull
