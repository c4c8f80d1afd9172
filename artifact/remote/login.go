package remote

import (
	"context"
	"fmt"

	"oras.land/oras-go/v2/registry/remote"
	"oras.land/oras-go/v2/registry/remote/auth"
	"oras.land/oras-go/v2/registry/remote/credentials"
)

// Login checks cred against the registry (host[:port]) and saves it in the docker config named by
// opts.RegistryConfig — in its credential helper or credsStore when one is configured, as docker does.
func Login(ctx context.Context, host string, cred auth.Credential, opts Options) error {
	store, err := NewCredentialStore(opts.RegistryConfig)
	if err != nil {
		return fmt.Errorf("registry config: %w", err)
	}
	reg, err := newRegistry(host, opts)
	if err != nil {
		return err
	}
	if err := credentials.Login(ctx, store, reg, cred); err != nil {
		return wrapErr("login", host, "", "", opts.Hints, err)
	}
	return nil
}

// Logout removes the registry's credential from the docker config (or its helper).
// It reports whether there were credentials to remove.
func Logout(ctx context.Context, host string, opts Options) (bool, error) {
	store, err := NewCredentialStore(opts.RegistryConfig)
	if err != nil {
		return false, fmt.Errorf("registry config: %w", err)
	}
	cred, err := store.Get(ctx, credentials.ServerAddressFromHostname(host))
	if err != nil {
		return false, wrapErr("logout", host, "", "", opts.Hints, err)
	}
	if cred == (auth.Credential{}) {
		return false, nil
	}
	if err := credentials.Logout(ctx, store, host); err != nil {
		return false, wrapErr("logout", host, "", "", opts.Hints, err)
	}
	return true, nil
}

// newRegistry returns an oras-go registry client for host configured like the origin endpoint of a Repository.
func newRegistry(host string, opts Options) (*remote.Registry, error) {
	reg, err := remote.NewRegistry(host)
	if err != nil {
		return nil, fmt.Errorf("invalid registry %q: %w", host, err)
	}
	eps, err := loadEndpoints(opts, host)
	if err != nil {
		return nil, err
	}
	origin := eps[len(eps)-1]
	hc, err := httpClient(opts, origin, host, true)
	if err != nil {
		return nil, err
	}
	reg.PlainHTTP = origin.scheme == "http"
	reg.Client = authClient(hc, nil, auth.NewCache(), opts.UserAgent)
	return reg, nil
}
