package outboxconfig

import (
	"fmt"
	"os"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/IBM/sarama"

	"github.com/fxoutbox/outbox"
	"github.com/fxoutbox/outbox/inbox"
	"github.com/fxoutbox/outbox/internal/envconfig"
	"github.com/fxoutbox/outbox/internal/textcut"
	"github.com/fxoutbox/outbox/relay"
)

// FromEnv reads a Config from environment variables (Variables lists
// them). Unset variables keep the defaults; a malformed value is a
// *outbox.ConfigError naming the variable and what it takes. So is an
// OUTBOX_ or KAFKA_ variable that is not a setting but close to the name of
// one (a typo such as OUTBOX_BATCHSIZE); other unknown variables with these
// prefixes (those of other tools) are kept as warnings, which fxoutbox logs
// when the outbox starts.
func FromEnv() (Config, error) { return fromEnv("", os.LookupEnv, os.Environ()...) }

// FromEnvPrefix reads the Config of one more outbox in the same process
// (see fxoutbox.Named and NamedFromEnv) from the variables of FromEnv with
// prefix in front of their names: with prefix "AUDIT_",
// AUDIT_OUTBOX_SERVICE, AUDIT_OUTBOX_TABLE, AUDIT_OUTBOX_POLL_INTERVAL, and
// so on. Each outbox has its own OUTBOX_ settings: an unset prefixed one
// takes the default, never the value of the unprefixed variable. The Kafka
// settings (KAFKA_BROKERS, KAFKA_TLS*, KAFKA_SASL*, KAFKA_CLIENT_ID,
// KAFKA_VERSION) are shared: they are read from the unprefixed variables
// unless a variable starting with prefix+"KAFKA_" is set, and then all of
// them from the prefixed ones (another cluster). Validation, typo detection
// (AUDIT_OUTBOX_BATCHSIZE) and warnings are those of FromEnv; every error
// names the variable as it is set, and so do the errors of the Config's
// methods and of fxoutbox. The prefix is upper-case letters, digits and
// underscores ending with '_', not starting with OUTBOX_ or KAFKA_ (FromEnv
// would take its variables for its own); "" is FromEnv.
func FromEnvPrefix(prefix string) (Config, error) {
	return fromEnv(prefix, os.LookupEnv, os.Environ()...)
}

// InboxFromEnv reads an InboxConfig from environment variables (the
// OUTBOX_INBOX_ ones of Variables). Unset ones keep the defaults of
// inbox.Config; a malformed value, or an OUTBOX_INBOX_ variable one typo
// away from one of these, is an *outbox.ConfigError naming the variable.
// The brokers and their security come from Config (KAFKA_BROKERS,
// KAFKA_TLS*, KAFKA_SASL*) unless OUTBOX_INBOX_BROKERS names another
// cluster.
func InboxFromEnv() (InboxConfig, error) { return inboxFromEnv(os.LookupEnv, os.Environ()...) }

// Variable is one environment variable of FromEnv or InboxFromEnv.
type Variable struct {
	// Name is the variable's name, e.g. OUTBOX_BATCH_SIZE.
	Name string
	// Config is the type it sets a field of: "Config" or "InboxConfig".
	Config string
	// Field is the path of that field, e.g. Relay.BatchSize.
	Field string
	// Values says what it takes, e.g. "a positive number".
	Values string
}

// Variables lists every variable FromEnv and InboxFromEnv read, in the
// order of the fields they set: those of Config, then those of
// InboxConfig.
func Variables() []Variable {
	var out []Variable
	for _, s := range append(settingsOf(reflect.TypeFor[Config]()), settingsOf(reflect.TypeFor[InboxConfig]())...) {
		out = append(out, s.Variable)
	}
	return out
}

// setting is a Variable with how it is read: the field's index path in
// its Config, its type and the tag's options.
type setting struct {
	Variable
	index []int
	typ   reflect.Type
	opts  []string
	sub   string // a part of a composite field: "Schema", "Name", "ClientID", "Version"
}

func (s setting) has(opt string) bool { return slices.Contains(s.opts, opt) }

// choice is one spelling of a value of an enumerated setting.
type choice struct {
	name  string
	value any
}

