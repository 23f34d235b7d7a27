package fxoutbox

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io/fs"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/xdg-go/scram"
	"go.uber.org/fx/fxtest"

	"github.com/fxoutbox/outbox"
	"github.com/fxoutbox/outbox/outboxconfig"
	"github.com/fxoutbox/outbox/relay"
	"github.com/fxoutbox/outbox/unitofwork"
)

// password is what no error, log or printed Config may contain.
const password = "hunter2-Pa55w0rd!"

// pki is a throwaway CA with a broker and a client certificate, as PEM
// files in a temp dir.
type pki struct {
	caFile, certFile, keyFile string
	ca                        *x509.Certificate
	caPool                    *x509.CertPool
	server                    tls.Certificate // for DNS name brokerName only, no IP
}

const brokerName = "broker.kafka.test"

func newPKI(t *testing.T) *pki {
	t.Helper()
	dir := t.TempDir()
	key := func() *ecdsa.PrivateKey {
		k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		return k
	}
	now := time.Now()
	caKey := key()
	caTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "fxoutbox test CA"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	ca, _ := x509.ParseCertificate(caDER)
	leaf := func(serial int64, usage x509.ExtKeyUsage, dns []string) ([]byte, *ecdsa.PrivateKey) {
		k := key()
		der, err := x509.CreateCertificate(rand.Reader, &x509.Certificate{
			SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: fmt.Sprint("leaf ", serial)},
			NotBefore: now.Add(-time.Hour), NotAfter: now.Add(time.Hour),
			KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{usage}, DNSNames: dns,
		}, ca, &k.PublicKey, caKey)
		if err != nil {
			t.Fatal(err)
		}
		return der, k
	}
	write := func(name, typ string, der []byte) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	keyDER := func(k *ecdsa.PrivateKey) []byte {
		b, err := x509.MarshalPKCS8PrivateKey(k)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	p := &pki{ca: ca, caPool: x509.NewCertPool()}
	p.caPool.AddCert(ca)
	p.caFile = write("ca.pem", "CERTIFICATE", caDER)
	clientDER, clientKey := leaf(2, x509.ExtKeyUsageClientAuth, nil)
	p.certFile = write("client.pem", "CERTIFICATE", clientDER)
	p.keyFile = write("client-key.pem", "PRIVATE KEY", keyDER(clientKey))
	serverDER, serverKey := leaf(3, x509.ExtKeyUsageServerAuth, []string{brokerName})
	p.server = tls.Certificate{Certificate: [][]byte{serverDER}, PrivateKey: serverKey}
	return p
}

func envOf(m map[string]string) func(string) (string, bool) {
	return func(k string) (string, bool) { v, ok := m[k]; return v, ok }
}

