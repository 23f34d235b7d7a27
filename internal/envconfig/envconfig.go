// Package envconfig is the machinery behind outboxconfig's environment
// reader that fxoutbox and outboxctl also need: the names of the variables
// under a prefix (AUDIT_OUTBOX_TABLE), typo detection for unknown OUTBOX_
// and KAFKA_ variables, broker address checks, and the variables of the
// project's scripts. The settings themselves, their fields and their
// variables (struct tags), are in outboxconfig and the engines' Configs.
package envconfig

import (
	"fmt"
	"net"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/fxoutbox/outbox"
	"github.com/fxoutbox/outbox/internal/textcut"
)

// Of returns the variables' names and the warnings of a configuration
// read from the environment (an outboxconfig.Config): fxoutbox names the
// variables as they are set in its errors and logs the warnings at start.
// outboxconfig sets it, so that neither needs an exported accessor.
var Of func(cfg any) (Names, []string)

// Read and ReadInbox are outboxconfig's readers with the environment given
// as a lookup function and a list of NAME=value (environ is scanned for
// typos): the seam fxoutbox's tests read their settings through.
var (
	Read      func(prefix string, lookup func(string) (string, bool), environ ...string) (any, error)
	ReadInbox func(lookup func(string) (string, bool), environ ...string) (any, error)
)

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

// UnknownVariables checks the variables of environ whose names start with
// one of prefixes against the settings read (known): one close to a
// setting's name is an error naming both, any other one a warning.
func UnknownVariables(environ []string, known map[string]bool, prefixes ...string) ([]string, error) {
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

// Bad is the error of variable name holding v, which is not want: the value
// quoted and cut to 64 bytes, as every refusal of the loader shows it.
func Bad(name, v, want string) error {
	return &outbox.ConfigError{Field: name, Reason: fmt.Sprintf("%s is not %s", textcut.Quote(v, 64), want)}
}