// choices are the spellings of the enumerated settings' types, in the
// order their documentation lists them.
var choices = map[reflect.Type][]choice{
	reflect.TypeFor[outbox.TopicFunc](): {{"per-event", outbox.TopicFunc(outbox.TopicPerEvent)},
		{"per-aggregate", outbox.TopicFunc(outbox.TopicPerAggregate)}, {"explicit", outbox.TopicFunc(ExplicitTopics)}},
	reflect.TypeFor[TopicCheck]():             {{"off", TopicsOff}, {"check", TopicsCheck}, {"create", TopicsCreate}},
	reflect.TypeFor[relay.Mode]():             {{"poll", relay.Poll}, {"stream", relay.Stream}},
	reflect.TypeFor[relay.Ordering]():         {{"per-key", relay.PerKey}, {"unordered", relay.Unordered}},
	reflect.TypeFor[relay.Delivery]():         {{"at-least-once", relay.AtLeastOnce}, {"exactly-once", relay.ExactlyOnce}},
	reflect.TypeFor[relay.Progress]():         {{"auto", relay.ProgressAuto}, {"marks", relay.ProgressMarks}, {"cursor", relay.ProgressCursor}},
	reflect.TypeFor[relay.Partitioner]():      {{"murmur2", relay.Murmur2}, {"fnv1a", relay.FNV1a}, {"crc32", relay.CRC32}},
	reflect.TypeFor[outbox.PoisonPolicy]():    {{"park", outbox.Park}, {"hold", outbox.Hold}},
	reflect.TypeFor[outbox.CloudEventsMode](): {{"off", outbox.CloudEventsOff}, {"binary", outbox.CloudEventsBinary}},
	reflect.TypeFor[inbox.IdentityFunc]():     {{"event-id", inbox.IdentityFunc(inbox.EventID)}, {"event-id-or-position", inbox.IdentityFunc(inbox.EventIDOrPosition)}},
}

// choiceNames lists the spellings of t's values: "poll" or "stream".
func choiceNames(t reflect.Type) string {
	var names []string
	for _, c := range choices[t] {
		names = append(names, strconv.Quote(c.name))
	}
	if len(names) < 2 {
		return strings.Join(names, "")
	}
	return strings.Join(names[:len(names)-1], ", ") + " or " + names[len(names)-1]
}

var (
	tableType      = reflect.TypeFor[outbox.Table]()
	saramaType     = reflect.TypeFor[*sarama.Config]()
	durationType   = reflect.TypeFor[time.Duration]()
	eventTypesType = reflect.TypeFor[[]EventType]()
)

// settingsOf walks the fields of t that have an env tag: a struct field's
// tag is the prefix of its fields' variables (outbox.Table's are SCHEMA and
// TABLE, *sarama.Config's CLIENT_ID and VERSION); any other field's is its
// variable, with options after a comma.
func settingsOf(t reflect.Type) []setting {
	var out []setting
	var walk func(t reflect.Type, prefix, path string, index []int)
	walk = func(t reflect.Type, prefix, path string, index []int) {
		for _, f := range reflect.VisibleFields(t) {
			tag, ok := f.Tag.Lookup("env")
			if !ok || len(f.Index) != 1 {
				continue
			}
			name, rest, _ := strings.Cut(tag, ",")
			var opts []string
			if rest != "" {
				opts = strings.Split(rest, ",")
			}
			idx := append(slices.Clone(index), f.Index...)
			p := path + f.Name
			part := func(sub, suffix, values string) {
				out = append(out, setting{Variable: Variable{Name: prefix + name + suffix, Config: "", Field: p + "." + sub, Values: values},
					index: idx, typ: f.Type, opts: opts, sub: sub})
			}
			switch {
			case f.Type == tableType:
				part("Schema", "SCHEMA", "a plain identifier (letters, digits, _)")
				part("Name", "TABLE", "a plain identifier (letters, digits, _)")
			case f.Type == saramaType:
				part("ClientID", "CLIENT_ID", "text")
				part("Version", "VERSION", "a Kafka version such as 3.7.0")
			case f.Type.Kind() == reflect.Struct:
				walk(f.Type, prefix+name, p+".", idx)
			default:
				s := setting{Variable: Variable{Name: prefix + name, Field: p}, index: idx, typ: f.Type, opts: opts}
				s.Values = s.values()
				out = append(out, s)
			}
		}
	}
	walk(t, "", "", nil)
	for i := range out {
		out[i].Config = t.Name()
	}
	return out
}

