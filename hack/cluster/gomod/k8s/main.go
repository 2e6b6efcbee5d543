// Command k8s is a multi-call binary holding the real Kubernetes control-plane
// components and kubectl, built from the published k8s.io/kubernetes module.
// It dispatches on the name it was invoked as (symlinks) or on its first argument.
package main

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/spf13/cobra"
	"k8s.io/component-base/cli"
	_ "k8s.io/component-base/logs/json/register"
	_ "k8s.io/component-base/metrics/prometheus/clientgo"
	_ "k8s.io/component-base/metrics/prometheus/version"
	kubectl "k8s.io/kubectl/pkg/cmd"
	apiserver "k8s.io/kubernetes/cmd/kube-apiserver/app"
	controllermanager "k8s.io/kubernetes/cmd/kube-controller-manager/app"
	scheduler "k8s.io/kubernetes/cmd/kube-scheduler/app"
)

func commandFor(name string) (*cobra.Command, bool) {
	switch name {
	case "kube-apiserver":
		return apiserver.NewAPIServerCommand(), false
	case "kube-controller-manager":
		return controllermanager.NewControllerManagerCommand(), false
	case "kube-scheduler":
		return scheduler.NewSchedulerCommand(), false
	case "kubectl":
		return kubectl.NewDefaultKubectlCommand(), true
	}
	return nil, false
}

func main() {
	args := os.Args[1:]
	cmd, quiet := commandFor(filepath.Base(os.Args[0]))
	if cmd == nil && len(args) > 0 {
		cmd, quiet = commandFor(args[0])
		args = args[1:]
	}
	if cmd == nil {
		fmt.Fprintln(os.Stderr, "usage: k8s {kube-apiserver|kube-controller-manager|kube-scheduler|kubectl} [flags]")
		os.Exit(2)
	}
	cmd.SetArgs(args)
	if quiet {
		if err := cli.RunNoErrOutput(cmd); err != nil {
			os.Exit(1)
		}
		return
	}
	os.Exit(cli.Run(cmd))
}
