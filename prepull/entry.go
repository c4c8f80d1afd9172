package prepull

import (
	"fmt"
	"regexp"
	"strings"
	"time"

	"github.com/opencontainers/go-digest"

	"github.com/modelpack/modelpack/artifact"
)

// State is where one listed reference stands on this node.
type State string

const (
	StatePending State = "pending" // waiting for a pull slot
	StatePulling State = "pulling"
	StateReady   State = "ready" // complete in the cache and pinned
	StateFailed  State = "failed"
)

// Entry is one reference on one list, as the server reports it.
type Entry struct {
	List   string        `json:"list"`
	Ref    string        `json:"ref"`
	Digest digest.Digest `json:"digest,omitempty"`
	State  State         `json:"state"`
	Done   int64         `json:"done"`
	Total  int64         `json:"total"`
	Error  string        `json:"error,omitempty"`
	// Pin is the cache pin that holds the content while the entry is listed.
	Pin      string    `json:"pin"`
	Attempts int       `json:"attempts"`
	Updated  time.Time `json:"updated"`
}

// Percent is how much of the content is in the cache, 0–100.
func (e Entry) Percent() int {
	if e.State == StateReady {
		return 100
	}
	if e.Total <= 0 {
		return 0
	}
	return int(min(e.Done*100/e.Total, 100))
}

// Status is the one-word-and-detail form used in logs and tables: "pulling 42%", "failed: reason".
func (e Entry) Status() string {
	switch e.State {
	case StatePulling:
		return fmt.Sprintf("pulling %d%%", e.Percent())
	case StateFailed:
		return "failed: " + e.Error
	}
	return string(e.State)
}

// Snapshot is every entry the server holds at one version; versions grow with every change.
type Snapshot struct {
	Version uint64  `json:"version"`
	Entries []Entry `json:"entries"`
}

const pinPrefix = "prepull/"

// PinName names the cache pin of ref on list, so `modelpack cache ls` tells which list keeps what.
func PinName(list, ref string) string { return pinPrefix + list + "/" + ref }

// parsePin undoes PinName; list names never hold a slash, so the first one after the prefix ends the list.
func parsePin(name string) (list, ref string, ok bool) {
	rest, ok := strings.CutPrefix(name, pinPrefix)
	if !ok {
		return "", "", false
	}
	list, ref, ok = strings.Cut(rest, "/")
	return list, ref, ok && validList(list) == nil && ref != ""
}

var listName = regexp.MustCompile(`^[a-z0-9]([a-z0-9._-]{0,62})$`)

// DefaultList holds what `modelpack prepull REF…` adds.
const DefaultList = "cli"

func validList(list string) error {
	if !listName.MatchString(list) {
		return fmt.Errorf("invalid list name %q: lower-case letters, digits, '.', '_' and '-', at most 63", list)
	}
	return nil
}

// validRef is the one check of a reference from the API or a list file. One with a password is refused before it
// is stored, so it reaches no log line, no API answer and no status the CLI prints, and the refusal does not
// repeat it.
func validRef(ref string) error {
	if ref == "" || strings.ContainsAny(ref, " \t\r\n") {
		return fmt.Errorf("invalid reference %q", ref)
	}
	return artifact.RefuseCredentials(ref)
}

// DefaultSocket is where the driver serves the API inside its pod: the plugin directory, shared with the host at
// /var/lib/kubelet/plugins/<driver>/.
const DefaultSocket = "/csi/prepull.sock"
