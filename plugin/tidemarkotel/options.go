package tidemarkotel

import (
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
)

// An Option configures Middleware, BatchMiddleware, TxMiddleware and
// CommitHook.
type Option func(*config)

type config struct {
	tp       trace.TracerProvider
	mp       metric.MeterProvider
	prop     propagation.TextMapPropagator
	group    string
	clientID string
	asParent bool
	key      func(key []byte) (string, bool)
}

func newConfig(opts []Option) config {
	c := config{prop: propagation.TraceContext{}, key: utf8Key}
	for _, o := range opts {
		if o != nil {
			o(&c)
		}
	}
	if c.tp == nil {
		c.tp = otel.GetTracerProvider()
	}
	return c
}

// WithTracerProvider sets where the spans go. Default (or nil): the global
// provider, otel.GetTracerProvider(), as it is when Middleware is called.
func WithTracerProvider(tp trace.TracerProvider) Option {
	return func(c *config) { c.tp = tp }
}

// WithMeterProvider turns the metrics on: the messaging.process.duration
// histogram and the messaging.client.consumed.messages counter, from a
// meter of mp. Default: no metrics (not the global provider: a consumer's
// metrics usually go to Prometheus through package metrics already).
func WithMeterProvider(mp metric.MeterProvider) Option {
	return func(c *config) { c.mp = mp }
}

// WithPropagator sets how the producer's context is read from a message's
// headers. Default: W3C Trace Context alone (propagation.TraceContext:
// the traceparent and tracestate headers), whatever the global propagator
// is. Pass otel.GetTextMapPropagator(), or a composite with
// propagation.Baggage, to read more.
func WithPropagator(p propagation.TextMapPropagator) Option {
	return func(c *config) {
		if p != nil {
			c.prop = p
		}
	}
}

// WithConsumerGroup sets messaging.consumer.group.name on the Handler's
// spans and metrics: a middleware does not know the Consumer's group, so
// pass the Config.GroupID here. CommitHook takes the group from each
// commit and needs no option.
func WithConsumerGroup(group string) Option {
	return func(c *config) { c.group = group }
}

// WithClientID sets messaging.client.id: pass the Config.ClientID.
func WithClientID(id string) Option {
	return func(c *config) { c.clientID = id }
}

// WithProducerAsParent makes the producer's context, read from the
// message's headers, the parent of the process span, which then joins the
// producer's trace. By default the process span links to it instead, as
// the current messaging conventions say ("For each message it accounts
// for, the Process span SHOULD link to the message's creation context"),
// and stays in the trace of the ctx the Handler was called with (a new
// one: tidemark's ctx carries no span). With this option the span links
// to it as well. A batch or run span always links: it has many producers.
func WithProducerAsParent() Option {
	return func(c *config) { c.asParent = true }
}

// WithKeyFormatter sets how a message's key becomes the attribute
// messaging.kafka.message.key: fn returns the key's string form, or false
// to leave the attribute out. Default: the key as it is when it is valid
// UTF-8, else left out (the conventions: a key with no canonical string
// form is not included). A nil key (Kafka's null) is never included.
func WithKeyFormatter(fn func(key []byte) (string, bool)) Option {
	return func(c *config) {
		if fn != nil {
			c.key = fn
		}
	}
}
