// Package envconfig reads the outbox's settings from environment
// variables: the one implementation behind fxoutbox.ConfigFromEnv,
// ConfigFromEnvPrefix and InboxConfigFromEnv, and the outboxctl command,
// which so reads them without linking fx. It parses and checks values;
// defaults stay with the packages that apply them (zero means the
// default). Errors are *outbox.ConfigError values naming the variable as it
// is set.
package envconfig

import (
	"errors"
	"fmt"
	"net"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/IBM/sarama"
	"github.com/xdg-go/scram"

	"github.com/fxoutbox/outbox"
	"github.com/fxoutbox/outbox/inbox"
	"github.com/fxoutbox/outbox/internal/partitioner"
	"github.com/fxoutbox/outbox/internal/textcut"
	"github.com/fxoutbox/outbox/relay"
)

// Outbox holds what Read found: the fields of fxoutbox.Config of the same
// names (fxoutbox copies them by name), with TopicCheck as its int.
type Outbox struct {
	Service                string
	Table                  outbox.Table
	Topics                 outbox.TopicFunc
	TopicCheck             int
	EventTypes             []EventType
	TopicPartitions        int32
	TopicReplicationFactor int16
	Limits                 outbox.Limits
	Migrate                bool
	Brokers                []string
	Sarama                 *sarama.Config
	KafkaTLS               KafkaTLS
	KafkaSASL              KafkaSASL
	Partitioner            relay.Partitioner
	PollInterval           time.Duration
	BatchSize              int
	MaxBatchSize           int
	SynchronousCommit      bool
	Workers                int
	BatchTimeout           time.Duration
	MaxBackoff             time.Duration
	DisableRelay           bool
	Ordering               relay.Ordering
	Lanes                  int
	Delivery               relay.Delivery
	Progress               relay.Progress
	TransactionTimeout     time.Duration
	ProgressTopic          string
	TransactionalID        string
	Retention              time.Duration
	CleanupInterval        time.Duration
	CleanupBatch           int
	StatsInterval          time.Duration
	DisableNotify          bool
	DisableListen          bool
	MaxAttempts            int
	Mode                   relay.Mode
	Stream                 relay.StreamConfig
	Poison                 outbox.PoisonPolicy
	CloudEvents            outbox.CloudEvents

	// Warnings are the unknown OUTBOX_ and KAFKA_ variables that are no
	// typo of a setting.
	Warnings []string
	// Names names the variables the settings were read from.
	Names Names
}

// KafkaTLS and KafkaSASL are fxoutbox's types of the same names (same
// fields, so fxoutbox converts them).
type KafkaTLS struct {
	Enable             bool
	CAFile             string
	CertFile           string
	KeyFile            string
	ServerName         string
	InsecureSkipVerify bool
}

type KafkaSASL struct {
	Mechanism      string
	User           string
	Password       string
	AllowPlaintext bool
}

// EventType is fxoutbox.EventType (same fields; fxoutbox converts them).
type EventType struct {
	AggregateType string
	Type          string
	Topic         string
}

// The values of fxoutbox.TopicCheck.
const (
	TopicsOff = iota
	TopicsCheck
	TopicsCreate
)

// ExplicitTopics is fxoutbox.ExplicitTopics, the TopicFunc of
// OUTBOX_TOPIC_NAMING=explicit.
func ExplicitTopics(string, outbox.Event) (string, error) {
	return "", errors.New("is empty, and this service derives no topic names (OUTBOX_TOPIC_NAMING=explicit): set the event's Topic")
}

// Inbox is what ReadInbox found: fxoutbox.InboxConfig's fields.
type Inbox struct {
	Consumer inbox.Config
	Migrate  bool
}

// ValidateBrokers checks that every address is host:port with a port
// number; field names the setting in errors.
func ValidateBrokers(brokers []string, field string) error {
	if len(brokers) == 0 {
		return &outbox.ConfigError{Field: field, Reason: "is empty: list the Kafka bootstrap servers as host:port, or supply a relay.Publisher"}
	}
	for _, b := range brokers {
		host, port, err := net.SplitHostPort(b)
		if err != nil || host == "" {
			return &outbox.ConfigError{Field: field, Reason: fmt.Sprintf("%s is not host:port: write it with the port, e.g. %s", textcut.Quote(b, 64), example(b))}
		}
		if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
			return &outbox.ConfigError{Field: field, Reason: fmt.Sprintf("%s has no valid port (1-65535): write it as host:port, e.g. %s", textcut.Quote(b, 64), example(host))}
		}
	}
	return nil
}