// values says what the variable of s takes.
func (s setting) values() string {
	switch {
	case choices[s.typ] != nil:
		return choiceNames(s.typ)
	case s.typ == durationType && s.has("forever"):
		return `a positive duration such as 72h, or "forever"`
	case s.typ == durationType:
		return "a positive duration such as 500ms"
	case s.typ == eventTypesType:
		return "<aggregate-type>:<event-type>[=<topic>] or =<topic>, comma-separated"
	case s.has("brokers"):
		return "host:port addresses, comma-separated"
	case s.has("invert"):
		return "on or off (off sets the field to true)"
	case s.has("orbroker"):
		return "a positive number, or -1 (the broker's default)"
	case s.has("topic"):
		return "a topic name"
	case s.has("raw"):
		return "text, taken as is"
	}
	switch s.typ.Kind() {
	case reflect.Bool:
		return "on or off"
	case reflect.Int, reflect.Int16, reflect.Int32, reflect.Int64:
		return "a positive number"
	}
	return "text"
}

// variablesOf returns the variables of the Config field at path and of
// the fields under it.
func variablesOf(t reflect.Type, path string) []string {
	var out []string
	for _, s := range settingsOf(t) {
		if s.Field == path || strings.HasPrefix(s.Field, path+".") {
			out = append(out, s.Name)
		}
	}
	return out
}

// reader reads variables through lookup, naming them as env says, and
// remembers which it read (for typo detection).
type reader struct {
	env    envconfig.Names
	lookup func(string) (string, bool)
	known  map[string]bool
}

// get returns the trimmed value of the setting's variable; raw keeps white
// space. An empty variable counts as unset.
func (r *reader) get(name string, raw bool) (string, bool) {
	n := r.env.Name(name)
	r.known[n] = true
	v, ok := r.lookup(n)
	if !raw {
		v = strings.TrimSpace(v)
	}
	return v, ok && v != ""
}

// read sets the fields of *dst (a Config or InboxConfig) from their
// variables.
func (r *reader) read(dst reflect.Value, settings []setting) error {
	for _, s := range settings {
		v, ok := r.get(s.Name, s.has("raw"))
		if !ok {
			continue
		}
		if err := s.set(dst.FieldByIndex(s.index), v); err != nil {
			return err
		}
	}
	return nil
}

// set parses v into the field f.
func (s setting) set(f reflect.Value, v string) error {
	bad := func() error { return envconfig.Bad(s.Name, v, s.Values) }
	switch {
	case s.sub == "Schema" || s.sub == "Name":
		f.FieldByName(s.sub).SetString(v)
	case s.sub == "ClientID" || s.sub == "Version":
		if f.IsNil() {
			f.Set(reflect.ValueOf(relay.DefaultSaramaConfig()))
		}
		sc := f.Interface().(*sarama.Config)
		if s.sub == "ClientID" {
			sc.ClientID = v
			return nil
		}
		ver, err := sarama.ParseKafkaVersion(v)
		if err != nil {
			return bad()
		}
		sc.Version = ver
	case choices[s.typ] != nil:
		i := slices.IndexFunc(choices[s.typ], func(c choice) bool { return c.name == strings.ToLower(v) })
		if i < 0 {
			return bad()
		}
		f.Set(reflect.ValueOf(choices[s.typ][i].value))
	case s.typ == durationType:
		if v == "forever" && s.has("forever") {
			f.SetInt(-1)
			return nil
		}
		d, err := time.ParseDuration(v)
		if err != nil || d <= 0 {
			return bad()
		}
		f.SetInt(int64(d))
	case s.typ == eventTypesType:
		ets, err := eventTypes(v)
		if err != nil {
			return err
		}
		f.Set(reflect.ValueOf(ets))
	case s.typ.Kind() == reflect.Bool:
		on, ok := map[string]bool{"on": true, "true": true, "1": true, "off": false, "false": false, "0": false}[strings.ToLower(v)]
		if !ok {
			return bad()
		}
		f.SetBool(on != s.has("invert"))
	case s.typ.Kind() == reflect.String:
		if s.has("topic") {
			if err := outbox.ValidateTopic(v); err != nil {
				return &outbox.ConfigError{Field: s.Name, Reason: err.Error()}
			}
		}
		f.SetString(v)
	case s.typ.Kind() == reflect.Slice && s.typ.Elem().Kind() == reflect.String:
		var list []string
		for _, b := range strings.Split(v, ",") {
			if b = strings.TrimSpace(b); b != "" {
				list = append(list, b)
			}
		}
		if s.has("brokers") {
			if err := envconfig.ValidateBrokers(list, s.Name); err != nil {
				return err
			}
		}
		f.Set(reflect.ValueOf(list))
	case f.CanInt():
		x, err := strconv.ParseInt(v, 10, s.typ.Bits())
		if err != nil || (x < 1 && !(x == -1 && s.has("orbroker"))) {
			return bad()
		}
		f.SetInt(x)
	default:
		panic(fmt.Sprintf("outboxconfig: %s (%s) has an env tag but no reader for %v", s.Field, s.Name, s.typ))
	}
	return nil
}

