package csidriver

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"log/slog"
	"strings"
	"testing"
)

// The driver logs JSON by default: a Credentials value must not reach the log however it is handed to slog (an
// attribute, inside a group, inside a struct marshalled by the handler) or printed.
func TestCredentialsNeverReachTheJSONLog(t *testing.T) {
	const secret = "hunter2-secret"
	auth := base64.StdEncoding.EncodeToString([]byte("alice:" + secret))
	creds := Credentials{DockerConfigJSON: []byte(`{"auths":{"r.example":{"auth":"` + auth + `"}}}`)}
	type request struct {
		Reference string
		Creds     Credentials
		Ptr       *Credentials
	}
	var buf bytes.Buffer
	log := slog.New(slog.NewJSONHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug}))
	log.Info("attr", "creds", creds)
	log.Info("group", slog.Group("req", "creds", creds))
	log.Info("struct", "req", request{Reference: "r.example/m:v1", Creds: creds, Ptr: &creds})
	log.With("creds", creds).Info("with")
	log.Info("any", slog.Any("creds", &creds))
	b, err := json.Marshal(request{Creds: creds})
	if err != nil {
		t.Fatal(err)
	}
	out := buf.String() + string(b) + fmt.Sprintf("%v %+v %#v %s", creds, creds, creds, creds)
	for _, leak := range []string{secret, auth, "auths", "DockerConfigJSON\":\"ey", base64.StdEncoding.EncodeToString(creds.DockerConfigJSON)} {
		if strings.Contains(out, leak) {
			t.Errorf("output holds %q:\n%s", leak, out)
		}
	}
	if n := strings.Count(buf.String(), "[credentials redacted]"); n < 6 {
		t.Errorf("redaction marker %d times, want at least 6:\n%s", n, buf.String())
	}
	for i, line := range strings.Split(strings.TrimSpace(buf.String()), "\n") {
		if !json.Valid([]byte(line)) {
			t.Errorf("line %d is not JSON: %s", i, line)
		}
	}
}