func TestKafkaSecurityFromEnv(t *testing.T) {
	p := newPKI(t)
	for _, mech := range []string{"PLAIN", "scram-sha-256", "SCRAM-SHA-512"} {
		c, err := configFrom(envOf(map[string]string{
			"KAFKA_TLS":             "on",
			"KAFKA_TLS_CA_FILE":     p.caFile,
			"KAFKA_TLS_CERT_FILE":   p.certFile,
			"KAFKA_TLS_KEY_FILE":    p.keyFile,
			"KAFKA_TLS_SERVER_NAME": brokerName,
			"KAFKA_SASL_MECHANISM":  mech,
			"KAFKA_SASL_USER":       " relay ",
			"KAFKA_SASL_PASSWORD":   " " + password + " ", // taken as is
			"KAFKA_CLIENT_ID":       "orders",
		}))
		if err != nil {
			t.Fatal(err)
		}
		want := outboxconfig.KafkaTLS{Enable: true, CAFile: p.caFile, CertFile: p.certFile, KeyFile: p.keyFile, ServerName: brokerName}
		if c.KafkaTLS != want {
			t.Errorf("KafkaTLS = %+v, want %+v", c.KafkaTLS, want)
		}
		if c.KafkaSASL.Mechanism != strings.ToUpper(mech) || c.KafkaSASL.User != "relay" ||
			c.KafkaSASL.Password != " "+password+" " || c.KafkaSASL.AllowPlaintext {
			t.Errorf("KafkaSASL = %+v", c.KafkaSASL)
		}
		sc, err := c.SaramaConfig()
		if err != nil {
			t.Fatal(err)
		}
		tc := sc.Net.TLS.Config
		if !sc.Net.TLS.Enable || tc == nil || tc.InsecureSkipVerify || tc.MinVersion != tls.VersionTLS12 ||
			tc.ServerName != brokerName || len(tc.Certificates) != 1 || tc.RootCAs == nil {
			t.Fatalf("TLS: enable %v, config %+v", sc.Net.TLS.Enable, tc)
		}
		// RootCAs holds the generated CA, and only it.
		leaf, err := x509.ParseCertificate(p.server.Certificate[0])
		if err != nil {
			t.Fatal(err)
		}
		if _, err := leaf.Verify(x509.VerifyOptions{Roots: tc.RootCAs, DNSName: brokerName}); err != nil {
			t.Errorf("broker certificate does not verify against RootCAs: %v", err)
		}
		if !tc.RootCAs.Equal(p.caPool) {
			t.Error("RootCAs is not exactly the CA file's pool")
		}
		s := sc.Net.SASL
		if !s.Enable || string(s.Mechanism) != strings.ToUpper(mech) || s.User != "relay" || s.Password != " "+password+" " || !s.Handshake {
			t.Errorf("SASL = enable %v, mechanism %s, user %q, handshake %v", s.Enable, s.Mechanism, s.User, s.Handshake)
		}
		if strings.HasPrefix(strings.ToUpper(mech), "SCRAM") != (s.SCRAMClientGeneratorFunc != nil) {
			t.Errorf("%s: SCRAM generator set = %v", mech, s.SCRAMClientGeneratorFunc != nil)
		}
		if sc.ClientID != "orders" {
			t.Errorf("ClientID = %q: KAFKA_CLIENT_ID lost", sc.ClientID)
		}
		// The result is still a configuration the relay accepts.
		if _, err := relay.NewSaramaPublisher([]string{"localhost:9093"}, sc); err != nil {
			t.Errorf("NewSaramaPublisher: %v", err)
		}
	}
}

func TestKafkaSecurityDefaults(t *testing.T) {
	c, err := configFrom(envOf(nil))
	if err != nil {
		t.Fatal(err)
	}
	sc, err := c.SaramaConfig()
	if err != nil {
		t.Fatal(err)
	}
	if sc.Net.TLS.Enable || sc.Net.TLS.Config != nil || sc.Net.SASL.Enable {
		t.Errorf("defaults turned on TLS or SASL: %+v", sc.Net)
	}
	// TLS alone: system roots, verification on.
	c, err = configFrom(envOf(map[string]string{"KAFKA_TLS": "true"}))
	if err != nil {
		t.Fatal(err)
	}
	if sc, err = c.SaramaConfig(); err != nil {
		t.Fatal(err)
	}
	if tc := sc.Net.TLS.Config; !sc.Net.TLS.Enable || tc.InsecureSkipVerify || tc.RootCAs != nil || tc.MinVersion != tls.VersionTLS12 {
		t.Errorf("TLS defaults: %+v", tc)
	}
	// SASL over plaintext, explicitly allowed.
	c, err = configFrom(envOf(map[string]string{
		"KAFKA_SASL_MECHANISM": "PLAIN", "KAFKA_SASL_USER": "u", "KAFKA_SASL_PASSWORD": password, "KAFKA_SASL_ALLOW_PLAINTEXT": "on",
	}))
	if err != nil {
		t.Fatal(err)
	}
	if sc, err = c.SaramaConfig(); err != nil || !sc.Net.SASL.Enable || sc.Net.TLS.Enable {
		t.Errorf("allowed plaintext SASL: %v, %+v", err, sc.Net)
	}
	// The caller's sarama configuration is not modified.
	own := relay.DefaultSaramaConfig()
	c = Config{Sarama: own, KafkaTLS: outboxconfig.KafkaTLS{Enable: true}}
	if _, err := c.SaramaConfig(); err != nil || own.Net.TLS.Enable {
		t.Errorf("Config.Sarama modified in place (err %v)", err)
	}
}

