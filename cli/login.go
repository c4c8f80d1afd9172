package cli

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/modelpack/modelpack/artifact/remote"
	"github.com/spf13/cobra"
	"golang.org/x/term"
	"oras.land/oras-go/v2/registry/remote/auth"
)

func loginCmd(g *Globals) *cobra.Command {
	rf := remoteFlags{g: g}
	var user, password string
	var passwordStdin bool
	cmd := &cobra.Command{
		Use:   "login REGISTRY",
		Short: "Save credentials for a registry in the docker config",
		Long: `Check credentials against REGISTRY (host[:port]) and save them in the docker config.json (or the file
given by --registry-config). When the config names a credential helper or credsStore, the helper stores them, as
with docker login. The password is read from --password-stdin, --password, or a prompt on a TTY.`,
		Example: `  modelpack login registry.local:5000 -u alice --password-stdin < token.txt
  modelpack login --plain-http 127.0.0.1:5000 -u alice`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			host := args[0]
			if strings.Contains(host, "/") {
				return fmt.Errorf("login takes a registry host[:port], not %q", host)
			}
			if passwordStdin {
				if password != "" {
					return errors.New("--password and --password-stdin are exclusive")
				}
				b, err := io.ReadAll(cmd.InOrStdin())
				if err != nil {
					return err
				}
				password = strings.TrimRight(string(b), "\r\n")
			}
			in, isFile := cmd.InOrStdin().(*os.File)
			tty := isFile && term.IsTerminal(int(in.Fd()))
			if user == "" {
				if !tty {
					return errors.New("--username is required")
				}
				fmt.Fprint(cmd.ErrOrStderr(), "Username: ")
				line, err := bufio.NewReader(in).ReadString('\n')
				if err != nil {
					return err
				}
				user = strings.TrimSpace(line)
			}
			if password == "" {
				if !tty {
					return errors.New("no password: use --password-stdin")
				}
				fmt.Fprint(cmd.ErrOrStderr(), "Password: ")
				b, err := term.ReadPassword(int(in.Fd()))
				fmt.Fprintln(cmd.ErrOrStderr())
				if err != nil {
					return err
				}
				password = string(b)
			}
			if err := remote.Login(cmd.Context(), host, auth.Credential{Username: user, Password: password}, rf.options()); err != nil {
				if errors.Is(err, remote.ErrUnauthorized) {
					// Not remote's hint to run login: that is what was just run.
					return fmt.Errorf("login to %s failed: the registry rejected user %q with this password or token; nothing was saved: %w", host, user, remote.ErrUnauthorized)
				}
				return err
			}
			if g.IsJSON() {
				return PrintJSON(cmd.OutOrStdout(), map[string]string{"registry": host, "status": "logged in"})
			}
			if !g.Quiet {
				fmt.Fprintf(cmd.OutOrStdout(), "Login succeeded: %s\n", host)
			}
			return nil
		},
	}
	rf.registerTransport(cmd.Flags())
	cmd.Flags().StringVarP(&user, "username", "u", "", "user name")
	cmd.Flags().StringVarP(&password, "password", "p", "", "password or token (prefer --password-stdin: flags show in ps)")
	cmd.Flags().BoolVar(&passwordStdin, "password-stdin", false, "read the password or token from stdin")
	return cmd
}

func logoutCmd(g *Globals) *cobra.Command {
	rf := remoteFlags{g: g}
	cmd := &cobra.Command{
		Use:   "logout REGISTRY",
		Short: "Remove a registry's credentials from the docker config",
		Example: `  modelpack logout registry.local:5000
  modelpack logout --registry-config ./config.json 127.0.0.1:5000`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			removed, err := remote.Logout(cmd.Context(), args[0], rf.options())
			if err != nil {
				return err
			}
			status, msg := "logged out", "Removed credentials for "+args[0]
			if !removed {
				status, msg = "not logged in", "Not logged in to "+args[0]+": no credentials to remove"
			}
			if g.IsJSON() {
				return PrintJSON(cmd.OutOrStdout(), map[string]string{"registry": args[0], "status": status})
			}
			if !g.Quiet {
				fmt.Fprintln(cmd.OutOrStdout(), msg)
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&rf.opts.RegistryConfig, "registry-config", os.Getenv("MODELPACK_REGISTRY_CONFIG"), "docker config.json holding registry credentials")
	return cmd
}
