package clusters

import (
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sort"
	"time"
)

// The persisted form of a member's view: JSON with short field names,
// services sorted by namespace and name, everything else in the order the
// endpoint controller built it, so that one view always encodes to the same
// bytes and its SHA-256 identifies its content. Decoding gives back values
// equal (reflect.DeepEqual) to what was delivered to the Sink.

// viewFormat is the version of the encoding; a reader refuses others.
const viewFormat = 1

// maxViewBytes bounds a decompressed view (about 800,000 endpoints), so a
// ConfigMap that someone else wrote cannot make the hub allocate without limit.
const maxViewBytes = 64 << 20

type viewDoc struct {
	Format   int           `json:"v"`
	Services []viewService `json:"s"`
}

type viewService struct {
	Namespace string `json:"ns"`
	Name      string `json:"n"`
	// Created is Service.Created in Unix seconds (absent: unknown).
	Created   int64          `json:"c,omitempty"`
	Ports     []viewPort     `json:"p,omitempty"`
	Endpoints []viewEndpoint `json:"e,omitempty"`
	// NotExported is Service.NotExported (absent: exported).
	NotExported bool `json:"x,omitempty"`
	// ExportTo and ExportReason are Service.ExportTo (absent: every
	// member; present and empty: none) and ExportReason.
	ExportTo     []string `json:"et,omitempty"`
	HasExportTo  bool     `json:"eth,omitempty"`
	ExportReason string   `json:"xr,omitempty"`
	// Network is Service.Network (absent: none).
	Network string `json:"w,omitempty"`
	// KSA and CSA are Service.KubernetesServiceAccounts and
	// CanonicalServiceAccounts (absent: not declared).
	KSA []string `json:"ksa,omitempty"`
	CSA []string `json:"csa,omitempty"`
	// PSA is Service.PodServiceAccounts (absent: none known), PSAX
	// Service.TooManyPodServiceAccounts.
	PSA  []string `json:"psa,omitempty"`
	PSAX bool     `json:"psax,omitempty"`
	// Gateways is Service.Gateways (absent: none).
	Gateways []viewGateway `json:"g,omitempty"`
}

type viewPort struct {
	Name        string `json:"n,omitempty"`
	Port        int32  `json:"p"`
	Protocol    string `json:"t,omitempty"`
	AppProtocol string `json:"a,omitempty"`
}

type viewEndpoint struct {
	Address     string `json:"a"`
	Port        int32  `json:"p"`
	ServicePort int32  `json:"s"`
	Health      Health `json:"h,omitempty"`
	Region      string `json:"r,omitempty"`
	Zone        string `json:"z,omitempty"`
	MTLS        bool   `json:"m,omitempty"`
	Workload    string `json:"wl,omitempty"`
}

type viewGateway struct {
	Address   string `json:"a"`
	Port      int32  `json:"p"`
	Source    string `json:"s,omitempty"`
	Proxyless bool   `json:"x,omitempty"`
}

// encodeView returns the canonical encoding of services and its SHA-256
// (lowercase hex).
func encodeView(services []*Service) ([]byte, string, error) {
	sorted := append([]*Service(nil), services...)
	sort.Slice(sorted, func(i, j int) bool {
		if sorted[i].Namespace != sorted[j].Namespace {
			return sorted[i].Namespace < sorted[j].Namespace
		}
		return sorted[i].Name < sorted[j].Name
	})
	doc := viewDoc{Format: viewFormat, Services: make([]viewService, 0, len(sorted))}
	for _, s := range sorted {
		vs := viewService{Namespace: s.Namespace, Name: s.Name, NotExported: s.NotExported, Network: s.Network,
			KSA: s.KubernetesServiceAccounts, CSA: s.CanonicalServiceAccounts, PSA: s.PodServiceAccounts, PSAX: s.TooManyPodServiceAccounts,
			ExportTo: s.ExportTo, HasExportTo: s.ExportTo != nil, ExportReason: s.ExportReason}
		if !s.Created.IsZero() {
			vs.Created = s.Created.Unix()
		}
		if len(s.Ports) > 0 {
			vs.Ports = make([]viewPort, len(s.Ports))
			for i, p := range s.Ports {
				vs.Ports[i] = viewPort(p)
			}
		}
		if len(s.Endpoints) > 0 {
			vs.Endpoints = make([]viewEndpoint, len(s.Endpoints))
			for i, e := range s.Endpoints {
				vs.Endpoints[i] = viewEndpoint(e)
			}
		}
		for _, g := range s.Gateways {
			vs.Gateways = append(vs.Gateways, viewGateway(g))
		}
		doc.Services = append(doc.Services, vs)
	}
	data, err := json.Marshal(doc)
	if err != nil {
		return nil, "", fmt.Errorf("encoding member view: %w", err)
	}
	sum := sha256.Sum256(data)
	return data, hex.EncodeToString(sum[:]), nil
}