func TestKafkaSecurityRefusals(t *testing.T) {
	p := newPKI(t)
	notPEM := filepath.Join(t.TempDir(), "ca.txt")
	if err := os.WriteFile(notPEM, []byte("not a certificate\n"+password), 0o600); err != nil {
		t.Fatal(err)
	}
	tlsOn := map[string]string{"KAFKA_TLS": "on"}
	with := func(base map[string]string, kv ...string) map[string]string {
		m := map[string]string{}
		for k, v := range base {
			m[k] = v
		}
		for i := 0; i < len(kv); i += 2 {
			m[kv[i]] = kv[i+1]
		}
		return m
	}
	sasl := func(mech string) map[string]string {
		return with(tlsOn, "KAFKA_SASL_MECHANISM", mech, "KAFKA_SASL_USER", "relay", "KAFKA_SASL_PASSWORD", password)
	}
	cases := []struct {
		name    string
		env     map[string]string
		atBuild bool   // the error comes from reading files, when the relay is built
		names   string // the environment variable the error must name
		isErr   error  // a cause the error must wrap, if any
	}{
		{"TLS flag not on/off", map[string]string{"KAFKA_TLS": "yes please"}, false, "KAFKA_TLS", nil},
		{"skip-verify flag not on/off", with(tlsOn, "KAFKA_TLS_INSECURE_SKIP_VERIFY", "sure"), false, "KAFKA_TLS_INSECURE_SKIP_VERIFY", nil},
		{"CA file with TLS off", map[string]string{"KAFKA_TLS_CA_FILE": p.caFile}, false, "KAFKA_TLS_CA_FILE", nil},
		{"skip verify with TLS off", map[string]string{"KAFKA_TLS_INSECURE_SKIP_VERIFY": "on"}, false, "KAFKA_TLS_INSECURE_SKIP_VERIFY", nil},
		{"cert without key", with(tlsOn, "KAFKA_TLS_CERT_FILE", p.certFile), false, "KAFKA_TLS_KEY_FILE", nil},
		{"missing CA file", with(tlsOn, "KAFKA_TLS_CA_FILE", "/nonexistent/ca.pem"), true, "KAFKA_TLS_CA_FILE", fs.ErrNotExist},
		{"CA file not PEM", with(tlsOn, "KAFKA_TLS_CA_FILE", notPEM), true, "KAFKA_TLS_CA_FILE", nil},
		{"unreadable cert", with(tlsOn, "KAFKA_TLS_CERT_FILE", "/nonexistent/c.pem", "KAFKA_TLS_KEY_FILE", p.keyFile), true, "KAFKA_TLS_CERT_FILE", fs.ErrNotExist},
		{"key not matching cert", with(tlsOn, "KAFKA_TLS_CERT_FILE", p.certFile, "KAFKA_TLS_KEY_FILE", p.caFile), true, "KAFKA_TLS_KEY_FILE", nil},
		{"unknown mechanism", sasl("GSSAPI"), false, "KAFKA_SASL_MECHANISM", nil},
		{"SCRAM-SHA-1", sasl("SCRAM-SHA-1"), false, "KAFKA_SASL_MECHANISM", nil},
		{"SASL without user", with(sasl("PLAIN"), "KAFKA_SASL_USER", ""), false, "KAFKA_SASL_USER", nil},
		{"SASL without password", with(sasl("SCRAM-SHA-256"), "KAFKA_SASL_PASSWORD", ""), false, "KAFKA_SASL_PASSWORD", nil},
		{"password without mechanism", with(tlsOn, "KAFKA_SASL_PASSWORD", password), false, "KAFKA_SASL_MECHANISM", nil},
		{"password SASLprep rejects", with(sasl("SCRAM-SHA-512"), "KAFKA_SASL_PASSWORD", password+"\u0007"), false, "KAFKA_SASL_PASSWORD", nil},
		{"SASL PLAIN without TLS", with(sasl("PLAIN"), "KAFKA_TLS", "off"), false, "KAFKA_SASL_ALLOW_PLAINTEXT", nil},
		{"SASL SCRAM without TLS", with(sasl("SCRAM-SHA-512"), "KAFKA_TLS", ""), false, "KAFKA_SASL_ALLOW_PLAINTEXT", nil},
		{"allow-plaintext flag not on/off", with(sasl("PLAIN"), "KAFKA_SASL_ALLOW_PLAINTEXT", "maybe"), false, "KAFKA_SASL_ALLOW_PLAINTEXT", nil},
	}
	for _, tc := range cases {
		c, err := configFrom(envOf(tc.env))
		if tc.atBuild {
			if err != nil {
				t.Errorf("%s: ConfigFromEnv already failed: %v", tc.name, err)
				continue
			}
			_, err = c.SaramaConfig()
		}
		checkConfigError(t, tc.name, err, tc.names)
		if tc.isErr != nil && !errors.Is(err, tc.isErr) {
			t.Errorf("%s: %v does not wrap %v", tc.name, err, tc.isErr)
		}
	}

	// Set as Config fields (not from the environment), the same rules hold
	// when the relay's configuration is built, also for SASL set directly on
	// Config.Sarama.
	own := relay.DefaultSaramaConfig()
	own.Net.SASL.Enable, own.Net.SASL.User, own.Net.SASL.Password = true, "relay", password
	ownTLS := relay.DefaultSaramaConfig()
	ownTLS.Net.TLS.Enable = true
	for name, c := range map[string]Config{
		"SASL field without TLS":          {KafkaSASL: outboxconfig.KafkaSASL{Mechanism: "PLAIN", User: "u", Password: password}},
		"SASL in Config.Sarama, no TLS":   {Sarama: own},
		"TLS both in Sarama and KafkaTLS": {Sarama: ownTLS, KafkaTLS: outboxconfig.KafkaTLS{Enable: true}},
		"SASL both in Sarama and KafkaSASL": {Sarama: own, KafkaTLS: outboxconfig.KafkaTLS{Enable: true},
			KafkaSASL: outboxconfig.KafkaSASL{Mechanism: "PLAIN", User: "u", Password: password}},
	} {
		_, err := c.SaramaConfig()
		checkConfigError(t, name, err, "")
	}
	// SASL with TLS set directly on Config.Sarama is fine.
	if _, err := (Config{Sarama: ownTLS, KafkaSASL: outboxconfig.KafkaSASL{Mechanism: "PLAIN", User: "u", Password: password}}).SaramaConfig(); err != nil {
		t.Errorf("SASL field with TLS in Config.Sarama: %v", err)
	}
}

