package signing

import (
	"context"
	"time"
)

// DefaultWatchInterval is how often WatchPolicy looks at the policy when given no interval.
const DefaultWatchInterval = 5 * time.Second

// WatchPolicy reloads the policy file every interval until ctx ends. It compares content, not file events, so
// the symlink swap of an updated ConfigMap and a rotated key file (the version hashes every file a policy
// loads) are both seen. An invalid policy is logged once and the last good one stays in force.
func (v *Verifier) WatchPolicy(ctx context.Context, path string, interval time.Duration) {
	if interval <= 0 {
		interval = DefaultWatchInterval
	}
	t := time.NewTicker(interval)
	defer t.Stop()
	var lastErr string
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		cur := v.Policy()
		p, err := LoadPolicy(path)
		if err != nil {
			if err.Error() != lastErr {
				v.log().Error("invalid policy, keeping the previous one", "path", path, "version", cur.Version(), "err", err)
				lastErr = err.Error()
			}
			continue
		}
		lastErr = ""
		if p.Version() != cur.Version() {
			v.SetPolicy(p)
			v.log().Info("policy reloaded", "path", path, "old", cur.Version(), "new", p.Version())
		}
	}
}
