//go:build cluster

package cluster

import (
	"encoding/base64"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/modelpack/modelpack/e2e/cluster/harness"
)

// tessdata is where Debian's tesseract-ocr-eng installs the English model (e2e/cluster/deps.sh installs it).
const tessdata = "/usr/share/tesseract-ocr/5/tessdata"

// ocrLines is the text the test renders and the model must read back.
var ocrLines = []string{"Model weights mounted by modelpack", "read only, verified, 0123456789"}

// TestInferenceOCR runs a real inference program that nobody here wrote on a model mounted through the driver:
// Debian's tesseract reads a PNG we render, with its English model (eng.traineddata, packed as a modelpack
// artifact) mounted as a CSI volume, and must give the text we drew — the same answer as the same program with the
// same model read straight from disk on the host (the baseline).
func TestInferenceOCR(t *testing.T) {
	c := harness.Connect(t)
	png, err := harness.TextPNG(ocrLines)
	if err != nil {
		t.Fatal(err)
	}
	input := filepath.Join(t.TempDir(), "text.png")
	if err := os.WriteFile(input, png, 0o644); err != nil {
		t.Fatal(err)
	}
	ocr := func(model string) string {
		out, err := exec.Command("tesseract", input, "stdout", "--tessdata-dir", model, "-c", "debug_file=/dev/null").Output()
		if err != nil {
			t.Fatalf("tesseract on the host with %s: %v", model, err)
		}
		return string(out)
	}
	baseline := ocr(tessdata)
	if got, want := strings.Fields(baseline), strings.Fields(strings.Join(ocrLines, " ")); strings.Join(got, " ") != strings.Join(want, " ") {
		t.Fatalf("the baseline (tesseract with its model from disk) read %q, want %q", baseline, ocrLines)
	}

	dir := filepath.Join(t.TempDir(), "tesseract-eng")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(tessdata, "eng.traineddata"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "eng.traineddata"), b, 0o644); err != nil {
		t.Fatal(err)
	}
	ref, _ := c.PushModel(t, dir, "e2e/tesseract-eng:5")
	// The node's scanner knows no tesseract format and fails closed ("malformed (unknown)"), as it must: the
	// operator who trusts tesseract's own loader with this model says so for this file, as users would.
	oldPolicy := c.Kubectl(t, "-n", harness.Namespace, "get", "configmap", "modelpack-policy", "-o", "jsonpath={.data.policy\\.yaml}")
	setPolicy(t, c, fmt.Sprintf(`default:
  mode: enforce
  none: true
  exceptions:
  - {reference: "%s/e2e/tesseract-eng", path: "*.traineddata"}
`, c.Registry))
	t.Cleanup(func() {
		setPolicy(t, c, oldPolicy)
		restartDriver(t, c)
	})
	restartDriver(t, c)

	c.Apply(t, fmt.Sprintf(`apiVersion: v1
kind: ConfigMap
metadata: {name: ocr-input, namespace: default}
binaryData:
  text.png: %s
`, base64.StdEncoding.EncodeToString(png)))
	c.Apply(t, c.PodManifest(harness.PodSpec{Name: "ocr", Image: c.Tesseract,
		Command: []string{"/usr/bin/tesseract", "/input/text.png", "stdout", "--tessdata-dir", "/model", "-c", "debug_file=/dev/null"},
		Volumes: []harness.Volume{
			{Name: "model", MountPath: "/model", CSI: map[string]string{"reference": ref}},
			{Name: "input", MountPath: "/input", ConfigMap: "ocr-input"},
		}}))
	c.WaitPhase(t, "default", "ocr", corev1.PodSucceeded, 3*time.Minute)
	if got := c.Logs(t, "default", "ocr", "c"); got != baseline {
		t.Fatalf("tesseract in the pod, with the model the driver mounted, read %q; from disk it read %q", got, baseline)
	}
}
