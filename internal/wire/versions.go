package wire

import "github.com/twmb/franz-go/pkg/kmsg"

// Versions pins the version of each API the engine speaks: the versions it
// was written and tested for, which every broker from Kafka 2.3 through 4.x
// accepts (Kafka 4.0 removed only older ones, KIP-896). A newer version is a
// change of the code that reads it, made here and where its fields are
// used.
var Versions = map[kmsg.Key]int16{
	kmsg.ApiVersions:      0, // every broker answers v0, whatever else it speaks
	kmsg.SASLHandshake:    1,
	kmsg.SASLAuthenticate: 1,
	kmsg.Metadata:         7, // leaders and their epochs; names, not topic ids
	// Fetch v11: the log start offset, the last stable offset, aborted
	// transactions and per-partition errors, with topic names (v13 and later
	// address topics by id).
	kmsg.Fetch:       11,
	kmsg.ListOffsets: 4, // an isolation level (v2) and the leader epoch (v4)
	// The classic group protocol at the versions that carry the group
	// instance id of static membership (KIP-345).
	kmsg.FindCoordinator: 2,
	kmsg.JoinGroup:       5,
	kmsg.SyncGroup:       3,
	kmsg.Heartbeat:       3,
	kmsg.LeaveGroup:      3,
	kmsg.OffsetCommit:    7,
	kmsg.OffsetFetch:     5,
	kmsg.Produce:         7, // the dead letters: acks=all, one record
}

// ConsumerProtocolVersions pins the versions the consumer group protocol's
// membership (KIP-848, framework/consumerproto.go) sends through DoVersion
// and AtVersion instead of Versions': its heartbeat; Metadata with topic
// ids (its assignments name topics by id); the commits and offset reads
// that carry the member epoch, as its coordinator refuses older ones; the
// group's session timeout. The
// fuzz test decodes each of their responses at these versions too.
var ConsumerProtocolVersions = map[kmsg.Key]int16{
	kmsg.ConsumerGroupHeartbeat: 0, // topic names, no regex
	kmsg.Metadata:               12,
	kmsg.OffsetCommit:           9,
	kmsg.OffsetFetch:            9,
	// The group's session timeout, which no heartbeat answer carries:
	// v4, the first flexible one (Kafka 4 refuses v0).
	kmsg.DescribeConfigs: 4,
}
