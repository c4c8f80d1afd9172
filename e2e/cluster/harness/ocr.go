package harness

import (
	"encoding/base64"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// Tessdata is where Debian's tesseract-ocr-eng installs the English model (e2e/cluster/deps.sh installs it).
const Tessdata = "/usr/share/tesseract-ocr/5/tessdata"

// OCRLines is the text the OCR tests render and the model must read back.
var OCRLines = []string{"Model weights mounted by modelpack", "read only, verified, 0123456789"}

// OCR is the fixture of the inference tests: a PNG of OCRLines, what Debian's tesseract reads from it on the host
// with its English model straight from disk (the baseline every pod must match), and a directory holding that
// model (eng.traineddata) to push as a modelpack artifact.
type OCR struct {
	PNG      []byte
	Baseline string
	ModelDir string
}

// NewOCR renders the input, runs the baseline and checks it reads OCRLines (else the fixture, not the driver, is
// wrong), and copies the model into a temp dir.
func NewOCR(t testing.TB) *OCR {
	t.Helper()
	png, err := TextPNG(OCRLines)
	if err != nil {
		t.Fatal(err)
	}
	input := filepath.Join(t.TempDir(), "text.png")
	if err := os.WriteFile(input, png, 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command("tesseract", input, "stdout", "--tessdata-dir", Tessdata, "-c", "debug_file=/dev/null").Output()
	if err != nil {
		t.Fatalf("tesseract on the host with %s: %v", Tessdata, err)
	}
	baseline := string(out)
	if got, want := strings.Join(strings.Fields(baseline), " "), strings.Join(strings.Fields(strings.Join(OCRLines, " ")), " "); got != want {
		t.Fatalf("the baseline (tesseract with its model from disk) read %q, want %q", baseline, OCRLines)
	}
	dir := filepath.Join(t.TempDir(), "tesseract-eng")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(Tessdata, "eng.traineddata"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "eng.traineddata"), b, 0o644); err != nil {
		t.Fatal(err)
	}
	return &OCR{PNG: png, Baseline: baseline, ModelDir: dir}
}

// InputConfigMap is a ConfigMap named name in namespace holding the PNG as text.png, the pods' input.
func (o *OCR) InputConfigMap(namespace, name string) string {
	return fmt.Sprintf("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: %s, namespace: %s}\nbinaryData:\n  text.png: %s\n",
		name, namespace, base64.StdEncoding.EncodeToString(o.PNG))
}

// OCRPolicy is a node trust policy that lets every model through unsigned and lets models of repo (a
// registry/repository prefix) hold *.traineddata files. The node's scanner knows no tesseract format and fails
// closed on it ("malformed (unknown)"), as it must: the operator who trusts tesseract's own loader with this model
// says so for this file, as users would.
func OCRPolicy(repo string) string {
	return fmt.Sprintf(`default:
  mode: enforce
  none: true
  exceptions:
  - {reference: "%s", path: "*.traineddata"}
`, repo)
}

// OCRPod is a pod on node (empty: the cluster's node) running tesseract from c.Tesseract on the input ConfigMap
// (InputConfigMap) with the model ref mounted through the driver at /model; its log is the OCR's answer.
func (c *Cluster) OCRPod(name, node, ref, input string) string {
	return c.PodManifest(PodSpec{Name: name, Node: node, Image: c.Tesseract,
		Command: []string{"/usr/bin/tesseract", "/input/text.png", "stdout", "--tessdata-dir", "/model", "-c", "debug_file=/dev/null"},
		Volumes: []Volume{
			{Name: "model", MountPath: "/model", CSI: map[string]string{"reference": ref}},
			{Name: "input", MountPath: "/input", ConfigMap: input},
		}})
}

// SetPolicy replaces the node trust policy (the modelpack-policy ConfigMap) with policy (YAML).
func (c *Cluster) SetPolicy(t testing.TB, policy string) {
	t.Helper()
	lines := strings.Split(strings.TrimRight(policy, "\n"), "\n")
	for i := range lines {
		lines[i] = "    " + lines[i]
	}
	cm := fmt.Sprintf("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: modelpack-policy, namespace: %s}\ndata:\n  policy.yaml: |\n%s\n",
		Namespace, strings.Join(lines, "\n"))
	if _, err := c.RunInput(cm, "apply", "-f", "-"); err != nil {
		t.Fatal(err)
	}
}

// Policy is the node trust policy in force (the modelpack-policy ConfigMap's policy.yaml).
func (c *Cluster) Policy(t testing.TB) string {
	t.Helper()
	return c.Kubectl(t, "-n", Namespace, "get", "configmap", "modelpack-policy", "-o", "jsonpath={.data.policy\\.yaml}")
}
