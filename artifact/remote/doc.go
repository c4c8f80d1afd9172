// Package remote is modelpack's one registry layer: every request to a registry, from a pull, a push, a login or a
// signature check, is configured here. It owns
//
//   - endpoints: the origin and its hosts.toml mirrors, in the order reads try them, with their capabilities
//     (hosts.go), and which reads a mirror may serve (endpoint.serves);
//   - TLS: CA files, client certificates and skip-verify of each endpoint (tlsConfig), and the one HTTP transport
//     builder (httpTransport), with the origin's request retries (transfer.RequestRetry; none at a mirror), limits
//     on documents and guarded dials;
//   - plain HTTP: an endpoint speaks http only for Options.PlainHTTP, a host in Options.PlainHTTPHosts or a
//     hosts.toml URL in http://, and never falls back from https;
//   - credentials: a request's own (WithCredential, a volume's pull secret), then Options.Credential, then the
//     docker config and its helpers (credentialFunc, Transports.Credential);
//   - mirror fallback: blob reads through package transfer (a mirror's error moves on at once, the origin is
//     retried), manifest reads through firstOf, and Transports' RoundTripper
//     (mirrorTransport) for clients that speak the registry protocol themselves (signing's cosign adapter,
//     through go-containerregistry).
//
// It is built on oras-go: the registry protocol, token dance, referrers API (with the referrers-tag fallback) and
// credential helpers are oras-go's; this package adds what a model transport needs on top of them: mirrors with
// fallback to the origin, blob reads that resume with HTTP Range (the transfer seam, with its one retry policy),
// HEAD-skipping of blobs the registry already has, cross-repository mounts, and errors that name the registry,
// repository and cause.
package remote
