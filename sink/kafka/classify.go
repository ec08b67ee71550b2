package kafka

import (
	"crypto/tls"
	"crypto/x509"
	"errors"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/pgevents/pgevents"
)

// Kafka errors by class, beyond kerr's own retriable flag.
var (
	// permanentCodes refuse the record itself: retrying it cannot succeed.
	permanentCodes = []*kerr.Error{kerr.MessageTooLarge, kerr.RecordListTooLarge, kerr.InvalidRecord, kerr.InvalidTimestamp}
	// deploymentCodes say that the deployment is wrong: a topic that does
	// not exist (yet), credentials or ACLs, a broker too old.
	deploymentCodes = []*kerr.Error{kerr.UnknownTopicOrPartition, kerr.UnknownTopicID, kerr.InvalidTopicException,
		kerr.TopicAuthorizationFailed, kerr.ClusterAuthorizationFailed, kerr.TransactionalIDAuthorizationFailed,
		kerr.SaslAuthenticationFailed, kerr.UnsupportedSaslMechanism, kerr.IllegalSaslState,
		kerr.UnsupportedVersion, kerr.InvalidRequiredAcks, kerr.UnsupportedForMessageFormat, kerr.PolicyViolation}
)

// Classify returns the class of an error of a franz-go producer, as the
// consumer treats it (see pgevents.Classify):
//
//   - a record too large (MESSAGE_TOO_LARGE, RECORD_LIST_TOO_LARGE) or
//     refused as invalid (INVALID_RECORD, INVALID_TIMESTAMP): permanent,
//     the event's unit is dead-lettered;
//   - an unknown topic (UNKNOWN_TOPIC_OR_PARTITION, UNKNOWN_TOPIC_ID,
//     INVALID_TOPIC_EXCEPTION), authorization or SASL failures, TLS
//     certificates refused, an unsupported broker version: deployment;
//   - errors Kafka calls retriable (NOT_ENOUGH_REPLICAS, leader changes,
//     REQUEST_TIMED_OUT, NETWORK_EXCEPTION, ...), records that timed out or
//     ran out of retries, connection errors, a closed client, a context
//     that ended: transient;
//   - another Kafka error code: unknown (retried maxAttempts times, then
//     permanent);
//   - anything else: transient: the relay's own failures are outages, not
//     the event's fault.
//
// A record that timed out carries the last error it met: a timeout after
// UNKNOWN_TOPIC_OR_PARTITION is a deployment failure.
func Classify(err error) pgevents.Class {
	var ce *pgevents.ClassifiedError
	if errors.As(err, &ce) {
		return ce.Class
	}
	for _, e := range deploymentCodes {
		if errors.Is(err, e) {
			return pgevents.ClassDeployment
		}
	}
	for _, e := range permanentCodes {
		if errors.Is(err, e) {
			return pgevents.ClassPermanent
		}
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
		return pgevents.ClassDeployment // TLS or SASL misconfigured
	}
	var ke *kerr.Error
	if errors.As(err, &ke) {
		if ke.Retriable || ke == kerr.CorruptMessage {
			return pgevents.ClassTransient
		}
		return pgevents.ClassUnknown
	}
	// Timeouts (kgo.ErrRecordTimeout), retries run out, a closed or
	// aborting client, a context that ended, network errors: an outage.
	return pgevents.ClassTransient
}
