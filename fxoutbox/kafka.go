package fxoutbox

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"os"
	"strings"

	"github.com/IBM/sarama"
	"github.com/xdg-go/scram"

	"github.com/fxoutbox/outbox"
	"github.com/fxoutbox/outbox/internal/envconfig"
	"github.com/fxoutbox/outbox/internal/partitioner"
	"github.com/fxoutbox/outbox/relay"
)

// KafkaTLS configures TLS between the relay and the brokers. The zero value
// means plaintext. Server certificates are verified unless
// InsecureSkipVerify is set; the lowest version accepted is TLS 1.2. The
// files are read once, when the relay is built: restart to rotate them.
type KafkaTLS struct {
	// Enable turns TLS on [KAFKA_TLS=on]. Default false. The other fields
	// need it.
	Enable bool
	// CAFile is a PEM file of the certificate authorities that signed the
	// brokers' certificates; they replace the system's roots
	// [KAFKA_TLS_CA_FILE]. Default "": the system's roots.
	CAFile string
	// CertFile and KeyFile are the PEM client certificate and its private
	// key, for brokers that authenticate clients by certificate (mTLS)
	// [KAFKA_TLS_CERT_FILE, KAFKA_TLS_KEY_FILE]. Default "": no client
	// certificate. Set both or neither.
	CertFile string
	KeyFile  string
	// ServerName is the name the brokers' certificates must carry
	// [KAFKA_TLS_SERVER_NAME]. Default "": the host of each broker address.
	ServerName string
	// InsecureSkipVerify accepts any server certificate, which lets anyone
	// on the network path read and alter the traffic, credentials included.
	// For tests only [KAFKA_TLS_INSECURE_SKIP_VERIFY]. Default false.
	InsecureSkipVerify bool
}

// KafkaSASL configures SASL authentication to the brokers. The zero value
// means none. SASL without TLS is refused unless AllowPlaintext is set.
// The password is never printed: fmt and encoding/json show KafkaSASL with
// the password redacted, and no error includes it.
type KafkaSASL struct {
	// Mechanism is "PLAIN", "SCRAM-SHA-256" or "SCRAM-SHA-512"
	// [KAFKA_SASL_MECHANISM]. Default "": no SASL. (For OAUTHBEARER or
	// GSSAPI, configure Config.Sarama yourself.)
	Mechanism string
	// User is the SASL user name [KAFKA_SASL_USER]. Required with a Mechanism.
	User string
	// Password is the SASL password [KAFKA_SASL_PASSWORD, taken as is,
	// white space included]. Required with a Mechanism.
	Password string
	// AllowPlaintext permits SASL on a connection without TLS, where PLAIN
	// sends the password in clear and every mechanism leaves the
	// authenticated session open to anyone on the path
	// [KAFKA_SASL_ALLOW_PLAINTEXT]. Default false: SASL needs KafkaTLS.
	AllowPlaintext bool
}

// Format prints s with its password redacted, whatever the verb, also as a
// field of a Config printed with %v or %+v.
func (s KafkaSASL) Format(f fmt.State, _ rune) {
	fmt.Fprintf(f, "{Mechanism:%s User:%s Password:%s AllowPlaintext:%t}", s.Mechanism, s.User, redact(s.Password), s.AllowPlaintext)
}

// MarshalJSON encodes s with its password redacted.
func (s KafkaSASL) MarshalJSON() ([]byte, error) {
	return json.Marshal(struct {
		Mechanism, User, Password string
		AllowPlaintext            bool
	}{s.Mechanism, s.User, redact(s.Password), s.AllowPlaintext})
}

func redact(password string) string {
	if password == "" {
		return ""
	}
	return "[REDACTED]"
}

// ApplyKafkaSecurity sets sc's Net.TLS from t and Net.SASL from s, reading
// the TLS files. Settings left zero leave sc as it is, so TLS or SASL
// configured on sc directly stays; configuring one of them both ways is an
// error. Then, whichever way they were set, it refuses SASL on a connection
// without TLS unless s.AllowPlaintext. Use it for other sarama clients of
// the application (consumers) that reach the same brokers. Errors are
// *outbox.ConfigError values naming the field and its environment variable.
func ApplyKafkaSecurity(sc *sarama.Config, t KafkaTLS, s KafkaSASL) error {
	if sc == nil {
		return &outbox.ConfigError{Field: "Sarama", Reason: "is nil: start from relay.DefaultSaramaConfig()"}
	}
	if err := validateKafkaSecurity(t, s); err != nil {
		return err
	}
	if t.Enable {
		if sc.Net.TLS.Enable || sc.Net.TLS.Config != nil {
			return &outbox.ConfigError{Field: "KafkaTLS", Reason: "is set, and so is Sarama.Net.TLS: configure TLS in one place"}
		}
		tc, err := t.tlsConfig()
		if err != nil {
			return err
		}
		sc.Net.TLS.Enable, sc.Net.TLS.Config = true, tc
	}
	if s.Mechanism != "" {
		if sc.Net.SASL.Enable {
			return &outbox.ConfigError{Field: "KafkaSASL", Reason: "is set, and so is Sarama.Net.SASL: configure SASL in one place"}
		}
		mech := sarama.SASLMechanism(strings.ToUpper(s.Mechanism))
		sc.Net.SASL.Enable = true
		sc.Net.SASL.Mechanism = mech
		sc.Net.SASL.User, sc.Net.SASL.Password = s.User, s.Password
		switch mech {
		case sarama.SASLTypeSCRAMSHA256:
			sc.Net.SASL.SCRAMClientGeneratorFunc = func() sarama.SCRAMClient { return &scramClient{hash: scram.SHA256} }
		case sarama.SASLTypeSCRAMSHA512:
			sc.Net.SASL.SCRAMClientGeneratorFunc = func() sarama.SCRAMClient { return &scramClient{hash: scram.SHA512} }
		}
	}
	if sc.Net.SASL.Enable && !sc.Net.TLS.Enable && !s.AllowPlaintext {
		return errSASLPlaintext()
	}
	return nil
}