// example suggests host:9092 for an address without a port.
func example(host string) string {
	if len(host) > 64 || strings.ContainsAny(host, ":/ \t") {
		return "kafka-1.internal:9092"
	}
	return host + ":9092"
}

// Names maps a setting's variable name to the one a configuration is
// read from (see Read).
type Names struct {
	prefix string
	kafka  bool // the KAFKA_ variables are prefixed too
}

var envPrefixRE = regexp.MustCompile(`^[A-Z][A-Z0-9_]*_$`)

// NewNames checks prefix and says whether the KAFKA_ variables are
// prefixed too (one is set in environ).
func NewNames(prefix string, environ []string) (Names, error) {
	if prefix == "" {
		return Names{}, nil
	}
	if !envPrefixRE.MatchString(prefix) || strings.HasPrefix(prefix, "OUTBOX_") || strings.HasPrefix(prefix, "KAFKA_") {
		return Names{}, &outbox.ConfigError{Field: "prefix", Reason: fmt.Sprintf("%s is not usable: use upper-case letters, digits and underscores "+
			"ending with '_' and not starting with OUTBOX_ or KAFKA_, e.g. AUDIT_", textcut.Quote(prefix, 64))}
	}
	n := Names{prefix: prefix}
	n.kafka = slices.ContainsFunc(environ, func(kv string) bool { return strings.HasPrefix(kv, prefix+"KAFKA_") })
	return n, nil
}

// Name is the variable that holds the setting named v in ConfigFromEnv.
func (n Names) Name(v string) string {
	if n.prefix != "" && (strings.HasPrefix(v, "OUTBOX_") || (n.kafka && strings.HasPrefix(v, "KAFKA_"))) {
		return n.prefix + v
	}
	return v
}

var envVarRE = regexp.MustCompile(`\b(OUTBOX|KAFKA)_[A-Z0-9_]*[A-Z0-9]\b`)

// Text is s with the variables named as they are set.
func (n Names) Text(s string) string {
	if n.prefix == "" {
		return s
	}
	return envVarRE.ReplaceAllStringFunc(s, n.Name)
}

// Rename makes an error name the variables as they are set: a
// ConfigError is rebuilt with the names replaced; any other error keeps its
// chain (errors.Is, errors.As) under a text with the names replaced.
func (n Names) Rename(err error) error {
	if err == nil || n.prefix == "" {
		return err
	}
	if ce, ok := err.(*outbox.ConfigError); ok {
		return &outbox.ConfigError{Field: envVarRE.ReplaceAllStringFunc(ce.Field, n.Name), Reason: envVarRE.ReplaceAllStringFunc(ce.Reason, n.Name), Err: ce.Err}
	}
	text := envVarRE.ReplaceAllStringFunc(err.Error(), n.Name)
	if text == err.Error() {
		return err
	}
	return &renamed{text: text, err: err}
}

// renamed is an error whose text names the variables as they are set.
type renamed struct {
	text string
	err  error
}

func (r *renamed) Error() string { return r.text }
func (r *renamed) Unwrap() error { return r.err }

