package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"sigs.k8s.io/yaml"

	corev1 "k8s.io/api/core/v1"
)

// testCAPEM is a self-signed CA certificate (a kubeconfig's
// certificate-authority-data must hold one for the hub to accept it).
const testCAPEM = `-----BEGIN CERTIFICATE-----
MIIBjjCCATWgAwIBAgIUPpi/fkdxwx2ksXec5/CStUKJkd4wCgYIKoZIzj0EAwIw
HDEaMBgGA1UEAwwRaHViLXJlZ2lzdGVyLXRlc3QwIBcNMjYxMTI4MDkwMjEzWhgP
MjEyNjExMDQwOTAyMTNaMBwxGjAYBgNVBAMMEWh1Yi1yZWdpc3Rlci10ZXN0MFkw
EwYHKoZIzj0CAQYIKoZIzj0DAQcDQgAEdjLCIvEzBp2EO/WZrxuX3UbcJva9isVa
1Y7oe45TxzmtMS5hIZiUu8W3lCqN1JJ4ri8/dKM5Uo/ngV31rmvNlqNTMFEwHQYD
VR0OBBYEFOepaPgo4OiX2oqXEG753xEV4KO2MB8GA1UdIwQYMBaAFOepaPgo4OiX
2oqXEG753xEV4KO2MA8GA1UdEwEB/wQFMAMBAf8wCgYIKoZIzj0EAwIDRwAwRAIg
J1m+ylKFWsy6obpvbDnTkwuGj9lHiW1IWsZ0qDdBTzYCIGKQSNywwix9YPdYJmVB
8eyUJJxnG3E9NbzN4ItJGXhn
-----END CERTIFICATE-----
`

const operatorToken = "operator-admin-token-never-printed"

// memberKubeconfig writes an operator's kubeconfig with one context,
// "west", whose user is user.
func memberKubeconfig(t *testing.T, server string, user *clientcmdapi.AuthInfo) string {
	t.Helper()
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["w"] = &clientcmdapi.Cluster{Server: server, CertificateAuthorityData: []byte(testCAPEM)}
	cfg.AuthInfos["u"] = user
	cfg.Contexts["west"] = &clientcmdapi.Context{Cluster: "w", AuthInfo: "u"}
	cfg.CurrentContext = "west"
	path := filepath.Join(t.TempDir(), "member.yaml")
	if err := clientcmd.WriteToFile(*cfg, path); err != nil {
		t.Fatal(err)
	}
	return path
}

func runRegisterArgs(args ...string) (stdout, stderr string, code int) {
	var out, errOut bytes.Buffer
	code = registerMain(context.Background(), args, &out, &errOut)
	return out.String(), errOut.String(), code
}