func checkConfigError(t *testing.T, name string, err error, envVar string) {
	t.Helper()
	var ce *outbox.ConfigError
	switch {
	case !errors.As(err, &ce) || !errors.Is(err, outbox.ErrInvalidConfig):
		t.Errorf("%s: err = %v, want an *outbox.ConfigError", name, err)
	case envVar != "" && !strings.Contains(ce.Field, envVar):
		t.Errorf("%s: error field %q does not name %s", name, ce.Field, envVar)
	case strings.Contains(err.Error(), password) || strings.Contains(fmt.Sprintf("%+v %#v", err, err), password):
		t.Errorf("%s: error contains the password: %v", name, err)
	default:
		t.Logf("%s: %v", name, err)
	}
}

// A Config printed or encoded, as a careless log line would, never shows the
// password.
func TestKafkaSASLPasswordRedacted(t *testing.T) {
	c := Config{KafkaSASL: outboxconfig.KafkaSASL{Mechanism: "PLAIN", User: "relay", Password: password}, Writer: unitofwork.Config{Service: "svc"}}
	for _, verb := range []string{"%v", "%+v", "%#v", "%s", "%q", "%x", "%d"} {
		for _, v := range []any{c, &c, c.KafkaSASL, &c.KafkaSASL} {
			if s := fmt.Sprintf(verb, v); strings.Contains(s, password) || strings.Contains(s, fmt.Sprintf("%x", password)) {
				t.Errorf("%s of %T shows the password: %s", verb, v, s)
			}
		}
	}
	if s := fmt.Sprintf("%+v", c.KafkaSASL); !strings.Contains(s, "User:relay") || !strings.Contains(s, "[REDACTED]") {
		t.Errorf("redacted form lost the rest: %s", s)
	}
	b, err := json.Marshal(struct{ SASL outboxconfig.KafkaSASL }{c.KafkaSASL})
	if err != nil || strings.Contains(string(b), password) || !strings.Contains(string(b), `"User":"relay"`) {
		t.Errorf("JSON: %s, %v", b, err)
	}
}

