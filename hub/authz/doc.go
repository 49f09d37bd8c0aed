// Package authz is Istio's security policy for the proxyless gRPC servers
// the hub configures: which AuthorizationPolicies and PeerAuthentications
// apply to a workload (as istiod selects them), the mutual-TLS mode they
// give each of its ports, and the RBAC filters the policies become on its
// inbound listener (as istiod's proxyless generator, grpcgen, builds them,
// and where grpc-go cannot enforce a policy as Istio means it, failing
// closed and saying so).
//
// Its input is the policies the hub distributes (distribute.Source); its
// output is what hub/xdsgen puts on a server's inbound listener. It keeps
// no state of its own beyond the compiled Set.
package authz
