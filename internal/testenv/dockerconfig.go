package testenv

import (
	"encoding/base64"
	"fmt"
	"os"
	"path/filepath"
	"testing"
)

// EmptyDockerConfig writes a docker config.json with no credentials and returns its path: given to the code under
// test, it keeps the host's own credentials out of the test.
func EmptyDockerConfig(t testing.TB) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "config.json")
	if err := os.WriteFile(p, []byte(`{"auths":{}}`), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// DockerConfigJSON is a docker config.json document (a pull secret's .dockerconfigjson) giving user:pass for host.
func DockerConfigJSON(host, user, pass string) string {
	a := base64.StdEncoding.EncodeToString([]byte(user + ":" + pass))
	return fmt.Sprintf(`{"auths":{%q:{"auth":%q}}}`, host, a)
}
