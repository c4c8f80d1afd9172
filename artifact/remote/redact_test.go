package remote

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	digest "github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
)

// Registries redirect blob reads to object storage with pre-signed URLs whose query carries credentials (a session
// token, a signature). An error must not print them: it lands in logs and in Kubernetes events.
func TestBlobErrorsDoNotPrintSignedURLs(t *testing.T) {
	const secret = "SESSIONTOKENSECRET"
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch {
		case r.URL.Path == "/v2/":
			w.WriteHeader(http.StatusOK)
		case strings.HasPrefix(r.URL.Path, "/v2/"):
			http.Redirect(w, r, "/bucket/blob?X-Amz-Security-Token="+secret+"&X-Amz-Signature="+secret, http.StatusTemporaryRedirect)
		default:
			http.Error(w, "AccessDenied", http.StatusForbidden)
		}
	}))
	defer srv.Close()
	host := strings.TrimPrefix(srv.URL, "http://")
	r := repoFor(t, host+"/x/model:v1", Options{PlainHTTP: true, RegistryConfig: t.TempDir() + "/config.json"})
	b := []byte("blob")
	desc := ocispec.Descriptor{MediaType: "application/octet-stream", Digest: digest.FromBytes(b), Size: int64(len(b))}
	_, _, err := r.FetchRange(context.Background(), desc, 0)
	if err == nil {
		t.Fatal("fetch succeeded")
	}
	t.Log(err)
	if strings.Contains(err.Error(), secret) {
		t.Fatalf("error prints the pre-signed URL's credentials: %v", err)
	}
	if Classify(err) != ErrForbidden {
		t.Fatalf("classified as %v, want ErrForbidden", Classify(err))
	}
}
