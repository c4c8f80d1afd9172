package cli

import (
	"errors"
	"fmt"
	"os"

	"github.com/spf13/cobra"
	"golang.org/x/term"

	"github.com/modelpack/modelpack/signing"
)

func keyCmd(g *Globals) *cobra.Command {
	key := &cobra.Command{Use: "key", Short: "Manage cosign signing keys"}
	var prefix string
	var force bool
	gen := &cobra.Command{
		Use:   "generate",
		Short: "Generate a cosign key pair (PREFIX.key encrypted, PREFIX.pub)",
		Long: `Generate an ECDSA P-256 key pair in cosign's format, the same files cosign generate-key-pair writes:
PREFIX.key (encrypted with the password from COSIGN_PASSWORD, or asked for on the terminal) and PREFIX.pub.
The keys work with both modelpack sign/verify and cosign sign/verify.`,
		Example: `  COSIGN_PASSWORD=... modelpack key generate --output-key-prefix team`,
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			keyPath, pubPath, err := signing.GenerateKeyPair(prefix, cosignPassword, force)
			if err != nil {
				return err
			}
			if g.IsJSON() {
				return PrintJSON(cmd.OutOrStdout(), map[string]string{"privateKey": keyPath, "publicKey": pubPath})
			}
			_, err = fmt.Fprintf(cmd.OutOrStdout(), "Private key written to %s\nPublic key written to %s\n", keyPath, pubPath)
			return err
		},
	}
	gen.Flags().StringVar(&prefix, "output-key-prefix", "cosign", "write PREFIX.key and PREFIX.pub")
	gen.Flags().BoolVar(&force, "force", false, "overwrite existing key files")
	key.AddCommand(gen)
	return key
}

// cosignPassword follows cosign: COSIGN_PASSWORD when set (even empty), otherwise a terminal prompt.
func cosignPassword(confirm bool) ([]byte, error) {
	if pw, ok := os.LookupEnv("COSIGN_PASSWORD"); ok {
		return []byte(pw), nil
	}
	fd := int(os.Stdin.Fd())
	if !term.IsTerminal(fd) {
		return nil, errors.New("no password: set COSIGN_PASSWORD or run on a terminal")
	}
	fmt.Fprint(os.Stderr, "Enter password for private key: ")
	pw, err := term.ReadPassword(fd)
	fmt.Fprintln(os.Stderr)
	if err != nil || !confirm {
		return pw, err
	}
	fmt.Fprint(os.Stderr, "Enter password for private key again: ")
	again, err := term.ReadPassword(fd)
	fmt.Fprintln(os.Stderr)
	if err != nil {
		return nil, err
	}
	if string(pw) != string(again) {
		return nil, errors.New("passwords do not match")
	}
	return pw, nil
}
