// Package kafkaproxy is a Kafka-protocol-aware TCP proxy for fault injection
// in tests. The same mechanism works against the in-process kfake broker and
// against a real Apache Kafka broker.
//
// # What it does
//
// A Proxy listens on a local address and fronts one upstream broker. For each
// client connection it dials the broker and relays Kafka frames in both
// directions. It reads each request's header (api key, version, correlation
// id), so it can pair every response with its request:
//
//   - Responses to Metadata, FindCoordinator (v0-v3 single coordinator and
//     v4+ batched) and DescribeCluster are decoded with kmsg. Every entry for
//     the upstream broker is rewritten to the proxy's own host:port, so a
//     client bootstrapped through the proxy stays on it. Everything else is
//     forwarded byte for byte.
//   - Fault rules act on requests by api key (kmsg.OffsetCommit, ...) or on
//     all requests (AnyKey). They can be added and removed while traffic
//     flows:
//     Delay holds requests, DelayResponse forwards them at once and holds
//     their responses (the broker acts, the client sees no answer), Fail
//     answers them with a synthesized error
//     response instead of forwarding them, and ResetOn resets the client
//     connection. Every, Probability and Times narrow when a rule acts.
//     Blackhole stalls all traffic, Latency slows all requests, and ResetAll
//     drops every connection.
//   - Responses on a connection are returned in request order, synthesized
//     ones included, as Kafka clients expect.
//   - Stats and Counts report what happened per api key: seen, forwarded,
//     delayed, failed, reset.
//
// A typical test:
//
//	px, err := kafkaproxy.New(cluster.ListenAddrs()[0])
//	...
//	defer px.Close()
//	client := &kafka.Client{Addr: kafka.TCP(px.Addr()), Transport: tr}
//	rule, err := px.Fail(kmsg.OffsetCommit, kerr.NotCoordinator.Code)
//	...                       // commits now fail with NotCoordinator
//	rule.Remove()
//
// # Which broker entries are rewritten
//
// A broker entry in a response denotes the upstream broker, and is rewritten,
// if its host and port match the address given to New (all loopback names
// and addresses count as one host), or if a Metadata or DescribeCluster
// response lists it as the cluster's only broker, or if it carries the node
// id of an entry matched in one of these ways earlier. Other entries are left
// alone and counted in Stats.Unmatched; a client following them leaves the
// proxy.
//
// # Caveats
//
//   - One upstream broker per Proxy. Use it with single-broker clusters
//     (kfake.NumBrokers(1), a single-node Kafka). With several brokers, only
//     traffic to the fronted one passes through the proxy.
//   - Plaintext only. TLS cannot be inspected. SASL works when it uses
//     SaslAuthenticate requests (SaslHandshake v1+); the unframed tokens of
//     SaslHandshake v0 cannot be proxied.
//   - Leader endpoints that Produce and Fetch responses can carry for
//     KIP-951 are not rewritten. In a single-broker cluster leadership does
//     not move, so clients do not act on them.
//   - Fail supports the keys FailableKeys lists, at the versions kmsg knows
//     (the consumer group protocol's ConsumerGroupHeartbeat among them).
//     A response is built by echoing the request's topics, partitions,
//     groups, members or coordinator keys, and setting every ErrorCode field
//     in it, top-level ones included, to the given code. A Produce request
//     with acks=0 gets no response, so failing it just drops it.
//   - Rules are judged when the request's turn comes to be forwarded. A
//     reset wins over the other rules, delays add up, and the first Fail rule
//     to act supplies the code. Every and Times count over all connections.
//   - Delays, Latency and Blackhole hold the request in the proxy, so the
//     requests behind it on the same connection wait too. Latency is added
//     once per request, not per direction.
//   - Frames are buffered whole in memory; one larger than 256 MiB ends its
//     connection.
//
// # Goroutines
//
// New starts an accept loop, and each connection runs four goroutines.
// Close closes the listener and every connection and returns only after all
// of them have exited.
package kafkaproxy
