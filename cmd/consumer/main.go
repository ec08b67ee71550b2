// Command consumer runs pgevents consumer groups and administers the log:
// see package consumercli for its commands, or run `consumer -h`. A
// service with Go handlers builds the same binary around them with
// consumercli.CLI.
package main

import "github.com/pgevents/pgevents/cmd/consumer/consumercli"

func main() {
	(&consumercli.CLI{Commands: []consumercli.Command{consumercli.Delegate("demo"), consumercli.Delegate("bench")}}).Execute()
}
