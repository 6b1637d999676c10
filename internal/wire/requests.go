package wire

import (
	"iter"

	"github.com/twmb/franz-go/pkg/kmsg"
)

// NewListOffsets is a ListOffsets request for the offset at ts (-2 the
// first, -1 the log end, else a time in milliseconds) of each partition
// parts yields, grouped by topic in the order they first come; committed
// asks at read_committed, where the log end is the last stable offset.
func NewListOffsets(ts int64, committed bool, parts iter.Seq2[string, int32]) *kmsg.ListOffsetsRequest {
	req := kmsg.NewPtrListOffsetsRequest()
	req.ReplicaID = -1
	if committed {
		req.IsolationLevel = 1
	}
	byTopic := map[string]int{}
	for topic, partition := range parts {
		ti, ok := byTopic[topic]
		if !ok {
			ti = len(req.Topics)
			byTopic[topic] = ti
			t := kmsg.NewListOffsetsRequestTopic()
			t.Topic = topic
			req.Topics = append(req.Topics, t)
		}
		p := kmsg.NewListOffsetsRequestTopicPartition()
		p.Partition, p.CurrentLeaderEpoch, p.Timestamp = partition, -1, ts
		req.Topics[ti].Partitions = append(req.Topics[ti].Partitions, p)
	}
	return req
}
