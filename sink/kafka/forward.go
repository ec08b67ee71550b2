package kafka

import (
	"github.com/pgevents/pgevents"
	"github.com/pgevents/pgevents/sink/kafkasink"
)

// Format is the shape of the records produced.
//
// Deprecated: use kafkasink.Format. Kept for one release; see CHANGELOG.md.
type Format = kafkasink.Format

// Formats.
//
// Deprecated: use kafkasink.FormatRaw and kafkasink.FormatCloudEvents. Kept
// for one release; see CHANGELOG.md.
const (
	// FormatRaw is kafkasink.FormatRaw.
	FormatRaw = kafkasink.FormatRaw
	// FormatCloudEvents is kafkasink.FormatCloudEvents.
	FormatCloudEvents = kafkasink.FormatCloudEvents
)

// Defaults of Options.
//
// Deprecated: use the same names in kafkasink. Kept for one release; see
// CHANGELOG.md.
const (
	// DefaultKey is kafkasink.DefaultKey.
	DefaultKey = kafkasink.DefaultKey
	// DefaultSource is kafkasink.DefaultSource.
	DefaultSource = kafkasink.DefaultSource
	// DefaultDeliveryTimeout is kafkasink.DefaultDeliveryTimeout.
	DefaultDeliveryTimeout = kafkasink.DefaultDeliveryTimeout
	// DefaultMaxRecordBytes is kafkasink.DefaultMaxRecordBytes.
	DefaultMaxRecordBytes = kafkasink.DefaultMaxRecordBytes
)

// Options configures a Sink.
//
// Deprecated: use kafkasink.Options. Kept for one release; see CHANGELOG.md.
type Options = kafkasink.Options

// SASL configures SASL authentication.
//
// Deprecated: use kafkasink.SASL. Kept for one release; see CHANGELOG.md.
type SASL = kafkasink.SASL

// OptionError is an invalid option, named by its YAML key.
//
// Deprecated: use kafkasink.OptionError. Kept for one release; see
// CHANGELOG.md.
type OptionError = kafkasink.OptionError

// Sink is the relay.
//
// Deprecated: use kafkasink.Sink. Kept for one release; see CHANGELOG.md.
type Sink = kafkasink.Sink

// ErrInvalidOptions is wrapped by New's errors about its options.
//
// Deprecated: use kafkasink.ErrInvalidOptions. Kept for one release; see
// CHANGELOG.md.
var ErrInvalidOptions = kafkasink.ErrInvalidOptions

// New returns kafkasink.New(opts).
//
// Deprecated: use kafkasink.New. Kept for one release; see CHANGELOG.md.
func New(opts Options) (*Sink, error) { return kafkasink.New(opts) }

// Classify returns kafkasink.Classify(err).
//
// Deprecated: use kafkasink.Classify. Kept for one release; see
// CHANGELOG.md.
func Classify(err error) pgevents.Class { return kafkasink.Classify(err) }