// Read reads the settings of fxoutbox.ConfigFromEnvPrefix (prefix "" for
// ConfigFromEnv) through lookupEnv; environ, when given, is scanned for
// unknown variables. It reads each setting's unprefixed name through
// Names.Name, and its errors name the variables as set. It is long on
// purpose: one short block per variable, in the order docs/configuration.md lists
// them, so that each variable is read, checked and named in one place.
func Read(prefix string, lookupEnv func(string) (string, bool), environ ...string) (c Outbox, err error) {
	env, err := NewNames(prefix, environ)
	if err != nil {
		return c, err
	}
	defer func() { err = env.Rename(err) }()
	c.Names = env
	known := map[string]bool{}
	lookup := func(name string) (string, bool) {
		known[env.Name(name)] = true
		return lookupEnv(env.Name(name))
	}
	get := func(name string) (string, bool) {
		v, ok := lookup(name)
		if v = strings.TrimSpace(v); !ok || v == "" {
			return "", false
		}
		return v, true
	}
	c.Service, _ = get("OUTBOX_SERVICE")
	c.Table.Schema, _ = get("OUTBOX_SCHEMA")
	c.Table.Name, _ = get("OUTBOX_TABLE")
	if err := choose(get, "OUTBOX_TOPIC_NAMING", `"per-event", "per-aggregate" or "explicit"`,
		map[string]outbox.TopicFunc{"per-event": outbox.TopicPerEvent, "per-aggregate": outbox.TopicPerAggregate, "explicit": ExplicitTopics}, &c.Topics, nil); err != nil {
		return c, err
	}
	if err := choose(get, "OUTBOX_TOPICS", `"off", "check" or "create"`,
		map[string]int{"off": TopicsOff, "check": TopicsCheck, "create": TopicsCreate}, &c.TopicCheck, strings.ToLower); err != nil {
		return c, err
	}
	if v, ok := get("OUTBOX_EVENT_TYPES"); ok {
		if c.EventTypes, err = eventTypes(v); err != nil {
			return c, err
		}
	}
	for _, n := range []struct {
		name string
		bits int
		set  func(int64)
	}{
		{"OUTBOX_TOPIC_PARTITIONS", 32, func(v int64) { c.TopicPartitions = int32(v) }},
		{"OUTBOX_TOPIC_REPLICATION_FACTOR", 16, func(v int64) { c.TopicReplicationFactor = int16(v) }},
	} {
		if v, ok := get(n.name); ok {
			x, err := strconv.ParseInt(v, 10, n.bits)
			if err != nil || (x < 1 && x != -1) {
				return c, bad(n.name, v, "a positive number, or -1 for the broker's default")
			}
			n.set(x)
		}
	}
	for _, n := range []struct {
		name string
		dst  *int
	}{
		{"OUTBOX_MAX_RECORD_BYTES", &c.Limits.MaxRecordBytes},
		{"OUTBOX_MAX_PAYLOAD_BYTES", &c.Limits.MaxPayloadBytes},
		{"OUTBOX_MAX_TYPE_BYTES", &c.Limits.MaxTypeBytes},
		{"OUTBOX_MAX_AGGREGATE_TYPE_BYTES", &c.Limits.MaxAggregateTypeBytes},
		{"OUTBOX_MAX_AGGREGATE_ID_BYTES", &c.Limits.MaxAggregateIDBytes},
		{"OUTBOX_MAX_KEY_BYTES", &c.Limits.MaxKeyBytes},
		{"OUTBOX_MAX_HEADERS", &c.Limits.MaxHeaders},
		{"OUTBOX_MAX_HEADER_BYTES", &c.Limits.MaxHeaderBytes},
		{"OUTBOX_BATCH_SIZE", &c.BatchSize},
		{"OUTBOX_MAX_BATCH_SIZE", &c.MaxBatchSize},
		{"OUTBOX_WORKERS", &c.Workers},
		{"OUTBOX_MAX_ATTEMPTS", &c.MaxAttempts},
		{"OUTBOX_LANES", &c.Lanes},
		{"OUTBOX_CLEANUP_BATCH", &c.CleanupBatch},
	} {
		if v, ok := get(n.name); ok {
			if *n.dst, err = strconv.Atoi(v); err != nil || *n.dst <= 0 {
				return c, bad(n.name, v, "a positive number")
			}
		}
	}
	if err := choose(get, "OUTBOX_MIGRATE", "true or false (on or off)", onOff(true), &c.Migrate, strings.ToLower); err != nil {
		return c, err
	}
	if v, ok := get("KAFKA_BROKERS"); ok {
		for _, b := range strings.Split(v, ",") {
			if b = strings.TrimSpace(b); b != "" {
				c.Brokers = append(c.Brokers, b)
			}
		}
		if err := ValidateBrokers(c.Brokers, "KAFKA_BROKERS"); err != nil {
			return c, err
		}
	}
	id, hasID := get("KAFKA_CLIENT_ID")
	ver, hasVer := get("KAFKA_VERSION")
	if hasID || hasVer {
		sc := relay.DefaultSaramaConfig()
		if hasID {
			sc.ClientID = id
		}
		if hasVer {
			if sc.Version, err = sarama.ParseKafkaVersion(ver); err != nil {
				return c, bad("KAFKA_VERSION", ver, "a Kafka version such as 3.7.0")
			}
		}
		c.Sarama = sc
	}
	if err := kafkaSecurityFrom(get, lookup, &c); err != nil {
		return c, err
	}
	for _, d := range []struct {
		name string
		dst  *time.Duration
	}{
		{"OUTBOX_POLL_INTERVAL", &c.PollInterval},
		{"OUTBOX_BATCH_TIMEOUT", &c.BatchTimeout},
		{"OUTBOX_MAX_BACKOFF", &c.MaxBackoff},
		{"OUTBOX_CLEANUP_INTERVAL", &c.CleanupInterval},
		{"OUTBOX_STATS_INTERVAL", &c.StatsInterval},
		{"OUTBOX_TRANSACTION_TIMEOUT", &c.TransactionTimeout},
	} {
		if v, ok := get(d.name); ok {
			if *d.dst, err = time.ParseDuration(v); err != nil || *d.dst <= 0 {
				return c, bad(d.name, v, "a positive duration such as 500ms")
			}
		}
	}
	switches := func(name string, dst *bool, on bool) error {
		return choose(get, name, "on or off", onOff(on), dst, strings.ToLower)
	}
	for _, e := range []error{
		switches("OUTBOX_RELAY", &c.DisableRelay, false),
		switches("OUTBOX_NOTIFY", &c.DisableNotify, false),
		switches("OUTBOX_LISTEN", &c.DisableListen, false),
		switches("OUTBOX_SYNCHRONOUS_COMMIT", &c.SynchronousCommit, true),
		choose(get, "OUTBOX_ORDERING", `"per-key" or "unordered"`, map[string]relay.Ordering{"per-key": relay.PerKey, "unordered": relay.Unordered}, &c.Ordering, nil),
		choose(get, "OUTBOX_DELIVERY", `"at-least-once" or "exactly-once"`, map[string]relay.Delivery{"at-least-once": relay.AtLeastOnce, "exactly-once": relay.ExactlyOnce}, &c.Delivery, strings.ToLower),
		choose(get, "OUTBOX_PROGRESS", `"marks" or "cursor"`, map[string]relay.Progress{"marks": relay.ProgressMarks, "cursor": relay.ProgressCursor}, &c.Progress, strings.ToLower),
		choose(get, "OUTBOX_POISON", `"park" or "hold"`, map[string]outbox.PoisonPolicy{"park": outbox.Park, "hold": outbox.Hold}, &c.Poison, nil),
		choose(get, "OUTBOX_RELAY_MODE", `"poll" or "stream"`, map[string]relay.Mode{"poll": relay.Poll, "stream": relay.Stream}, &c.Mode, strings.ToLower),
		choose(get, "OUTBOX_PARTITIONER", partitioner.Names,
			map[string]relay.Partitioner{"murmur2": relay.Murmur2, "fnv1a": relay.FNV1a, "crc32": relay.CRC32}, &c.Partitioner, strings.ToLower),
	} {
		if e != nil {
			return c, e
		}
	}
	if err := choose(get, "OUTBOX_CLOUDEVENTS", `"off" or "binary"`,
		map[string]outbox.CloudEventsMode{"off": outbox.CloudEventsOff, "binary": outbox.CloudEventsBinary}, &c.CloudEvents.Mode, strings.ToLower); err != nil {
		return c, err
	}
	c.CloudEvents.Source, _ = get("OUTBOX_CLOUDEVENTS_SOURCE")
	c.ProgressTopic, _ = get("OUTBOX_PROGRESS_TOPIC")
	c.TransactionalID, _ = get("OUTBOX_TRANSACTIONAL_ID")
	if v, ok := get("OUTBOX_STREAM_MAX_LAG"); ok {
		if c.Stream.MaxLag, err = time.ParseDuration(v); err != nil || c.Stream.MaxLag <= 0 {
			return c, bad("OUTBOX_STREAM_MAX_LAG", v, "a positive duration such as 30s")
		}
	}
	if v, ok := get("OUTBOX_STREAM_MAX_LAG_BYTES"); ok {
		if c.Stream.MaxLagBytes, err = strconv.ParseInt(v, 10, 64); err != nil || c.Stream.MaxLagBytes <= 0 {
			return c, bad("OUTBOX_STREAM_MAX_LAG_BYTES", v, "a positive number of bytes such as 1073741824")
		}
	}
	if v, ok := get("OUTBOX_RETENTION"); ok {
		if v == "forever" {
			c.Retention = -1
		} else if c.Retention, err = time.ParseDuration(v); err != nil || c.Retention <= 0 {
			return c, bad("OUTBOX_RETENTION", v, `a positive duration such as 72h, or "forever"`)
		}
	}
	if err := c.Table.Validate(); err != nil {
		// Name the variable the value came from, not the Go field.
		var ce *outbox.ConfigError
		if errors.As(err, &ce) {
			if v, ok := map[string]string{"Table.Schema": "OUTBOX_SCHEMA", "Table.Name": "OUTBOX_TABLE"}[ce.Field]; ok {
				return c, &outbox.ConfigError{Field: v, Reason: ce.Reason, Err: ce.Err}
			}
		}
		return c, err
	}
	if prefix == "" {
		for _, n := range InboxVariables {
			known[n] = true // read by InboxConfigFromEnv
		}
		// The project's scripts' variables are no typos, nor a setting
		// another one could be a typo of.
		environ = slices.DeleteFunc(slices.Clone(environ), func(kv string) bool {
			name, _, _ := strings.Cut(kv, "=")
			return slices.Contains(ScriptVariables, name)
		})
	}
	if c.Warnings, err = unknownVariablesOf(environ, known, prefix+"OUTBOX_", prefix+"KAFKA_"); err != nil {
		return c, err
	}
	return c, nil
}