func errSASLPlaintext() error { return envconfig.ErrSASLPlaintext() }

// validateKafkaSecurity checks t and s without reading files.
func validateKafkaSecurity(t KafkaTLS, s KafkaSASL) error {
	return envconfig.ValidateKafkaSecurity(envconfig.KafkaTLS(t), envconfig.KafkaSASL(s))
}

func (t KafkaTLS) tlsConfig() (*tls.Config, error) {
	tc := &tls.Config{
		MinVersion:         tls.VersionTLS12,
		ServerName:         t.ServerName,
		InsecureSkipVerify: t.InsecureSkipVerify, // opt-in, documented as for tests only
	}
	if t.CAFile != "" {
		const field = "KafkaTLS.CAFile [KAFKA_TLS_CA_FILE]"
		pem, err := os.ReadFile(t.CAFile)
		if err != nil {
			return nil, &outbox.ConfigError{Field: field, Reason: fmt.Sprintf("cannot be read (%v): point it to a PEM file of the CA that signed the brokers' certificates", err), Err: err}
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, &outbox.ConfigError{Field: field, Reason: fmt.Sprintf("%s holds no PEM certificate (-----BEGIN CERTIFICATE-----): point it to the CA certificate in PEM form", t.CAFile)}
		}
		tc.RootCAs = pool
	}
	if t.CertFile != "" {
		cert, err := tls.LoadX509KeyPair(t.CertFile, t.KeyFile)
		if err != nil {
			return nil, &outbox.ConfigError{Field: "KafkaTLS.CertFile/KeyFile [KAFKA_TLS_CERT_FILE, KAFKA_TLS_KEY_FILE]",
				Reason: fmt.Sprintf("cannot load the client certificate (%v): point them to the PEM certificate and its matching private key", err), Err: err}
		}
		tc.Certificates = []tls.Certificate{cert}
	}
	return tc, nil
}

// scramClient is sarama's SCRAM client on github.com/xdg-go/scram; sarama
// makes one per broker connection.
type scramClient struct {
	hash scram.HashGeneratorFcn
	conv *scram.ClientConversation
}

var _ sarama.SCRAMClient = (*scramClient)(nil)

func (c *scramClient) Begin(user, password, authzID string) error {
	cl, err := c.hash.NewClient(user, password, authzID)
	if err != nil {
		return err
	}
	c.conv = cl.NewConversation()
	return nil
}

func (c *scramClient) Step(challenge string) (string, error) { return c.conv.Step(challenge) }

func (c *scramClient) Done() bool { return c.conv.Done() }

// saramaConfig returns the producer configuration for the relay: a copy of
// Config.Sarama (default relay.DefaultSaramaConfig()) with KafkaTLS,
// KafkaSASL and Partitioner applied.
func (c Config) saramaConfig() (*sarama.Config, error) {
	sc := relay.DefaultSaramaConfig()
	if c.Sarama != nil {
		cp := *c.Sarama
		sc = &cp
	}
	if err := ApplyKafkaSecurity(sc, c.KafkaTLS, c.KafkaSASL); err != nil {
		return nil, err
	}
	if err := applyPartitioner(sc, c.Partitioner); err != nil {
		return nil, err
	}
	return sc, nil
}

// applyPartitioner sets sc's Producer.Partitioner to p, unless p is zero
// (sc's stays; sarama refuses a nil one). sc's may be replaced only when it
// is one of the hashes a relay.Partitioner names.
func applyPartitioner(sc *sarama.Config, p relay.Partitioner) error {
	const field = "Partitioner [OUTBOX_PARTITIONER]"
	if !partitioner.Valid(int(p)) {
		return &outbox.ConfigError{Field: field, Reason: fmt.Sprintf("is %v: use relay.Murmur2, relay.FNV1a or relay.CRC32 (%s)", p, partitioner.Names)}
	}
	if p == 0 {
		return nil
	}
	if _, ok := partitioner.Of(sc.Producer.Partitioner); !ok && sc.Producer.Partitioner != nil {
		return &outbox.ConfigError{Field: field, Reason: fmt.Sprintf("is %v, and Sarama.Producer.Partitioner is a partitioner of your own: "+
			"choose the partitioner in one place (unset OUTBOX_PARTITIONER, or leave Sarama.Producer.Partitioner as relay.DefaultSaramaConfig sets it)", p)}
	}
	sc.Producer.Partitioner = partitioner.Sarama(int(p))
	return nil
}

// partitionerName names sc's partitioner for the start-up line.
func partitionerName(sc *sarama.Config) string {
	if p, ok := partitioner.Of(sc.Producer.Partitioner); ok {
		return relay.Partitioner(p).String()
	}
	return "custom (Sarama.Producer.Partitioner)"
}
