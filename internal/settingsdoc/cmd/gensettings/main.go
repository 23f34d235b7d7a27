// Command gensettings writes the settings reference of
// docs/configuration.md (between its GENERATED markers) from the settings'
// struct tags and doc comments. Run it through go generate ./... from the
// module's root (outboxconfig/doc.go names it).
package main

import (
	"flag"
	"fmt"
	"os"

	"github.com/fxoutbox/outbox/internal/settingsdoc"
)

func main() {
	root := flag.String("root", ".", "the module's root directory")
	flag.Parse()
	if err := settingsdoc.Update(*root); err != nil {
		fmt.Fprintln(os.Stderr, "gensettings:", err)
		os.Exit(1)
	}
}
