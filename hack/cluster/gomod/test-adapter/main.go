// Command test-adapter is the custom-metrics-apiserver test adapter: a real custom.metrics.k8s.io (and
// external.metrics.k8s.io) API server whose per-object values are written over plain HTTP
// (POST /write-metrics/namespaces/{ns}/{resource}/{name}/{metric}, JSON quantity body).
//
// It is built from the published sigs.k8s.io/custom-metrics-apiserver module: the adapter command base
// (pkg/cmd) and the test adapter's in-memory provider (test-adapter/provider). Two differences from
// upstream's own main: it listens for writes on ":8080", fixed, where this one takes --write-metrics-address
// (default ":8080", the same), so that several local clusters on one machine do not fight over one port; and
// this one refreshes its REST mapping every --discovery-interval, so custom resources installed after it
// started can have metrics.
package main

import (
	"context"
	"errors"
	"net"
	"net/http"
	"os"
	"time"

	"github.com/emicklei/go-restful/v3"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/component-base/logs"
	"k8s.io/component-base/metrics/legacyregistry"
	"k8s.io/klog/v2"

	"sigs.k8s.io/custom-metrics-apiserver/pkg/apiserver/metrics"
	basecmd "sigs.k8s.io/custom-metrics-apiserver/pkg/cmd"
	"sigs.k8s.io/custom-metrics-apiserver/pkg/dynamicmapper"
	fakeprovider "sigs.k8s.io/custom-metrics-apiserver/test-adapter/provider"
)

func main() {
	logs.InitLogs()
	defer logs.FlushLogs()

	adapter := &basecmd.AdapterBase{Name: "test-adapter"}
	writeAddress := ":8080"
	adapter.Flags().StringVar(&writeAddress, "write-metrics-address", writeAddress,
		"host:port of the plain-HTTP endpoint that takes metric values (POST /write-metrics/...)")
	logs.AddFlags(adapter.Flags())
	if err := adapter.Flags().Parse(os.Args[1:]); err != nil {
		klog.Fatalf("unable to parse flags: %v", err)
	}

	client, err := adapter.DynamicClient()
	if err != nil {
		klog.Fatalf("unable to construct dynamic client: %v", err)
	}
	mapper, err := adapter.RESTMapper()
	if err != nil {
		klog.Fatalf("unable to construct discovery REST mapper: %v", err)
	}
	// The library builds its REST mapping once and never starts the refresher --discovery-interval is meant
	// for (upstream's main does not either); start it, so that resources installed later (CRDs) get metrics.
	if regenerating, ok := mapper.(*dynamicmapper.RegeneratingDiscoveryRESTMapper); ok && adapter.DiscoveryInterval > 0 {
		regenerating.RunUntil(wait.NeverStop)
	}
	provider, writeService := fakeprovider.NewFakeProvider(client, mapper)
	adapter.WithCustomMetrics(provider)
	adapter.WithExternalMetrics(provider)
	if err := metrics.RegisterMetrics(legacyregistry.Register); err != nil {
		klog.Fatalf("unable to register metrics: %v", err)
	}

	// Bind before serving the API, so that a port already taken ends the process at once with a clear message.
	listener, err := net.Listen("tcp", writeAddress)
	if err != nil {
		klog.Fatalf("cannot listen for metric writes on %s: %v", writeAddress, err)
	}
	container := restful.NewContainer()
	container.Add(writeService)
	go func() {
		server := &http.Server{Handler: container, ReadHeaderTimeout: 3 * time.Second}
		if err := server.Serve(listener); err != nil && !errors.Is(err, http.ErrServerClosed) {
			klog.Fatalf("metric write endpoint stopped: %v", err)
		}
	}()
	klog.Infof("metric write endpoint on http://%s/write-metrics/", listener.Addr())

	if err := adapter.Run(context.Background()); err != nil {
		klog.Fatalf("unable to run the custom metrics adapter: %v", err)
	}
}
