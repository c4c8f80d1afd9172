//go:build cluster

package cluster

import (
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/modelpack/modelpack/e2e/cluster/harness"
)

// TestInferenceOCR runs a real inference program that nobody here wrote on a model mounted through the driver:
// Debian's tesseract reads a PNG we render, with its English model (eng.traineddata, packed as a modelpack
// artifact) mounted as a CSI volume, and must give the text we drew — the same answer as the same program with the
// same model read straight from disk on the host (the baseline). The fleet suite runs the same on every node
// (e2e/fleet/cluster); both share harness.OCR.
func TestInferenceOCR(t *testing.T) {
	c := harness.Connect(t)
	ocr := harness.NewOCR(t)
	ref, _ := c.PushModel(t, ocr.ModelDir, "e2e/tesseract-eng:5")
	oldPolicy := c.Policy(t)
	c.SetPolicy(t, harness.OCRPolicy(c.Registry+"/e2e/tesseract-eng"))
	t.Cleanup(func() {
		c.SetPolicy(t, oldPolicy)
		restartDriver(t, c)
	})
	restartDriver(t, c)

	c.Apply(t, ocr.InputConfigMap("default", "ocr-input"))
	c.Apply(t, c.OCRPod("ocr", "", ref, "ocr-input"))
	c.WaitPhase(t, "default", "ocr", corev1.PodSucceeded, 3*time.Minute)
	if got := c.Logs(t, "default", "ocr", "c"); got != ocr.Baseline {
		t.Fatalf("tesseract in the pod, with the model the driver mounted, read %q; from disk it read %q", got, ocr.Baseline)
	}
}