// Bad input is refused with a precise error before anything is written,
// and no error shows the operator's credentials.
func TestRegisterRefusesBadInput(t *testing.T) {
	t.Setenv("KUBECONFIG", filepath.Join(t.TempDir(), "none"))
	member := memberKubeconfig(t, "https://10.0.0.1:6443", &clientcmdapi.AuthInfo{Token: operatorToken})
	exec := memberKubeconfig(t, "https://127.0.0.1:1", &clientcmdapi.AuthInfo{Exec: &clientcmdapi.ExecConfig{
		APIVersion: "client.authentication.k8s.io/v1", Command: "/nonexistent/hub-test-credential-plugin", InteractiveMode: clientcmdapi.NeverExecInteractiveMode,
	}})
	insecure := filepath.Join(t.TempDir(), "insecure.yaml")
	if err := os.WriteFile(insecure, []byte(`apiVersion: v1
kind: Config
clusters: [{name: w, cluster: {server: "https://10.0.0.1:6443", insecure-skip-tls-verify: true}}]
users: [{name: u, user: {token: x}}]
contexts: [{name: west, context: {cluster: w, user: u}}]
current-context: west
`), 0o600); err != nil {
		t.Fatal(err)
	}
	hub := []string{"--hub-kubeconfig", member} // any readable kubeconfig: nothing gets that far
	apiToken := filepath.Join(t.TempDir(), "api.token")
	if err := os.WriteFile(apiToken, []byte(operatorToken), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"unknown context", []string{"--kubeconfig", member, "--context", "east", "--dry-run"}, `context "east" of the member is not in its kubeconfig (it has: west)`},
		{"missing kubeconfig", []string{"--kubeconfig", "/nonexistent/kubeconfig", "--dry-run"}, "kubeconfig of the member"},
		{"invalid cluster ID", []string{"--kubeconfig", member, "--cluster-id", "west_", "--dry-run"}, `cluster ID "west_" must match`},
		{"long cluster ID", []string{"--kubeconfig", member, "--cluster-id", strings.Repeat("w", 64), "--dry-run"}, "must be 1-63 characters"},
		{"short TTL", []string{"--kubeconfig", member, "--token-ttl", "5m", "--dry-run"}, "token TTL 5m0s is shorter than the 10m0s"},
		{"long TTL", []string{"--kubeconfig", member, "--token-ttl", "673h", "--dry-run"}, "token TTL 673h0m0s is longer than 672h0m0s"},
		{"bad network", []string{"--kubeconfig", member, "--network", "a b", "--dry-run"}, `network "a b" is not a label value`},
		{"link-local server", []string{"--kubeconfig", member, "--server", "https://169.254.169.254", "--dry-run"}, "the hub would refuse the kubeconfig"},
		{"insecure context", []string{"--kubeconfig", insecure, "--dry-run"}, `context "west" skips TLS verification`},
		{"no hub cluster", []string{"--kubeconfig", member}, "--hub-context and/or --hub-kubeconfig"},
		{"rotate without hub URL", append([]string{"--kubeconfig", member, "--rotate"}, hub...), "rotation needs the hub's API"},
		{"yaml without --show-token", []string{"--kubeconfig", member, "-o", "yaml"}, "-o yaml prints a live token: add --show-token"},
		{"yaml and rotate", []string{"--kubeconfig", member, "-o", "yaml", "--show-token", "--rotate"}, "cannot be combined with -o yaml"},
		// The API token is not sent in clear text over the network.
		{"token over plain http", append([]string{"--kubeconfig", member, "--hub-url", "http://hub.example:8080", "--hub-token-file", apiToken}, hub...),
			`hub URL "http://hub.example:8080" is plain http to a host that is not loopback: the API token would cross the network in clear text`},
		{"unknown output", []string{"--kubeconfig", member, "-o", "json"}, `-o "json": only yaml is known`},
		// The operator's own exec plugin runs as kubectl runs it; one that
		// fails says so, naming the context.
		{"failing exec plugin", []string{"--kubeconfig", exec, "-o", "yaml", "--show-token"}, `member (context "west"): creating namespace istio-system`},
		{"stray argument", []string{"--kubeconfig", member, "west"}, `unexpected argument "west"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			stdout, stderr, code := runRegisterArgs(tc.args...)
			if code == 0 || !strings.Contains(stderr, tc.want) {
				t.Errorf("exit %d, stderr %q; want a failure saying %q", code, stderr, tc.want)
			}
			if tc.name == "failing exec plugin" && !strings.Contains(stderr, "/nonexistent/hub-test-credential-plugin") {
				t.Errorf("the exec plugin's failure is not shown: %q", stderr)
			}
			if strings.Contains(stdout+stderr, operatorToken) {
				t.Errorf("output shows the operator's token: %q %q", stdout, stderr)
			}
		})
	}
}

// --dry-run touches no cluster (the server is unreachable) and prints the
// member RBAC and the remote Secret, the token redacted.
func TestRegisterDryRun(t *testing.T) {
	member := memberKubeconfig(t, "https://127.0.0.1:1", &clientcmdapi.AuthInfo{Token: operatorToken})
	stdout, stderr, code := runRegisterArgs("--kubeconfig", member, "--server", "https://west.example:6443", "--network", "net-west", "--namespace", "mesh", "--dry-run")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	if strings.Contains(stdout+stderr, operatorToken) {
		t.Fatalf("dry run shows the operator's token:\n%s", stdout)
	}
	docs := strings.Split(stdout, "\n---\n")
	if rbac := strings.Join(docs[:len(docs)-1], "\n---\n"); !strings.Contains(rbac, "name: hub-remote-member") || !strings.Contains(rbac, "name: hub-member-reader") {
		t.Errorf("no member RBAC and ServiceAccount in:\n%s", stdout)
	}
	var s corev1.Secret
	if err := yaml.Unmarshal([]byte(docs[len(docs)-1]), &s); err != nil {
		t.Fatal(err)
	}
	if s.Name != "istio-remote-secret-west" || s.Namespace != "mesh" || s.Labels["istio/multiCluster"] != "true" ||
		s.Annotations["hub.federation/network"] != "west=net-west" || s.Annotations["networking.istio.io/cluster"] != "west" {
		t.Errorf("secret %+v", s.ObjectMeta)
	}
	kc, err := clientcmd.Load([]byte(s.StringData["west"]))
	if err != nil {
		t.Fatal(err)
	}
	if kc.CurrentContext != "west" || kc.Clusters["west"].Server != "https://west.example:6443" ||
		string(kc.Clusters["west"].CertificateAuthorityData) != testCAPEM || kc.AuthInfos["west"].Token != redacted {
		t.Errorf("kubeconfig:\n%s", s.StringData["west"])
	}
}