// ScriptVariables are the variables that the project's own scripts read
// (scripts/kafka.sh, scripts/pg.sh; scripts/devkafka.sh reads DEVKAFKA_*
// and KAFKA_BROKERS), which start like the settings: exported in the shell
// that runs a service, they are neither typos nor warnings. A test keeps
// the list in step with the scripts.
var ScriptVariables = []string{
	// scripts/kafka.sh
	"KAFKA_PORT", "KAFKA_CONTROLLER_PORT", "KAFKA_START_TIMEOUT", "KAFKA_HEAP_OPTS", "KAFKA_JVM_OPTS", "KAFKA_STATE_DIR",
	"KAFKA_CLUSTER_ID", "KAFKA_NODE_ID", "KAFKA_QUORUM_VOTERS", "KAFKA_REPLICATION_FACTOR", "KAFKA_MIN_INSYNC_REPLICAS",
	"KAFKA_TXN_ABORT_CLEANUP_INTERVAL_MS",
	// scripts/pg.sh
	"OUTBOX_PG_DIR", "OUTBOX_PG_PORT", "OUTBOX_PG_BINDIR", "OUTBOX_PG_WAL_LEVEL",
}

// eventTypes parses OUTBOX_EVENT_TYPES: entries separated by commas or
// white space, each <aggregate-type>:<event-type> (its topic derived as the
// writer derives it), <aggregate-type>:<event-type>=<topic> (an event that
// names its topic), or =<topic> alone.
func eventTypes(v string) ([]EventType, error) {
	const want = "a list of <aggregate-type>:<event-type> (or <aggregate-type>:<event-type>=<topic>, or =<topic>, for events that name their topic), " +
		"separated by commas, e.g. payment:payment.created.v1,refund:refund.issued.v1=ledger.refunds"
	var out []EventType
	for _, e := range strings.FieldsFunc(v, func(r rune) bool { return r == ',' || r == ' ' || r == '\t' || r == '\n' || r == '\r' }) {
		var et EventType
		lhs := e
		if i := strings.LastIndexByte(e, '='); i >= 0 {
			lhs, et.Topic = e[:i], e[i+1:]
			if err := outbox.ValidateTopic(et.Topic); err != nil {
				return nil, &outbox.ConfigError{Field: "OUTBOX_EVENT_TYPES", Reason: fmt.Sprintf("%s: the topic %v", textcut.Quote(e, 64), err)}
			}
		}
		if lhs != "" || et.Topic == "" {
			agg, typ, ok := strings.Cut(lhs, ":")
			if !ok || strings.TrimSpace(agg) == "" || strings.TrimSpace(typ) == "" {
				return nil, bad("OUTBOX_EVENT_TYPES", e, want)
			}
			et.AggregateType, et.Type = agg, typ
		}
		out = append(out, et)
	}
	if len(out) == 0 {
		return nil, bad("OUTBOX_EVENT_TYPES", v, want)
	}
	return out, nil
}

