package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/hubmesh/hub/internal/localcluster"
)

// demoClusters are the clusters `hub demo` starts; the first is home.
var demoClusters = []struct{ name, region, zone, ipPrefix string }{
	{"primary", "eu-central", "eu-central-1a", "198.18.1."},
	{"west", "us-west", "us-west-2b", "198.18.2."},
	{"east", "us-east", "us-east-1c", "198.18.3."},
}

// demo starts three real local clusters, registers west and east with remote
// Secrets in primary, seeds sample services and runs the hub against them.
func demo(ctx context.Context, cfg config, log *slog.Logger) error {
	names := make([]string, len(demoClusters))
	for i, c := range demoClusters {
		names[i] = c.name
	}
	fmt.Fprintln(os.Stderr, "starting local clusters (the first run builds kube-apiserver and etcd, ~10 min)...")
	env, err := localcluster.Start(ctx, localcluster.Options{Names: names})
	if err != nil {
		return fmt.Errorf("starting local clusters: %w", err)
	}
	defer env.Stop()

	home := env.Cluster("primary")
	homeClient, err := kubernetes.NewForConfig(home.RESTConfig())
	if err != nil {
		return err
	}
	if err := localcluster.EnsureNamespace(ctx, homeClient, cfg.namespace); err != nil {
		return err
	}
	for _, dc := range demoClusters {
		c := env.Cluster(dc.name)
		client, err := kubernetes.NewForConfig(c.RESTConfig())
		if err != nil {
			return err
		}
		if err := seedDemo(ctx, client, dc.name, dc.region, dc.zone, dc.ipPrefix); err != nil {
			return fmt.Errorf("seeding %s: %w", dc.name, err)
		}
		if c == home {
			continue
		}
		secret := localcluster.RemoteSecret(cfg.namespace, "istio-remote-secret-"+dc.name, map[string][]byte{dc.name: c.Kubeconfig()})
		if _, err := homeClient.CoreV1().Secrets(cfg.namespace).Create(ctx, secret, metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("registering %s: %w", dc.name, err)
		}
	}

	kubeconfig := filepath.Join(env.Dir(), "primary.kubeconfig")
	if err := os.WriteFile(kubeconfig, home.Kubeconfig(), 0o600); err != nil {
		return err
	}
	for _, dc := range demoClusters[1:] {
		if err := os.WriteFile(filepath.Join(env.Dir(), dc.name+".kubeconfig"), env.Cluster(dc.name).Kubeconfig(), 0o600); err != nil {
			return err
		}
	}
	cfg.kubeconfig = kubeconfig
	fmt.Printf(`
hub demo is running (Ctrl-C stops everything)
  dashboard:          http://%s/
  admin token:        %s   (sign in with it; also: curl -H "Authorization: Bearer <token>" http://%s/api/v1/clusters)
  readiness:          http://%s/readyz
  ADS (plaintext):    %s   e.g. xds:///echo.demo.svc.%s:8080 from a grpc-go client
  ADS/SDS (mTLS):     %s   SPIFFE bundle endpoint: https://%s (trust domain %s)
  home cluster:       kubectl --kubeconfig %s get secrets -n %s
  member kubeconfigs: %s/{west,east}.kubeconfig

`, displayAddr(cfg.adminAddr), home.AdminToken(), displayAddr(cfg.adminAddr), displayAddr(cfg.adminAddr), cfg.xdsAddr, cfg.domainSuffix, cfg.xdsTLSAddr, cfg.bundleAddr, cfg.trustDomain, kubeconfig, cfg.namespace, env.Dir())
	return serve(ctx, cfg, log)
}

// seedDemo creates a node with topology labels and two sample services:
// echo (in every cluster) and a per-cluster one.
func seedDemo(ctx context.Context, c kubernetes.Interface, cluster, region, zone, ipPrefix string) error {
	if err := localcluster.EnsureNamespace(ctx, c, "demo"); err != nil {
		return err
	}
	node := cluster + "-node-1"
	if err := localcluster.ApplyNode(ctx, c, node, region, zone); err != nil {
		return err
	}
	echo := []localcluster.Backend{{IP: ipPrefix + "10", Port: 8080, Node: node}, {IP: ipPrefix + "11", Port: 8080, Node: node}}
	if err := localcluster.ApplyService(ctx, c, "demo", "echo", "grpc", 8080, echo); err != nil {
		return err
	}
	return localcluster.ApplyService(ctx, c, "demo", cluster+"-api", "http", 80,
		[]localcluster.Backend{{IP: ipPrefix + "20", Port: 8000, Node: node}})
}

func displayAddr(addr string) string {
	if len(addr) > 0 && addr[0] == ':' {
		return "localhost" + addr
	}
	return addr
}