// The SCRAM client sarama gets completes a real SCRAM exchange (against
// xdg-go/scram's server) with the right password, and fails with a wrong one.
func TestSCRAMClient(t *testing.T) {
	for _, mech := range []struct {
		name string
		hash scram.HashGeneratorFcn
	}{{"SCRAM-SHA-256", scram.SHA256}, {"SCRAM-SHA-512", scram.SHA512}} {
		sc, err := Config{KafkaTLS: outboxconfig.KafkaTLS{Enable: true}, KafkaSASL: outboxconfig.KafkaSASL{Mechanism: mech.name, User: "relay", Password: password}}.SaramaConfig()
		if err != nil {
			t.Fatal(err)
		}
		stored, err := mech.hash.NewClient("relay", password, "")
		if err != nil {
			t.Fatal(err)
		}
		creds, err := stored.GetStoredCredentialsWithError(scram.KeyFactors{Salt: "salt-of-the-earth", Iters: 4096})
		if err != nil {
			t.Fatal(err)
		}
		server, err := mech.hash.NewServer(func(user string) (scram.StoredCredentials, error) {
			if user != "relay" {
				return scram.StoredCredentials{}, errors.New("unknown user")
			}
			return creds, nil
		})
		if err != nil {
			t.Fatal(err)
		}
		for _, pw := range []string{password, "wrong"} {
			client := sc.Net.SASL.SCRAMClientGeneratorFunc()
			if err := client.Begin(sc.Net.SASL.User, pw, ""); err != nil {
				t.Fatal(err)
			}
			conv := server.NewConversation()
			c1, err := client.Step("")
			if err != nil {
				t.Fatal(err)
			}
			s1, err := conv.Step(c1)
			if err != nil {
				t.Fatal(err)
			}
			c2, err := client.Step(s1)
			if err != nil {
				t.Fatal(err)
			}
			s2, serr := conv.Step(c2) // the server checks the client's proof
			if pw != password {
				if serr == nil || conv.Valid() {
					t.Errorf("%s: server accepted a wrong password", mech.name)
				}
				continue
			}
			if serr != nil || !conv.Valid() {
				t.Fatalf("%s: server refused the right password: %v", mech.name, serr)
			}
			if _, err := client.Step(s2); err != nil || !client.Done() { // the client checks the server's signature
				t.Errorf("%s: client final step: %v, done %v", mech.name, err, client.Done())
			}
		}
	}
}

// errRecorder is a sarama.TestReporter that keeps the mock broker's errors
// (failed handshakes are expected in some cases) instead of failing.
type errRecorder struct {
	mu   sync.Mutex
	errs []string
}

func (r *errRecorder) add(s string) { r.mu.Lock(); r.errs = append(r.errs, s); r.mu.Unlock() }

func (r *errRecorder) String() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return fmt.Sprintf("%q", r.errs)
}

func (r *errRecorder) Error(a ...any)                 { r.add(fmt.Sprint(a...)) }
func (r *errRecorder) Errorf(format string, a ...any) { r.add(fmt.Sprintf(format, a...)) }
func (r *errRecorder) Fatal(a ...any)                 { r.add(fmt.Sprint(a...)) }
func (r *errRecorder) Fatalf(format string, a ...any) { r.add(fmt.Sprintf(format, a...)) }
func (r *errRecorder) Helper()                        {}