// UnknownVariables checks the OUTBOX_ and KAFKA_ variables of environ
// against the settings read (known): one close to a setting's name is an
// error naming both, any other one a warning.
func UnknownVariables(environ []string, known map[string]bool) ([]string, error) {
	return unknownVariablesOf(environ, known, "OUTBOX_", "KAFKA_")
}

// unknownVariablesOf is unknownVariables for the variables whose names
// start with one of prefixes.
func unknownVariablesOf(environ []string, known map[string]bool, prefixes ...string) ([]string, error) {
	var warnings []string
	for _, kv := range environ {
		name, _, _ := strings.Cut(kv, "=")
		if known[name] || !slices.ContainsFunc(prefixes, func(p string) bool { return strings.HasPrefix(name, p) }) {
			continue
		}
		best, dist := "", 1<<30
		for k := range known {
			if d := typoDistance(name, k); d < dist || (d == dist && k < best) {
				best, dist = k, d
			}
		}
		// One edit away, or two for long names, is a typo; KAFKA_OPTS (a
		// JVM setting) is two away from KAFKA_TLS and is not.
		if dist == 0 || dist == 1 || (dist == 2 && len(best) > 14) {
			return nil, &outbox.ConfigError{Field: strings.Trim(textcut.Quote(name, 64), `"`), Reason: fmt.Sprintf("is not a setting of the outbox: did you mean %s? "+
				"Rename it (an unknown OUTBOX_ or KAFKA_ variable this close to a setting is taken for a typo)", best)}
		}
		warnings = append(warnings, fmt.Sprintf("%s is set but is not a setting of the outbox; it is ignored", textcut.Quote(name, 64)))
	}
	slices.Sort(warnings)
	return warnings, nil
}

