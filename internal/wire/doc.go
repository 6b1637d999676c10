// Package wire speaks the Kafka protocol for tidemark's engine: one
// connection type (Conn: dial, TLS, SASL, deadlines, one request at a time)
// and one codec for every request and response, franz-go's kmsg.
//
// Why kmsg: it is generated from Kafka's own message definitions, so every
// API and every version is there and right, flexible (tagged) encoding
// included: Fetch with the last stable offset and aborted transactions,
// ListOffsets at an isolation level, the classic group protocol and
// ConsumerGroupHeartbeat (KIP-848). kafka-go's protocol package covers
// fewer APIs and versions, and v0.4.51 decodes the Heartbeat and LeaveGroup
// responses' fields in the wrong order (error code before throttle time).
// kmsg reads byte fields without copying, into the one buffer a response
// was read into; a Fetch response is read as it arrives instead, its
// partitions' record batches into slabs of at most 1 MiB (fetchstream.go),
// so that they leave memory about as their partitions handle them.
//
// The versions spoken are pinned, one per API (Versions), and a Conn checks
// at dial time that its broker accepts each one it will use, so that a
// request never goes out in a version the engine was not written for.
//
// kafka-go stays the user's face: its sasl.Mechanism runs the SASL
// exchange, and error codes are returned as kafka.Error values.
package wire