// decodeView parses what encodeView wrote.
func decodeView(data []byte) ([]*Service, error) {
	var doc viewDoc
	if err := json.Unmarshal(data, &doc); err != nil {
		return nil, fmt.Errorf("decoding member view: %w", err)
	}
	if doc.Format != viewFormat {
		return nil, fmt.Errorf("member view has format %d; this hub reads %d", doc.Format, viewFormat)
	}
	out := make([]*Service, 0, len(doc.Services))
	gateways := map[string][]Gateway{}
	for _, vs := range doc.Services {
		s := &Service{Namespace: vs.Namespace, Name: vs.Name, NotExported: vs.NotExported, Network: vs.Network,
			KubernetesServiceAccounts: vs.KSA, CanonicalServiceAccounts: vs.CSA, PodServiceAccounts: vs.PSA, TooManyPodServiceAccounts: vs.PSAX, ExportReason: vs.ExportReason}
		if vs.HasExportTo {
			s.ExportTo = append([]string{}, vs.ExportTo...)
		}
		if vs.Created != 0 { // validateService refuses a time before 1970
			s.Created = time.Unix(vs.Created, 0).UTC()
		}
		if len(vs.Ports) > 0 {
			s.Ports = make([]ServicePort, len(vs.Ports))
			for i, p := range vs.Ports {
				s.Ports[i] = ServicePort(p)
			}
		}
		if len(vs.Endpoints) > 0 {
			s.Endpoints = make([]Endpoint, len(vs.Endpoints))
			for i, e := range vs.Endpoints {
				s.Endpoints[i] = Endpoint(e)
			}
		}
		if len(vs.Gateways) > 0 {
			// One slice per member, as the endpoint controller shares it.
			key := fmt.Sprint(vs.Gateways)
			if gws, ok := gateways[key]; ok {
				s.Gateways = gws
			} else {
				s.Gateways = make([]Gateway, len(vs.Gateways))
				for i, g := range vs.Gateways {
					s.Gateways[i] = Gateway(g)
				}
				gateways[key] = s.Gateways
			}
		}
		out = append(out, s)
	}
	return out, nil
}

// compress gzips data at the fastest level. A view is written every 30 s
// while its member changes; at the default level that cost the hub 5 % of
// its CPU under churn (perf, hubbench --real-envoys 50). For 1,000
// services and 20,000 endpoints the fastest level takes 6 ms instead of
// 26 and writes 175 KB instead of 126 (of 1.5 MB): still one object.
func compress(data []byte) []byte {
	var buf bytes.Buffer
	zw, _ := gzip.NewWriterLevel(&buf, gzip.BestSpeed) // the level is valid
	_, _ = zw.Write(data)                              // a bytes.Buffer does not fail
	_ = zw.Close()
	return buf.Bytes()
}

// decompress gunzips data, refusing more than maxViewBytes.
func decompress(data []byte) ([]byte, error) {
	zr, err := gzip.NewReader(bytes.NewReader(data))
	if err != nil {
		return nil, fmt.Errorf("decompressing member view: %w", err)
	}
	out, err := io.ReadAll(io.LimitReader(zr, maxViewBytes+1))
	if err != nil {
		return nil, fmt.Errorf("decompressing member view: %w", err)
	}
	if len(out) > maxViewBytes {
		return nil, errors.New("member view is larger than 64 MiB decompressed")
	}
	return out, nil
}

// splitChunks cuts data into pieces of at most size bytes (at least one piece).
func splitChunks(data []byte, size int) [][]byte {
	var out [][]byte
	for len(data) > size {
		out = append(out, data[:size])
		data = data[size:]
	}
	return append(out, data)
}
