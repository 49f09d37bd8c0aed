// Package deploy holds the manifests in this directory; Go code reads the
// ones it applies from here, so that what it applies is the file.
package deploy

import _ "embed"

// RemoteMemberRBAC is remote-member-rbac.yaml: what a member grants the
// credentials in its remote Secret (`hub register` applies it).
//
//go:embed remote-member-rbac.yaml
var RemoteMemberRBAC []byte

// EastWestProxylessALPN is eastwest-proxyless-alpn.yaml: the EnvoyFilter
// that lets proxyless gRPC cross Istio's east-west gateways, for the
// members whose Services behind the gateway allow it (see the file).
//
//go:embed eastwest-proxyless-alpn.yaml
var EastWestProxylessALPN []byte

// RemoteMemberRotationRBAC is remote-member-rotation-rbac.yaml: the rights
// `hub register --rotate` needs in a member, for the identity that rotates.
//
//go:embed remote-member-rotation-rbac.yaml
var RemoteMemberRotationRBAC []byte
