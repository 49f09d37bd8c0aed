package clusters

import (
	"encoding/base64"
	"strings"
	"testing"
	"time"
	"unicode/utf8"
)

// jwt builds an unsigned JWS compact token from a header and payload.
func jwt(header, payload string) string {
	enc := base64.RawURLEncoding.EncodeToString
	return enc([]byte(header)) + "." + enc([]byte(payload)) + ".c2ln"
}

const jwtHeader = `{"alg":"RS256","kid":"k"}`

func TestTokenExpiry(t *testing.T) {
	enc := base64.RawURLEncoding.EncodeToString
	for _, tc := range []struct {
		name    string
		token   string
		want    time.Time
		ok      bool
		wantErr string
	}{
		{"service-account token", jwt(jwtHeader, `{"aud":["x"],"exp":1798761600,"iat":1}`), time.Unix(1798761600, 0), true, ""},
		{"fractional exp", jwt(jwtHeader, `{"exp":1798761600.5}`), time.Unix(1798761600, 5e8), true, ""},
		{"padded segments", enc([]byte(jwtHeader)) + "==." + base64.URLEncoding.EncodeToString([]byte(`{"exp":1798761600}`)) + ".s", time.Unix(1798761600, 0), true, ""},
		{"already expired", jwt(jwtHeader, `{"exp":1000}`), time.Unix(1000, 0), true, ""},
		{"no exp", jwt(jwtHeader, `{"sub":"x"}`), time.Time{}, false, ""},
		{"opaque static token", "abcdef0123456789", time.Time{}, false, ""},
		{"bootstrap token", "abcdef.0123456789abcdef", time.Time{}, false, ""},
		{"dots but no JWT header", "a.b.c", time.Time{}, false, ""},
		{"header without alg", jwt(`{"typ":"JWT"}`, `{"exp":1}`), time.Time{}, false, ""},
		{"four parts", jwt(jwtHeader, `{"exp":1}`) + ".x", time.Time{}, false, ""},
		{"empty", "", time.Time{}, false, ""},
		{"payload not base64url", enc([]byte(jwtHeader)) + ".!!!.s", time.Time{}, false, "payload is not base64url"},
		{"payload not JSON", jwt(jwtHeader, `exp=1`), time.Time{}, false, "payload is not a JSON object"},
		{"payload a JSON array", jwt(jwtHeader, `[1]`), time.Time{}, false, "payload is not a JSON object"},
		{"payload null", jwt(jwtHeader, `null`), time.Time{}, false, "payload is not a JSON object"},
		{"exp a string", jwt(jwtHeader, `{"exp":"1798761600"}`), time.Time{}, false, "exp claim is not a number"},
		{"exp null", jwt(jwtHeader, `{"exp":null}`), time.Time{}, false, "exp claim is not a number"},
		{"exp negative", jwt(jwtHeader, `{"exp":-1}`), time.Time{}, false, "out of range"},
		{"exp past year 9999", jwt(jwtHeader, `{"exp":1e300}`), time.Time{}, false, "out of range"},
		{"exp huge integer", jwt(jwtHeader, `{"exp":`+strings.Repeat("9", 400)+`}`), time.Time{}, false, "out of range"},
		{"payload too large", jwt(jwtHeader, `{"exp":1,"x":"`+strings.Repeat("a", maxJWTPayloadBytes)+`"}`), time.Time{}, false, "at most"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, ok, err := TokenExpiry(tc.token)
			switch {
			case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
				t.Fatalf("error %v; want one containing %q", err, tc.wantErr)
			case tc.wantErr == "" && err != nil:
				t.Fatalf("error %v", err)
			case ok != tc.ok || !got.Equal(tc.want):
				t.Fatalf("TokenExpiry = %v, %v; want %v, %v", got, ok, tc.want, tc.ok)
			}
			if err != nil && tc.token != "" && strings.Contains(err.Error(), strings.Split(tc.token, ".")[1][:min(8, len(strings.Split(tc.token, ".")[1]))]) {
				t.Errorf("error %q quotes the token", err)
			}
		})
	}
}

// FuzzTokenExpiry: any token gives a time only with ok, an error that
// quotes none of the token, and never a panic.
func FuzzTokenExpiry(f *testing.F) {
	for _, s := range []string{
		jwt(jwtHeader, `{"exp":1798761600}`), jwt(jwtHeader, `{"exp":"x"}`), jwt(jwtHeader, `{"exp":1e400}`),
		jwt(jwtHeader, `{"exp":-0.0000001}`), "a.b.c", "..", "", jwt(jwtHeader, `{"exp":[1]}`),
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, token string) {
		exp, ok, err := TokenExpiry(token)
		if err != nil && ok {
			t.Fatalf("ok with error %v", err)
		}
		if !ok && !exp.IsZero() {
			t.Fatalf("time %v without ok", exp)
		}
		if ok && (exp.Unix() < 0 || exp.Unix() > maxNumericDate) {
			t.Fatalf("time %v out of range", exp)
		}
		if err != nil {
			if !utf8.ValidString(err.Error()) || len(err.Error()) > 200 {
				t.Fatalf("error %q", err)
			}
			if parts := strings.Split(token, "."); len(parts[1]) >= 6 && strings.Contains(err.Error(), parts[1]) {
				t.Fatalf("error %q quotes the token", err)
			}
		}
	})
}

func TestClientCertificateExpiry(t *testing.T) {
	p := testCerts(t)
	certPEM, err := base64.StdEncoding.DecodeString(p.cert)
	if err != nil {
		t.Fatal(err)
	}
	got, ok := ClientCertificateExpiry(certPEM)
	if !ok || got.IsZero() {
		t.Fatalf("ClientCertificateExpiry = %v, %v", got, ok)
	}
	if _, ok := ClientCertificateExpiry([]byte("-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n")); ok {
		t.Error("a certificate that does not parse has an expiry")
	}
	if _, ok := ClientCertificateExpiry(nil); ok {
		t.Error("no certificate has an expiry")
	}
}
