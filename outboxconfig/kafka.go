package outboxconfig

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"os"
	"reflect"
	"strings"

	"github.com/IBM/sarama"
	"github.com/xdg-go/scram"

	"github.com/fxoutbox/outbox"
	"github.com/fxoutbox/outbox/inbox"
	"github.com/fxoutbox/outbox/internal/partitioner"
	"github.com/fxoutbox/outbox/relay"
)

// KafkaTLS configures TLS between the outbox's Kafka clients and the
// brokers. The zero value means plaintext. Server certificates are verified
// unless InsecureSkipVerify is set; the lowest version accepted is TLS 1.2.
// The files are read once, when the client is built: restart to rotate
// them.
type KafkaTLS struct {
	// Enable turns TLS on. Default false. The other fields need it.
	Enable bool `env:"KAFKA_TLS"`
	// CAFile is a PEM file of the certificate authorities that signed the
	// brokers' certificates; they replace the system's roots. Default "":
	// the system's roots.
	CAFile string `env:"KAFKA_TLS_CA_FILE"`
	// CertFile is the PEM client certificate, for brokers that authenticate
	// clients by certificate (mTLS). Default "": no client certificate. Set
	// both CertFile and KeyFile or neither.
	CertFile string `env:"KAFKA_TLS_CERT_FILE"`
	// KeyFile is the PEM private key of CertFile. Default "".
	KeyFile string `env:"KAFKA_TLS_KEY_FILE"`
	// ServerName is the name the brokers' certificates must carry. Default
	// "": the host of each broker address.
	ServerName string `env:"KAFKA_TLS_SERVER_NAME"`
	// InsecureSkipVerify accepts any server certificate, which lets anyone
	// on the network path read and alter the traffic, credentials included.
	// For tests only. Default false.
	InsecureSkipVerify bool `env:"KAFKA_TLS_INSECURE_SKIP_VERIFY"`
}

