package csidriver

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"log/slog"
	"strings"
)

// Credentials authenticate to registries for one request. The zero value means "the node's own credentials".
type Credentials struct {
	// DockerConfigJSON is the content of a kubernetes.io/dockerconfigjson secret.
	DockerConfigJSON []byte
	// OwnOnly presents DockerConfigJSON's credential only, and none where it holds none for a host: never the
	// node's. A pod's publish is made so unless the policy is NeverVerify (see tenancy.go).
	OwnOnly bool
}

// String keeps credentials out of logs and error messages.
func (Credentials) String() string { return "[credentials redacted]" }

// GoString keeps credentials out of %#v.
func (c Credentials) GoString() string { return c.String() }

// LogValue keeps credentials out of slog output, text or JSON, also inside groups.
func (c Credentials) LogValue() slog.Value { return slog.StringValue(c.String()) }

// MarshalJSON keeps credentials out of JSON: slog's JSON handler marshals a struct holding them with
// encoding/json, which would otherwise print the docker config (base64 and all).
func (c Credentials) MarshalJSON() ([]byte, error) { return json.Marshal(c.String()) }

// Key names the credentials without revealing them, so that pulls, and the sources of one pull, made with other
// credentials stay apart: a short hash.
func (c Credentials) Key() string {
	sum := sha256.Sum256(c.DockerConfigJSON)
	if c.OwnOnly {
		return "own-" + hex.EncodeToString(sum[:8])
	}
	return hex.EncodeToString(sum[:8])
}

// dockerConfigKey is the key of a kubernetes.io/dockerconfigjson secret.
const dockerConfigKey = ".dockerconfigjson"

// credentialsFrom reads the nodePublishSecretRef secret; no secret means the node's own credentials. A secret that
// is not a docker config is a bad credential (UNAUTHENTICATED), as the CSI spec treats bad secrets.
func credentialsFrom(secrets map[string]string) (Credentials, error) {
	if len(secrets) == 0 {
		return Credentials{}, nil
	}
	cfg, ok := secrets[dockerConfigKey]
	if !ok {
		keys := make([]string, 0, len(secrets))
		for k := range secrets {
			keys = append(keys, k)
		}
		return Credentials{}, fail(ErrUnauthorized, "nodePublishSecretRef must be a kubernetes.io/dockerconfigjson secret with key %s (it has keys %s)", dockerConfigKey, strings.Join(keys, ", "))
	}
	var probe struct {
		Auths map[string]json.RawMessage `json:"auths"`
	}
	if err := json.Unmarshal([]byte(cfg), &probe); err != nil {
		// The parse error could quote the secret: say only where it is.
		return Credentials{}, fail(ErrUnauthorized, "nodePublishSecretRef key %s is not valid JSON", dockerConfigKey)
	}
	return Credentials{DockerConfigJSON: []byte(cfg)}, nil
}