// typoDistance is the edit distance between a and b, ignoring case and
// underscores (OUTBOX_BATCHSIZE is 0 away from OUTBOX_BATCH_SIZE).
func typoDistance(a, b string) int {
	norm := func(s string) []rune { return []rune(strings.ToUpper(strings.ReplaceAll(s, "_", ""))) }
	x, y := norm(a), norm(b)
	prev := make([]int, len(y)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(x); i++ {
		cur := make([]int, len(y)+1)
		cur[0] = i
		for j := 1; j <= len(y); j++ {
			cost := 1
			if x[i-1] == y[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev = cur
	}
	return prev[len(y)]
}

// choose sets *dst to the choice named by the variable name, if it is set
// (after fold, when not nil); any other value is a ConfigError saying what
// is accepted (want).
func choose[T any](get func(string) (string, bool), name, want string, choices map[string]T, dst *T, fold func(string) string) error {
	v, ok := get(name)
	if !ok {
		return nil
	}
	key := v
	if fold != nil {
		key = fold(v)
	}
	x, found := choices[key]
	if !found {
		return bad(name, v, want)
	}
	*dst = x
	return nil
}

// onOff maps the spellings of a switch, in lower case, to on for on/true/1
// and to !on for off/false/0.
func onOff(on bool) map[string]bool {
	return map[string]bool{"on": on, "true": on, "1": on, "off": !on, "false": !on, "0": !on}
}

// ErrSASLPlaintext is the error of SASL without TLS and without
// KafkaSASL.AllowPlaintext.
func ErrSASLPlaintext() error {
	return &outbox.ConfigError{Field: "KafkaSASL.AllowPlaintext [KAFKA_SASL_ALLOW_PLAINTEXT]", Reason: "is off, and SASL is on without TLS: " +
		"credentials and the session would cross the network in clear. Enable TLS (KafkaTLS.Enable, KAFKA_TLS=on), " +
		"or set KAFKA_SASL_ALLOW_PLAINTEXT=on on a network you trust"}
}

// ValidateKafkaSecurity checks t and s without reading files.
func ValidateKafkaSecurity(t KafkaTLS, s KafkaSASL) error {
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

// kafkaSecurityFrom reads KafkaTLS and KafkaSASL from the environment.
// get trims values; lookup does not, for the password.
func kafkaSecurityFrom(get, lookup func(string) (string, bool), c *Outbox) error {
	for _, f := range []struct {
		name string
		dst  *bool
	}{
		{"KAFKA_TLS", &c.KafkaTLS.Enable},
		{"KAFKA_TLS_INSECURE_SKIP_VERIFY", &c.KafkaTLS.InsecureSkipVerify},
		{"KAFKA_SASL_ALLOW_PLAINTEXT", &c.KafkaSASL.AllowPlaintext},
	} {
		if err := choose(get, f.name, "on or off", onOff(true), f.dst, strings.ToLower); err != nil {
			return err
		}
	}
	for _, f := range []struct {
		name string
		dst  *string
	}{
		{"KAFKA_TLS_CA_FILE", &c.KafkaTLS.CAFile},
		{"KAFKA_TLS_CERT_FILE", &c.KafkaTLS.CertFile},
		{"KAFKA_TLS_KEY_FILE", &c.KafkaTLS.KeyFile},
		{"KAFKA_TLS_SERVER_NAME", &c.KafkaTLS.ServerName},
		{"KAFKA_SASL_MECHANISM", &c.KafkaSASL.Mechanism},
		{"KAFKA_SASL_USER", &c.KafkaSASL.User},
	} {
		if v, ok := get(f.name); ok {
			*f.dst = v
		}
	}
	c.KafkaSASL.Mechanism = strings.ToUpper(c.KafkaSASL.Mechanism)
	if v, ok := lookup("KAFKA_SASL_PASSWORD"); ok {
		c.KafkaSASL.Password = v
	}
	if err := ValidateKafkaSecurity(c.KafkaTLS, c.KafkaSASL); err != nil {
		return err
	}
	if c.KafkaSASL.Mechanism != "" && !c.KafkaTLS.Enable && !c.KafkaSASL.AllowPlaintext {
		return ErrSASLPlaintext() // also checked when applied; here ConfigFromEnv fails already
	}
	return nil
}

// InboxVariables are the variables ReadInbox reads. Read
// knows them too, so that a service running both modules gets no warning
// about them.
var InboxVariables = []string{
	"OUTBOX_INBOX_GROUP", "OUTBOX_INBOX_NAME", "OUTBOX_INBOX_BROKERS", "OUTBOX_INBOX_SCHEMA", "OUTBOX_INBOX_TABLE",
	"OUTBOX_INBOX_CONCURRENCY", "OUTBOX_INBOX_BATCH_SIZE", "OUTBOX_INBOX_MAX_ATTEMPTS", "OUTBOX_INBOX_POISON", "OUTBOX_INBOX_IDENTITY",
	"OUTBOX_INBOX_PARK_UNROUTED", "OUTBOX_INBOX_DEAD_LETTER_TOPIC", "OUTBOX_INBOX_MIN_BACKOFF", "OUTBOX_INBOX_MAX_BACKOFF", "OUTBOX_INBOX_TRY_TIMEOUT",
	"OUTBOX_INBOX_DRAIN_TIMEOUT", "OUTBOX_INBOX_RETENTION", "OUTBOX_INBOX_CLEANUP_INTERVAL", "OUTBOX_INBOX_MIGRATE",
}

// ReadInbox reads the settings of fxoutbox.InboxConfigFromEnv through
// lookupEnv; environ, when given, is scanned for OUTBOX_INBOX_ variables
// one typo away from a setting. Like Read, it is one short block per
// variable, on purpose.
func ReadInbox(lookupEnv func(string) (string, bool), environ ...string) (ic Inbox, err error) {
	c := &ic.Consumer
	get := func(name string) (string, bool) {
		v, ok := lookupEnv(name)
		if v = strings.TrimSpace(v); !ok || v == "" {
			return "", false
		}
		return v, true
	}
	c.Group, _ = get("OUTBOX_INBOX_GROUP")
	c.Name, _ = get("OUTBOX_INBOX_NAME")
	c.Table.Schema, _ = get("OUTBOX_INBOX_SCHEMA")
	c.Table.Name, _ = get("OUTBOX_INBOX_TABLE")
	if v, ok := get("OUTBOX_INBOX_DEAD_LETTER_TOPIC"); ok {
		if err := outbox.ValidateTopic(v); err != nil {
			return ic, &outbox.ConfigError{Field: "OUTBOX_INBOX_DEAD_LETTER_TOPIC", Reason: err.Error()}
		}
		c.DeadLetterTopic = v
	}
	if err := c.Table.Validate(); err != nil {
		return ic, &outbox.ConfigError{Field: "OUTBOX_INBOX_SCHEMA/OUTBOX_INBOX_TABLE", Reason: err.Error(), Err: err}
	}
	if v, ok := get("OUTBOX_INBOX_BROKERS"); ok {
		for _, b := range strings.Split(v, ",") {
			if b = strings.TrimSpace(b); b != "" {
				c.Brokers = append(c.Brokers, b)
			}
		}
		if err := ValidateBrokers(c.Brokers, "OUTBOX_INBOX_BROKERS"); err != nil {
			return ic, err
		}
	}
	for _, n := range []struct {
		name string
		dst  *int
	}{
		{"OUTBOX_INBOX_CONCURRENCY", &c.Concurrency},
		{"OUTBOX_INBOX_BATCH_SIZE", &c.BatchSize},
		{"OUTBOX_INBOX_MAX_ATTEMPTS", &c.MaxAttempts},
	} {
		if v, ok := get(n.name); ok {
			x, err := strconv.Atoi(v)
			if err != nil || x <= 0 {
				return ic, bad(n.name, v, "a positive number")
			}
			*n.dst = x
		}
	}
	for _, d := range []struct {
		name string
		dst  *time.Duration
	}{
		{"OUTBOX_INBOX_MIN_BACKOFF", &c.MinBackoff},
		{"OUTBOX_INBOX_MAX_BACKOFF", &c.MaxBackoff},
		{"OUTBOX_INBOX_TRY_TIMEOUT", &c.TryTimeout},
		{"OUTBOX_INBOX_DRAIN_TIMEOUT", &c.DrainTimeout},
		{"OUTBOX_INBOX_CLEANUP_INTERVAL", &c.CleanupInterval},
	} {
		if v, ok := get(d.name); ok {
			x, err := time.ParseDuration(v)
			if err != nil || x <= 0 {
				return ic, bad(d.name, v, "a positive duration such as 5s")
			}
			*d.dst = x
		}
	}
	if v, ok := get("OUTBOX_INBOX_RETENTION"); ok {
		if v == "forever" {
			c.Retention = -1
		} else if x, err := time.ParseDuration(v); err != nil || x <= 0 {
			return ic, bad("OUTBOX_INBOX_RETENTION", v, `a positive duration such as 720h, or "forever"`)
		} else {
			c.Retention = x
		}
	}
	for _, e := range []error{
		choose(get, "OUTBOX_INBOX_POISON", `"park" or "hold"`, map[string]outbox.PoisonPolicy{"park": outbox.Park, "hold": outbox.Hold}, &c.Poison, strings.ToLower),
		choose(get, "OUTBOX_INBOX_IDENTITY", `"event-id" or "event-id-or-position"`,
			map[string]inbox.IdentityFunc{"event-id": inbox.EventID, "event-id-or-position": inbox.EventIDOrPosition}, &c.Identity, strings.ToLower),
		choose(get, "OUTBOX_INBOX_PARK_UNROUTED", "on or off", onOff(true), &c.ParkUnrouted, strings.ToLower),
		choose(get, "OUTBOX_INBOX_MIGRATE", "true or false (on or off)", onOff(true), &ic.Migrate, strings.ToLower),
	} {
		if e != nil {
			return ic, e
		}
	}
	known := map[string]bool{}
	for _, n := range InboxVariables {
		known[n] = true
	}
	var mine []string
	for _, kv := range environ {
		if strings.HasPrefix(kv, "OUTBOX_INBOX_") {
			mine = append(mine, kv)
		}
	}
	if _, err := UnknownVariables(mine, known); err != nil {
		return ic, err
	}
	return ic, nil
}

// bad is the error of variable name holding v, which is not want: the value
// quoted and cut to 64 bytes, as every refusal of the loader shows it.
func bad(name, v, want string) error {
	return &outbox.ConfigError{Field: name, Reason: fmt.Sprintf("%s is not %s", textcut.Quote(v, 64), want)}
}