// KafkaSASL configures SASL authentication to the brokers. The zero value
// means none. SASL without TLS is refused unless AllowPlaintext is set.
// The password is never printed: fmt and encoding/json show KafkaSASL with
// the password redacted, and no error includes it.
type KafkaSASL struct {
	// Mechanism is "PLAIN", "SCRAM-SHA-256" or "SCRAM-SHA-512". Default "":
	// no SASL. (For OAUTHBEARER or GSSAPI, configure Config.Sarama
	// yourself.)
	Mechanism string `env:"KAFKA_SASL_MECHANISM"`
	// User is the SASL user name. Required with a Mechanism.
	User string `env:"KAFKA_SASL_USER"`
	// Password is the SASL password (the variable is taken as is, white
	// space included). Required with a Mechanism.
	Password string `env:"KAFKA_SASL_PASSWORD,raw"`
	// AllowPlaintext permits SASL on a connection without TLS, where PLAIN
	// sends the password in clear and every mechanism leaves the
	// authenticated session open to anyone on the path. Default false: SASL
	// needs KafkaTLS.
	AllowPlaintext bool `env:"KAFKA_SASL_ALLOW_PLAINTEXT"`
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

// SaramaConfig returns the relay's producer configuration: a copy of
// Sarama (default relay.DefaultSaramaConfig()) with KafkaTLS, KafkaSASL
// and Partitioner applied and Producer.MaxMessageBytes set from
// Writer.Limits.MaxRecordBytes, so that sarama takes every record the relay
// sends. Give it to relay.NewSaramaPublisher to publish as fxoutbox does.
func (c Config) SaramaConfig() (*sarama.Config, error) {
	sc, err := c.saramaConfig()
	return sc, c.env.Rename(err)
}

func (c Config) saramaConfig() (*sarama.Config, error) {
	cfg, err := c.withDefaults()
	if err != nil {
		return nil, err
	}
	sc := relay.DefaultSaramaConfig()
	if cfg.Sarama != nil {
		cp := *cfg.Sarama
		sc = &cp
	}
	if err := applyKafkaSecurity(sc, cfg.KafkaTLS, cfg.KafkaSASL); err != nil {
		return nil, err
	}
	if err := applyPartitioner(sc, cfg.Partitioner); err != nil {
		return nil, err
	}
	// The one size rule: sarama, which counts a record without its batch
	// header, takes every record the relay sends.
	sc.Producer.MaxMessageBytes = cfg.Writer.Limits.MaxRecordBytes
	return sc, nil
}

// ConsumerConfig returns the inbox.Config of the consumer fxoutbox's InboxModule
// builds from ic next to the outbox's c: Consumer.Brokers, else c's
// brokers with c's KafkaTLS and KafkaSASL (unless ic sets its own), and a
// copy of Consumer.Sarama (default inbox.DefaultSaramaConfig()) with them
// applied. Routes, Logger and the providers are left as ic has them.
func (ic InboxConfig) ConsumerConfig(c Config) (inbox.Config, error) {
	cfg := ic.Consumer
	tlsCfg, saslCfg := ic.KafkaTLS, ic.KafkaSASL
	if len(cfg.Brokers) == 0 {
		cfg.Brokers = c.Brokers
		if tlsCfg == (KafkaTLS{}) {
			tlsCfg = c.KafkaTLS
		}
		if saslCfg == (KafkaSASL{}) {
			saslCfg = c.KafkaSASL
		}
	}
	if cfg.Sarama == nil {
		cfg.Sarama = inbox.DefaultSaramaConfig()
	} else {
		cp := *cfg.Sarama
		cfg.Sarama = &cp
	}
	if err := applyKafkaSecurity(cfg.Sarama, tlsCfg, saslCfg); err != nil {
		return inbox.Config{}, err
	}
	return cfg, nil
}

// applyKafkaSecurity sets sc's Net.TLS from t and Net.SASL from s, reading
// the TLS files. Settings left zero leave sc as it is, so TLS or SASL
// configured on sc directly stays; configuring one of them both ways is an
// error. Then, whichever way they were set, it refuses SASL on a connection
// without TLS unless s.AllowPlaintext.
func applyKafkaSecurity(sc *sarama.Config, t KafkaTLS, s KafkaSASL) error {
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

// errSASLPlaintext is the error of SASL without TLS and without
// KafkaSASL.AllowPlaintext.
func errSASLPlaintext() error {
	return &outbox.ConfigError{Field: "KafkaSASL.AllowPlaintext [KAFKA_SASL_ALLOW_PLAINTEXT]", Reason: "is off, and SASL is on without TLS: " +
		"credentials and the session would cross the network in clear. Enable TLS (KafkaTLS.Enable, KAFKA_TLS=on), " +
		"or set KAFKA_SASL_ALLOW_PLAINTEXT=on on a network you trust"}
}

// validateKafkaSecurity checks t and s without reading files.
func validateKafkaSecurity(t KafkaTLS, s KafkaSASL) error {
	bad := func(field, reason string) error { return &outbox.ConfigError{Field: field, Reason: reason} }
	if !t.Enable {
		for _, f := range []struct{ field, v string }{
			{"KafkaTLS.CAFile [KAFKA_TLS_CA_FILE]", t.CAFile},
			{"KafkaTLS.CertFile [KAFKA_TLS_CERT_FILE]", t.CertFile},
			{"KafkaTLS.KeyFile [KAFKA_TLS_KEY_FILE]", t.KeyFile},
			{"KafkaTLS.ServerName [KAFKA_TLS_SERVER_NAME]", t.ServerName},
		} {
			if f.v != "" {
				return bad(f.field, "is set but TLS is off: enable it (KafkaTLS.Enable, KAFKA_TLS=on) or unset this")
			}
		}
		if t.InsecureSkipVerify {
			return bad("KafkaTLS.InsecureSkipVerify [KAFKA_TLS_INSECURE_SKIP_VERIFY]", "is set but TLS is off: enable it (KafkaTLS.Enable, KAFKA_TLS=on) or unset this")
		}
	}
	if (t.CertFile == "") != (t.KeyFile == "") {
		return bad("KafkaTLS.CertFile/KeyFile [KAFKA_TLS_CERT_FILE, KAFKA_TLS_KEY_FILE]", "only one is set: a client certificate needs both its certificate and its key file")
	}
	if s.Mechanism == "" {
		if s.User != "" || s.Password != "" {
			return bad("KafkaSASL.Mechanism [KAFKA_SASL_MECHANISM]", "is empty but a SASL user or password is set: name the mechanism (PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512)")
		}
		return nil
	}
	switch sarama.SASLMechanism(strings.ToUpper(s.Mechanism)) {
	case sarama.SASLTypePlaintext, sarama.SASLTypeSCRAMSHA256, sarama.SASLTypeSCRAMSHA512:
	default:
		return bad("KafkaSASL.Mechanism [KAFKA_SASL_MECHANISM]", fmt.Sprintf("%q is not supported: use PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512 (for OAUTHBEARER or GSSAPI, configure Config.Sarama yourself)", s.Mechanism))
	}
	if s.User == "" {
		return bad("KafkaSASL.User [KAFKA_SASL_USER]", "is empty: SASL needs the user name the brokers know")
	}
	if s.Password == "" {
		return bad("KafkaSASL.Password [KAFKA_SASL_PASSWORD]", "is empty: SASL needs the user's password")
	}
	if strings.HasPrefix(strings.ToUpper(s.Mechanism), "SCRAM-") {
		// SASLprep rejects some passwords; fail now rather than at every
		// connection. scram's error does not echo the password; ours names
		// no part of it either.
		if _, err := scram.SHA256.NewClient(s.User, s.Password, ""); err != nil {
			return bad("KafkaSASL.User/Password [KAFKA_SASL_USER, KAFKA_SASL_PASSWORD]", "cannot be prepared for SCRAM (SASLprep, RFC 4013): use printable Unicode text")
		}
	}
	return nil
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

// applyPartitioner sets sc's Producer.Partitioner to p, unless p is zero
// (sc's stays; sarama refuses a nil one). sc's may be replaced only when it
// is one of the hashes a relay.Partitioner names.
func applyPartitioner(sc *sarama.Config, p relay.Partitioner) error {
	const field = "Partitioner [OUTBOX_PARTITIONER]"
	if !partitioner.Valid(int(p)) {
		return &outbox.ConfigError{Field: field, Reason: fmt.Sprintf("is %v: use relay.Murmur2, relay.FNV1a or relay.CRC32 (%s)", p, choiceNames(reflect.TypeFor[relay.Partitioner]()))}
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
