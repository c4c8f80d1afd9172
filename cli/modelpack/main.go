// Command modelpack packs, signs, moves and mounts AI models as OCI artifacts.
package main

import (
	"os"

	"github.com/modelpack/modelpack/cli"
)

func main() { os.Exit(cli.Main()) }
