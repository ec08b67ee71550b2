package kafkasink

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"slices"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/pgevents/pgevents"
)

// Classify returns the class of an error of a franz-go producer, as the
// consumer treats it. The relay wraps every error it returns with its
// class (pgevents.Permanent, Retryable, Deployment), so that package
// pgevents, which decides what a class does, needs no Kafka client:
//
//   - an error already classified (a pgevents.ClassifiedError): its class;
//   - an error that carries a Kafka error code (franz-go's kerr.Error,
//     also when wrapped, as in a record that timed out after it): a record
//     too large (MESSAGE_TOO_LARGE, RECORD_LIST_TOO_LARGE) or refused as
//     invalid (INVALID_RECORD, INVALID_TIMESTAMP) is permanent, the event's
//     unit is dead-lettered; an unknown or invalid topic, authorization
//     and SASL failures, an unsupported broker version are deployment; the
//     codes Kafka calls retriable (NOT_ENOUGH_REPLICAS, leader changes,
//     REQUEST_TIMED_OUT, ...) are transient; another code is unknown
//     (retried maxAttempts times, then permanent). A record that timed out
//     carries the last error it met: a timeout after
//     UNKNOWN_TOPIC_OR_PARTITION is a deployment failure;
//   - TLS certificates refused, or a broker that closes the connection at
//     once (TLS or SASL expected): deployment;
//   - anything else — records that timed out or ran out of retries,
//     connection errors, a closed client, a context that ended: transient.
//     The relay's own failures are outages, not the event's fault.
func Classify(err error) pgevents.Class {
	var ce *pgevents.ClassifiedError
	if errors.As(err, &ce) {
		return ce.Class
	}
	var ke *kerr.Error
	if errors.As(err, &ke) {
		return codeClass(ke)
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

// Kafka error codes by class, beyond their retriable flag.
var (
	// permanentCodes refuse the record itself: retrying cannot succeed.
	permanentCodes = []*kerr.Error{kerr.MessageTooLarge, kerr.RecordListTooLarge, kerr.InvalidRecord, kerr.InvalidTimestamp}
	// deploymentCodes say that the deployment is wrong: a topic that does
	// not exist (yet), credentials or ACLs, a broker too old.
	deploymentCodes = []*kerr.Error{kerr.UnknownTopicOrPartition, kerr.UnknownTopicID, kerr.InvalidTopicException,
		kerr.TopicAuthorizationFailed, kerr.ClusterAuthorizationFailed, kerr.TransactionalIDAuthorizationFailed,
		kerr.SaslAuthenticationFailed, kerr.UnsupportedSaslMechanism, kerr.IllegalSaslState,
		kerr.UnsupportedVersion, kerr.InvalidRequiredAcks, kerr.UnsupportedForMessageFormat, kerr.PolicyViolation}
)

// codeClass is the class of a Kafka error code.
func codeClass(ke *kerr.Error) pgevents.Class {
	switch {
	case slices.Contains(deploymentCodes, ke):
		return pgevents.ClassDeployment
	case slices.Contains(permanentCodes, ke):
		return pgevents.ClassPermanent
	case ke.Retriable || ke == kerr.CorruptMessage:
		return pgevents.ClassTransient
	}
	return pgevents.ClassUnknown
}
