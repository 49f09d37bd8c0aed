package hub

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	securityv1alpha1 "istio.io/api/security/v1alpha1"
)

// BenchmarkCARenewalUnderFlood measures the latency of renewals by
// certificate (ECDSA P-256 CSRs, one persistent connection) while
// token-authenticated callers flood the CA with CSRs back to back, on
// persistent connections: none, RSA-4096 (the largest key accepted: each
// signature check and signing runs in a worker slot), RSA-8192 (refused
// before a slot is taken), and RSA-4096 with the renewal lane disabled
// (renewals then queue with the flood). It reports the renewals' p50 and
// p99 latency and the flood's throughput and refusals.
//
//	go test -run '^$' -bench BenchmarkCARenewalUnderFlood -benchtime 300x ./hub/
func BenchmarkCARenewalUnderFlood(b *testing.B) {
	rsa4096, err := rsa.GenerateKey(rand.Reader, 4096)
	if err != nil {
		b.Fatal(err)
	}
	floodCSRs := map[string]string{"rsa4096": newCSR(b, rsa4096), "rsa8192": posingCSR(b, 8192, 65537)}
	for _, tc := range []struct {
		name, flood string
		lane        bool
	}{
		{"flood=none", "", true},
		{"flood=rsa4096", "rsa4096", true},
		{"flood=rsa8192", "rsa8192", true},
		{"flood=rsa4096/no-renewal-lane", "rsa4096", false},
	} {
		b.Run(tc.name, func(b *testing.B) {
			signer := &caSigner{}
			s := startSecureHub(b, Options{Tokens: caTokens, Signer: signer, MaxWorkloadCertTTL: 2 * time.Hour})
			signer.ca = s.ca
			if !tc.lane {
				s.h.ca.DisableRenewalLane()
			}
			// The renewing workload: a certificate issued by token first.
			key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
			if err != nil {
				b.Fatal(err)
			}
			csr := newCSR(b, key)
			resp, err := s.createCertificate(b, s.secure, caCall{creds: s.anonymous(), token: "west-token-a-gw", cluster: "west", csr: csr})
			if err != nil {
				b.Fatal(err)
			}
			renewer := caClient(b, s.secure, grpc.WithTransportCredentials(s.withCertificate(b, key, parseChain(b, resp))))

			ctx, cancel := context.WithCancel(context.Background())
			var wg sync.WaitGroup
			var flooded, refused atomic.Int64
			if tc.flood != "" {
				for range 8 {
					c := caClient(b, s.secure, grpc.WithTransportCredentials(s.anonymous()))
					wg.Go(func() {
						fctx := metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer west-token-a-gw", "ClusterID", "west")
						for ctx.Err() == nil {
							_, err := c.CreateCertificate(fctx, &securityv1alpha1.IstioCertificateRequest{Csr: floodCSRs[tc.flood], ValidityDuration: 600})
							if err == nil {
								flooded.Add(1)
							} else if ctx.Err() == nil {
								refused.Add(1)
							}
						}
					})
				}
			}
			latencies := make([]time.Duration, 0, b.N)
			start := time.Now()
			for b.Loop() {
				t0 := time.Now()
				rctx, rcancel := context.WithTimeout(context.Background(), time.Minute)
				_, err := renewer.CreateCertificate(rctx, &securityv1alpha1.IstioCertificateRequest{Csr: csr, ValidityDuration: 600})
				rcancel()
				if err != nil {
					b.Fatalf("renewal: %v", status.Convert(err).Message())
				}
				latencies = append(latencies, time.Since(t0))
			}
			elapsed := time.Since(start)
			cancel()
			wg.Wait()
			slices.Sort(latencies)
			pct := func(p float64) float64 {
				return float64(latencies[int(p*float64(len(latencies)-1))].Microseconds()) / 1000
			}
			b.ReportMetric(pct(0.5), "renewal-p50-ms")
			b.ReportMetric(pct(0.99), "renewal-p99-ms")
			b.ReportMetric(float64(flooded.Load())/elapsed.Seconds(), "flood-issued/s")
			b.ReportMetric(float64(refused.Load())/elapsed.Seconds(), "flood-refused/s")
		})
	}
}

// caClient is a CA client on one persistent connection to addr.
func caClient(tb testing.TB, addr string, opts ...grpc.DialOption) securityv1alpha1.IstioCertificateServiceClient {
	tb.Helper()
	conn, err := grpc.NewClient(addr, opts...)
	if err != nil {
		tb.Fatal(fmt.Errorf("dialing %s: %w", addr, err))
	}
	tb.Cleanup(func() { conn.Close() })
	return securityv1alpha1.NewIstioCertificateServiceClient(conn)
}
