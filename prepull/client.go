package prepull

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
)

// Client talks to the prepull API of the driver on this node.
type Client struct {
	hc     *http.Client
	socket string
}

// NewClient returns a client for the socket at path; nothing is dialled until the first call.
func NewClient(path string) *Client {
	var d net.Dialer
	return &Client{
		socket: path,
		hc: &http.Client{Transport: &http.Transport{
			DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
				return d.DialContext(ctx, "unix", path)
			},
		}},
	}
}

// Add puts refs on list (DefaultList when empty) and returns the list's entries.
func (c *Client) Add(ctx context.Context, list string, refs []string) (Snapshot, error) {
	var s Snapshot
	err := c.do(ctx, http.MethodPost, "/v1/prepulls", request{List: list, Refs: refs}, &s)
	return s, err
}

// SetList makes list hold exactly refs: new ones are pulled, the rest cancelled and unpinned.
func (c *Client) SetList(ctx context.Context, list string, refs []string) (Snapshot, error) {
	var s Snapshot
	if refs == nil {
		refs = []string{}
	}
	err := c.do(ctx, http.MethodPut, "/v1/lists/"+url.PathEscape(list), request{Refs: refs}, &s)
	return s, err
}

// Remove cancels ref on list and unpins it.
func (c *Client) Remove(ctx context.Context, list, ref string) error {
	q := url.Values{"list": {list}, "ref": {ref}}
	return c.do(ctx, http.MethodDelete, "/v1/prepulls?"+q.Encode(), nil, nil)
}

// Entries returns the entries of list (every list when empty). With since > 0 it waits, up to the server's
// bound, for a version newer than since, so a caller can follow progress without busy polling.
func (c *Client) Entries(ctx context.Context, list string, since uint64) (Snapshot, error) {
	q := url.Values{}
	if list != "" {
		q.Set("list", list)
	}
	if since > 0 {
		q.Set("since", strconv.FormatUint(since, 10))
	}
	var s Snapshot
	err := c.do(ctx, http.MethodGet, "/v1/prepulls?"+q.Encode(), nil, &s)
	return s, err
}

// Cache lists the node cache and who holds each entry.
func (c *Client) Cache(ctx context.Context) ([]CacheEntry, error) {
	var es []CacheEntry
	err := c.do(ctx, http.MethodGet, "/v1/cache", nil, &es)
	return es, err
}

func (c *Client) do(ctx context.Context, method, path string, in, out any) error {
	var body io.Reader
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return err
		}
		body = bytes.NewReader(b)
	}
	// The host is a placeholder: the transport always dials the socket.
	req, err := http.NewRequestWithContext(ctx, method, "http://prepull"+path, body)
	if err != nil {
		return err
	}
	if in != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		// The URL is a placeholder; the socket is what the reader needs to see.
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err
		}
		return fmt.Errorf("prepull API at %s (is the modelpack driver running on this node?): %w", c.socket, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode >= 300 {
		var e apiError
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
		if json.Unmarshal(b, &e) != nil || e.Error == "" {
			e.Error = string(bytes.TrimSpace(b))
		}
		return fmt.Errorf("prepull API: %s: %s", resp.Status, e.Error)
	}
	if out == nil {
		return nil
	}
	return json.NewDecoder(resp.Body).Decode(out)
}
