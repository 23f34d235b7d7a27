package relay_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"fmt"
	"math/big"
	"sync"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fxoutbox/outbox"
	"github.com/fxoutbox/outbox/internal/testenv"
	"github.com/fxoutbox/outbox/relay"
	"github.com/fxoutbox/outbox/relay/internal/failure"
)

// publishErr publishes one message through a real SaramaPublisher with cfg
// and returns its error.
func publishErr(t *testing.T, addrs []string, cfg *sarama.Config) error {
	t.Helper()
	cfg.Metadata.Retry.Max, cfg.Metadata.Retry.Backoff = 1, 10*time.Millisecond
	cfg.Net.DialTimeout, cfg.Net.ReadTimeout, cfg.Net.WriteTimeout = 3*time.Second, 3*time.Second, 3*time.Second
	p, err := relay.NewSaramaPublisher(addrs, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = p.Close() }()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	err = p.Publish(ctx, []relay.Message{{Topic: "errortype.topic", Value: []byte("{}")}})
	if err == nil {
		t.Fatal("publish succeeded; want a failure")
	}
	return err
}

// The causes of real failures, produced by real clients against real
// servers, map to their documented error.type.
func TestErrorTypeOfRealFailures(t *testing.T) {
	t.Parallel()
	pool := testenv.Pool(t)
	ctx := context.Background()

	tlsCfg := relay.DefaultSaramaConfig()
	tlsCfg.Net.TLS.Enable = true
	tlsCfg.Net.TLS.Config = &tls.Config{ServerName: "localhost", MinVersion: tls.VersionTLS12}
	untrusted := tlsServer(t)

	var pgErr error
	_, pgErr = pool.Exec(ctx, "SELECT * FROM no_such_table_for_errortype")
	dead, err := pgxpool.New(ctx, "postgres://postgres@"+closedAddr(t)+"/outbox?sslmode=disable&connect_timeout=2")
	if err != nil {
		t.Fatal(err)
	}
	defer dead.Close()
	_, deadErr := dead.Exec(ctx, "SELECT 1")

	for _, c := range []struct {
		name string
		err  error
		want string
	}{
		{"connection refused", publishErr(t, []string{closedAddr(t)}, relay.DefaultSaramaConfig()), failure.BrokerUnreachable},
		{"TLS to a plaintext broker", publishErr(t, []string{untrusted}, tlsCfg), failure.TLS},
		{"plaintext to a TLS listener", publishErr(t, []string{untrusted}, relay.DefaultSaramaConfig()), failure.BrokerUnreachable},
		{"missing table", pgErr, "database.schema"},
		{"database refuses connections", deadErr, "database.connection"},
	} {
		if got := failure.Type(c.err); got != c.want {
			t.Errorf("%s: failure.Type(%v) = %q, want %q", c.name, c.err, got, c.want)
		}
	}
}

// Each cause maps to its documented value through the wrapping the relay
// and sarama add.
func TestErrorTypeValues(t *testing.T) {
	t.Parallel()
	wrap := func(err error) error { return fmt.Errorf("relay: 3 of 3 events not published: %w", err) }
	for _, c := range []struct {
		err  error
		want string
	}{
		{nil, ""},
		{errors.New("something"), failure.Other},
		{wrap(relay.ErrHeld), failure.Held},
		{wrap(context.Canceled), failure.Canceled},
		{wrap(context.DeadlineExceeded), failure.Timeout},
		{wrap(sarama.ErrOutOfBrokers), failure.BrokerUnreachable},
		{sarama.Wrap(sarama.ErrOutOfBrokers, sarama.ErrSASLAuthenticationFailed), failure.Authentication},
		{sarama.Wrap(sarama.ErrOutOfBrokers, x509.UnknownAuthorityError{}), failure.TLS},
		{outbox.Permanent(sarama.ErrMessageSizeTooLarge), "kafka.message_too_large"},
		{&relay.BatchError{Failed: map[int]error{0: outbox.Permanent(sarama.ErrUnknownTopicOrPartition)}}, "kafka.unknown_topic_or_partition"},
		{wrap(sarama.ErrNotLeaderForPartition), "kafka.not_leader_or_follower"},
		{wrap(sarama.ErrTopicAuthorizationFailed), "kafka.topic_authorization_failed"},
		{sarama.KError(9999), failure.Other},
		{sarama.ConfigurationError("too big"), failure.Configuration},
	} {
		if got := failure.Type(c.err); got != c.want {
			t.Errorf("failure.Type(%v) = %q, want %q", c.err, got, c.want)
		}
	}
}

// tlsServer listens with a self-signed certificate no client trusts and
// completes the server side of every handshake it is offered; it stops
// when the test ends.
func tlsServer(t *testing.T) string {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "localhost"}, DNSNames: []string{"localhost"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour)}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	l, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{Certificates: []tls.Certificate{{Certificate: [][]byte{der}, PrivateKey: key}}, MinVersion: tls.VersionTLS12})
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			_ = c.SetDeadline(time.Now().Add(5 * time.Second))
			_ = c.(*tls.Conn).Handshake()
			_ = c.Close()
		}
	}()
	t.Cleanup(func() { _ = l.Close(); wg.Wait() })
	return l.Addr().String()
}
