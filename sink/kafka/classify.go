package kafka

import (
	"crypto/tls"
	"crypto/x509"
	"errors"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/pgevents/pgevents"
)

// Classify returns the class of an error of a franz-go producer, as the
// consumer treats it:
//
//   - an error that carries a Kafka error code is classified by
//     pgevents.Classify: a record too large (MESSAGE_TOO_LARGE,
//     RECORD_LIST_TOO_LARGE) or refused as invalid (INVALID_RECORD,
//     INVALID_TIMESTAMP) is permanent, the event's unit is dead-lettered;
//     an unknown topic, authorization or SASL failures, an unsupported
//     broker version are deployment; the codes Kafka calls retriable
//     (NOT_ENOUGH_REPLICAS, leader changes, REQUEST_TIMED_OUT, ...) are
//     transient; another code is unknown (retried maxAttempts times, then
//     permanent). A record that timed out carries the last error it met:
//     a timeout after UNKNOWN_TOPIC_OR_PARTITION is a deployment failure;
//   - TLS certificates refused, or a broker that closes the connection at
//     once (TLS or SASL expected): deployment;
//   - anything else — records that timed out or ran out of retries,
//     connection errors, a closed client, a context that ended: transient.
//     The relay's own failures are outages, not the event's fault.
func Classify(err error) pgevents.Class {
	var ce *pgevents.ClassifiedError
	var ke *kerr.Error
	if errors.As(err, &ce) || errors.As(err, &ke) {
		return pgevents.Classify(err)
	}
	var (
		unknownAuthority x509.UnknownAuthorityError
		hostname         x509.HostnameError
		invalidCert      x509.CertificateInvalidError
		recordHeader     tls.RecordHeaderError
		firstRead        *kgo.ErrFirstReadEOF
	)
	if errors.As(err, &unknownAuthority) || errors.As(err, &hostname) || errors.As(err, &invalidCert) ||
		errors.As(err, &recordHeader) || errors.As(err, &firstRead) {
		return pgevents.ClassDeployment
	}
	return pgevents.ClassTransient
}
