package tidemarkotel

import (
	"context"
	"errors"
	"os"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kerr"
	"go.opentelemetry.io/otel/attribute"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
)

// EnvStabilityOptIn is the variable the messaging conventions' migration
// plan names: "messaging/dup" in its comma-separated list adds the names
// of semantic conventions v1.24.0 to the current ones.
const EnvStabilityOptIn = "OTEL_SEMCONV_STABILITY_OPT_IN"

// The attributes and metrics of semantic conventions v1.24.0 that were
// renamed since, emitted beside the current ones with messaging/dup.
const (
	oldConsumerGroup     = attribute.Key("messaging.kafka.consumer.group")
	oldPartition         = attribute.Key("messaging.kafka.destination.partition")
	oldOffset            = attribute.Key("messaging.kafka.message.offset")
	oldOperation         = attribute.Key("messaging.operation")
	oldOperationDeliver  = "deliver" // v1.24.0's value for process
	oldClientID          = attribute.Key("messaging.client_id")
	oldDurationMetric    = "messaging.deliver.duration"
	oldMessagesMetric    = "messaging.deliver.messages"
	processDurationName  = "messaging.process.duration"
	consumedMessagesName = "messaging.client.consumed.messages"
)

// dupNames reports whether OTEL_SEMCONV_STABILITY_OPT_IN asks for the old
// names beside the current ones. "messaging" alone, or nothing, means the
// current names only: tidemarkotel has no earlier release whose names it
// would owe its users by default.
func dupNames() bool {
	for _, v := range strings.Split(os.Getenv(EnvStabilityOptIn), ",") {
		if strings.TrimSpace(v) == "messaging/dup" {
			return true
		}
	}
	return false
}

// names builds the attribute sets of one configuration.
type names struct {
	dup      bool
	group    string
	clientID string
}

// common is what every span and measurement of a partition's operation op
// carries, with the names of the current conventions, and those of v1.24.0
// too when dup (spans with messaging/dup).
func (n names) common(topic string, partition int, op string, dup bool) []attribute.KeyValue {
	a := make([]attribute.KeyValue, 0, 16)
	a = append(a,
		semconv.MessagingSystemKafka,
		semconv.MessagingOperationName(op),
		semconv.MessagingDestinationName(topic),
		semconv.MessagingDestinationPartitionID(strconv.Itoa(partition)),
	)
	if n.group != "" {
		a = append(a, semconv.MessagingConsumerGroupName(n.group))
	}
	if dup {
		a = append(a, oldOperation.String(oldOperationDeliver), oldPartition.Int(partition))
		if n.group != "" {
			a = append(a, oldConsumerGroup.String(n.group))
		}
	}
	return a
}

// old is common with v1.24.0's names alone, for the metrics of that
// version's names.
func (n names) old(topic string, partition int) []attribute.KeyValue {
	a := []attribute.KeyValue{semconv.MessagingSystemKafka, oldOperation.String(oldOperationDeliver),
		semconv.MessagingDestinationName(topic), oldPartition.Int(partition)}
	if n.group != "" {
		a = append(a, oldConsumerGroup.String(n.group))
	}
	return a
}

// client is messaging.client.id, for spans.
func (n names) client(a []attribute.KeyValue) []attribute.KeyValue {
	if n.clientID == "" {
		return a
	}
	a = append(a, semconv.MessagingClientID(n.clientID))
	if n.dup {
		a = append(a, oldClientID.String(n.clientID))
	}
	return a
}

// offset is messaging.kafka.offset.
func (n names) offset(a []attribute.KeyValue, off int64) []attribute.KeyValue {
	a = append(a, semconv.MessagingKafkaOffset(int(off)))
	if n.dup {
		a = append(a, oldOffset.Int64(off))
	}
	return a
}

// errorType is error.type for err: a Kafka error code in its chain by
// Kafka's name for it (ILLEGAL_GENERATION), the context package's two
// errors by name (they are one type), else the value of an ErrorType()
// string method in its chain, else the Go type of the error (the innermost
// one through fmt.Errorf's %w wrappers), as semconv.ErrorType does.
func errorType(err error) attribute.KeyValue {
	var code kafka.Error
	switch {
	case errors.Is(err, context.Canceled):
		return semconv.ErrorTypeKey.String("context.Canceled")
	case errors.Is(err, context.DeadlineExceeded):
		return semconv.ErrorTypeKey.String("context.DeadlineExceeded")
	case errors.As(err, &code):
		var known *kerr.Error
		if errors.As(kerr.ErrorForCode(int16(code)), &known) {
			return semconv.ErrorTypeKey.String(known.Message)
		}
	}
	return semconv.ErrorType(err)
}

// errorTypePanic is error.type of a call that panicked through the
// middleware: the framework's Recover, outside it, turns the panic into a
// *handler.PanicError.
var errorTypePanic = semconv.ErrorTypeKey.String("*handler.PanicError")

func utf8Key(key []byte) (string, bool) {
	if !utf8.Valid(key) {
		return "", false
	}
	return string(key), true
}