// A sarama client built from the configuration really verifies the broker:
// against a Kafka-protocol mock broker behind TLS (its certificate names
// only brokerName, and it requires a client certificate), the client
// connects with the CA, the server name and the client certificate, and
// fails without any one of them. Verification is on by default: without the
// CA file the broker's certificate is refused.
func TestKafkaTLSHandshake(t *testing.T) {
	p := newPKI(t)
	ln, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{
		Certificates: []tls.Certificate{p.server},
		ClientAuth:   tls.RequireAndVerifyClientCert,
		ClientCAs:    p.caPool,
		MinVersion:   tls.VersionTLS12,
	})
	if err != nil {
		t.Fatal(err)
	}
	rec := &errRecorder{}
	broker := sarama.NewMockBrokerListener(rec, 1, ln)
	defer broker.Close()
	broker.SetHandlerByMap(map[string]sarama.MockResponse{
		"ApiVersionsRequest": sarama.NewMockApiVersionsResponse(rec).SetApiKeys([]sarama.ApiVersionsResponseKey{
			{ApiKey: 3, MinVersion: 0, MaxVersion: 10}, // Metadata
			{ApiKey: 18, MinVersion: 0, MaxVersion: 3}, // ApiVersions
		}),
		"MetadataRequest": sarama.NewMockMetadataResponse(rec).SetBroker(broker.Addr(), broker.BrokerID()),
	})

	full := outboxconfig.KafkaTLS{Enable: true, CAFile: p.caFile, CertFile: p.certFile, KeyFile: p.keyFile, ServerName: brokerName}
	for _, tc := range []struct {
		name    string
		tls     outboxconfig.KafkaTLS
		ok      bool
		refused func(error) bool // the verification error a plain tls.Dial with the same config gets
	}{
		{"CA, server name and client certificate", full, true, nil},
		{"no CA file: system roots do not know the CA", outboxconfig.KafkaTLS{Enable: true, CertFile: p.certFile, KeyFile: p.keyFile, ServerName: brokerName}, false,
			func(err error) bool { var e x509.UnknownAuthorityError; return errors.As(err, &e) }},
		{"no server name: the address 127.0.0.1 is not in the certificate", outboxconfig.KafkaTLS{Enable: true, CAFile: p.caFile, CertFile: p.certFile, KeyFile: p.keyFile}, false,
			func(err error) bool { var e x509.HostnameError; return errors.As(err, &e) }},
		{"no client certificate: the broker refuses", outboxconfig.KafkaTLS{Enable: true, CAFile: p.caFile, ServerName: brokerName}, false, nil},
		{"insecure skip verify accepts the unknown CA", outboxconfig.KafkaTLS{Enable: true, CertFile: p.certFile, KeyFile: p.keyFile, InsecureSkipVerify: true}, true, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := Config{KafkaTLS: tc.tls}
			sc, err := c.SaramaConfig()
			if err != nil {
				t.Fatal(err)
			}
			sc.Metadata.Retry.Max = 0 // fail fast
			sc.Net.DialTimeout, sc.Net.ReadTimeout, sc.Net.WriteTimeout = 5*time.Second, 5*time.Second, 5*time.Second
			client, err := sarama.NewClient([]string{broker.Addr()}, sc)
			if err == nil {
				_ = client.Close()
			}
			if (err == nil) != tc.ok {
				t.Fatalf("sarama.NewClient: err = %v, want success %v (broker: %s)", err, tc.ok, rec)
			}
			if tc.refused != nil {
				// sarama reports only "out of brokers"; a plain dial with the
				// same tls.Config shows the certificate was refused.
				dc := sc.Net.TLS.Config.Clone()
				if dc.ServerName == "" {
					dc.ServerName = "127.0.0.1" // as sarama does from the address
				}
				conn, err := tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", broker.Addr(), dc)
				if err == nil {
					_ = conn.Close()
				}
				if !tc.refused(err) {
					t.Errorf("tls.Dial: err = %v, want the certificate refused", err)
				}
			}
		})
	}
}

// newRelay builds the producer configuration with KafkaTLS and KafkaSASL, so
// a bad setting fails the application before it starts.
func TestNewRelayAppliesKafkaSecurity(t *testing.T) {
	p := newPKI(t)
	lc := fxtest.NewLifecycle(t)
	_, err := newRelay(relayParams{Lifecycle: lc, Config: Config{Brokers: []string{"localhost:9093"},
		KafkaTLS: outboxconfig.KafkaTLS{Enable: true, CAFile: "/nonexistent/ca.pem"}}})
	checkConfigError(t, "newRelay with a missing CA file", err, "KAFKA_TLS_CA_FILE")
	_, err = newRelay(relayParams{Lifecycle: lc, Config: Config{Brokers: []string{"localhost:9093"},
		KafkaSASL: outboxconfig.KafkaSASL{Mechanism: "SCRAM-SHA-512", User: "relay", Password: password}}})
	checkConfigError(t, "newRelay with SASL and no TLS", err, "KAFKA_SASL_ALLOW_PLAINTEXT")
	_, err = newRelay(relayParams{Lifecycle: lc, Pool: &pgxpool.Pool{}, Config: Config{Brokers: []string{"localhost:9093"},
		KafkaTLS:  outboxconfig.KafkaTLS{Enable: true, CAFile: p.caFile},
		KafkaSASL: outboxconfig.KafkaSASL{Mechanism: "SCRAM-SHA-512", User: "relay", Password: password}}})
	if err != nil {
		t.Errorf("newRelay with TLS and SCRAM: %v", err)
	}
}
