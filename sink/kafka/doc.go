// Package kafka is the former name of package kafkasink, the relay that
// produces events to a Kafka cluster. It was renamed so that one package
// name means one thing: package kafka at the top of the module is the
// Kafka-protocol endpoint (github.com/pgevents/pgevents/kafka), and the
// relay is github.com/pgevents/pgevents/sink/kafkasink.
//
// Every exported name here is an alias of, or forwards to, the same name
// in kafkasink; there is no logic of its own.
//
// Deprecated: use github.com/pgevents/pgevents/sink/kafkasink. Kept for one
// release; see CHANGELOG.md.
package kafka
