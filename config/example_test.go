package config_test

import (
	"errors"
	"fmt"

	"github.com/pgevents/pgevents/config"
)

func ExampleParse() {
	cfg, err := config.Parse([]byte(`
databaseUrl: postgres://localhost:5432/app
groupId: billing
totalPartitions: 4
handlers:
  - eventType: "*"
    type: log
`))
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("group:", cfg.GroupID)
	fmt.Println("partitions:", cfg.TotalPartitions)
	fmt.Println("batch size:", cfg.BatchSize) // default
	fmt.Println("wait period:", cfg.WaitPeriod())
	fmt.Println("handler output:", cfg.Handlers[0].Output)
	// Output:
	// group: billing
	// partitions: 4
	// batch size: 100
	// wait period: 10s
	// handler output: stdout
}

func ExampleError() {
	_, err := config.Parse([]byte(`
databaseUrl: postgres://localhost:5432/app
groupId: billing
batchSzie: 10
`))
	var cfgErr *config.Error
	if errors.As(err, &cfgErr) {
		fmt.Printf("key %q on line %d: %s\n", cfgErr.Key, cfgErr.Line, cfgErr.Msg)
	}
	fmt.Println(err)
	// Output:
	// key "batchSzie" on line 4: unknown key
	// config: batchSzie: unknown key (line 4)
}
