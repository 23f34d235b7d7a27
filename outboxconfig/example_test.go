package outboxconfig_test

import (
	"fmt"

	"github.com/fxoutbox/outbox"
	"github.com/fxoutbox/outbox/outboxconfig"
	"github.com/fxoutbox/outbox/relay"
	"github.com/fxoutbox/outbox/unitofwork"
)

// A Config nests the engines' configurations; the settings both sides
// share are set once and reach both.
func ExampleConfig_RelayConfig() {
	cfg := outboxconfig.Config{
		Table:  outbox.Table{Name: "orders_outbox"},
		Writer: unitofwork.Config{Service: "order-service", Limits: outbox.Limits{MaxRecordBytes: 500_000}},
		Relay:  relay.Config{BatchSize: 100},
	}
	rc, err := cfg.RelayConfig()
	if err != nil {
		fmt.Println(err)
		return
	}
	uc, _ := cfg.UnitOfWork()
	fmt.Println(rc.Table.Name, rc.BatchSize, rc.MaxMessageBytes, rc.Listen)
	fmt.Println(uc.Table.Name, uc.Service, uc.Limits.MaxRecordBytes)

	cfg.Relay.BatchSize = 20_000
	_, err = cfg.RelayConfig()
	fmt.Println(err)
	// Output:
	// orders_outbox 100 500000 true
	// orders_outbox order-service 500000
	// outbox: config Relay.BatchSize [OUTBOX_BATCH_SIZE]: is 20000: use 1 to 10000 (zero means the default, 50)
}

// Variables lists every environment variable with the field it sets.
func ExampleVariables() {
	for _, v := range outboxconfig.Variables() {
		if v.Name == "OUTBOX_BATCH_SIZE" || v.Name == "OUTBOX_INBOX_GROUP" {
			fmt.Printf("%s: %s.%s, %s\n", v.Name, v.Config, v.Field, v.Values)
		}
	}
	// Output:
	// OUTBOX_BATCH_SIZE: Config.Relay.BatchSize, a positive number
	// OUTBOX_INBOX_GROUP: InboxConfig.Consumer.Group, text
}
