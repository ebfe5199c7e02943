// promlint: `promtool check metrics` without the rest of promtool. Reads the text exposition
// format on stdin, prints each problem (metric: text) and exits 3 when there is one.
package main

import (
	"fmt"
	"os"

	"github.com/prometheus/client_golang/prometheus/testutil/promlint"
)

func main() {
	problems, err := promlint.New(os.Stdin).Lint()
	if err != nil {
		fmt.Fprintln(os.Stderr, "promlint: error while linting:", err)
		os.Exit(1)
	}
	for _, p := range problems {
		fmt.Printf("%s: %s\n", p.Metric, p.Text)
	}
	if len(problems) > 0 {
		os.Exit(3)
	}
}