// tableError names the variable of a table that is not valid.
func tableError(err error, prefix string) error {
	if ce, ok := err.(*outbox.ConfigError); ok {
		if v, ok := map[string]string{"Table.Schema": prefix + "SCHEMA", "Table.Name": prefix + "TABLE"}[ce.Field]; ok {
			return &outbox.ConfigError{Field: v, Reason: ce.Reason, Err: ce.Err}
		}
	}
	return err
}

// fromEnv reads a Config through lookupEnv, with the variables named
// under prefix; environ, when given, is scanned for unknown variables.
func fromEnv(prefix string, lookupEnv func(string) (string, bool), environ ...string) (c Config, err error) {
	env, err := envconfig.NewNames(prefix, environ)
	if err != nil {
		return c, err
	}
	defer func() { err = env.Rename(err) }()
	c.env = env
	r := &reader{env: env, lookup: lookupEnv, known: map[string]bool{}}
	if err := r.read(reflect.ValueOf(&c).Elem(), settingsOf(reflect.TypeFor[Config]())); err != nil {
		return c, err
	}
	if err := c.Table.Validate(); err != nil {
		return c, tableError(err, "OUTBOX_")
	}
	c.KafkaSASL.Mechanism = strings.ToUpper(c.KafkaSASL.Mechanism)
	if err := validateKafkaSecurity(c.KafkaTLS, c.KafkaSASL); err != nil {
		return c, err
	}
	if c.KafkaSASL.Mechanism != "" && !c.KafkaTLS.Enable && !c.KafkaSASL.AllowPlaintext {
		return c, errSASLPlaintext() // also checked when applied; here FromEnv fails already
	}
	if prefix == "" {
		for _, s := range settingsOf(reflect.TypeFor[InboxConfig]()) {
			r.known[s.Name] = true // read by InboxFromEnv
		}
		// The project's scripts' variables are no typos, nor a setting
		// another one could be a typo of.
		environ = slices.DeleteFunc(slices.Clone(environ), func(kv string) bool {
			name, _, _ := strings.Cut(kv, "=")
			return slices.Contains(envconfig.ScriptVariables, name)
		})
	}
	c.warnings, err = envconfig.UnknownVariables(environ, r.known, prefix+"OUTBOX_", prefix+"KAFKA_")
	return c, err
}

// inboxFromEnv reads an InboxConfig through lookupEnv; environ, when
// given, is scanned for OUTBOX_INBOX_ variables one typo away from a
// setting.
func inboxFromEnv(lookupEnv func(string) (string, bool), environ ...string) (ic InboxConfig, err error) {
	r := &reader{lookup: lookupEnv, known: map[string]bool{}}
	if err := r.read(reflect.ValueOf(&ic).Elem(), settingsOf(reflect.TypeFor[InboxConfig]())); err != nil {
		return ic, err
	}
	if err := ic.Consumer.Table.Validate(); err != nil {
		return ic, tableError(err, "OUTBOX_INBOX_")
	}
	_, err = envconfig.UnknownVariables(environ, r.known, "OUTBOX_INBOX_")
	return ic, err
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
				return nil, envconfig.Bad("OUTBOX_EVENT_TYPES", e, want)
			}
			et.AggregateType, et.Type = agg, typ
		}
		out = append(out, et)
	}
	if len(out) == 0 {
		return nil, envconfig.Bad("OUTBOX_EVENT_TYPES", v, want)
	}
	return out, nil
}
