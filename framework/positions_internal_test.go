package framework

import (
	"math/rand/v2"
	"testing"

	"github.com/twmb/franz-go/pkg/kmsg"
)

// answersInOrder finds what a map of the answers finds (the last answer of
// a partition answered twice), whatever the answer's order, gaps, strangers
// and repeats.
func TestAnswersInOrder(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 28))
	for round := range 2000 {
		var tps []topicPartition
		for _, topic := range []string{"a", "b", "c"}[:1+rng.IntN(3)] {
			for p := range rng.IntN(6) {
				tps = append(tps, topicPartition{topic, int32(p)})
			}
		}
		var idx []int
		for i := range tps {
			if rng.IntN(4) > 0 {
				idx = append(idx, i)
			}
		}
		// The answer: the asked partitions in order, then shuffled,
		// dropped, repeated and joined by strangers, each by chance.
		var answered []topicPartition
		for _, i := range idx {
			answered = append(answered, tps[i])
		}
		if rng.IntN(3) == 0 {
			rng.Shuffle(len(answered), func(i, j int) { answered[i], answered[j] = answered[j], answered[i] })
		}
		var mangled []topicPartition
		for _, tp := range answered {
			switch rng.IntN(10) {
			case 0: // dropped
			case 1:
				mangled = append(mangled, tp, tp)
			case 2:
				mangled = append(mangled, topicPartition{"x", tp.partition}, tp)
			default:
				mangled = append(mangled, tp)
			}
		}
		res := &kmsg.ListOffsetsResponse{}
		for n, tp := range mangled {
			// A topic per run of equal names, as a broker groups them.
			if k := len(res.Topics); k == 0 || res.Topics[k-1].Topic != tp.topic || rng.IntN(5) == 0 {
				res.Topics = append(res.Topics, kmsg.ListOffsetsResponseTopic{Topic: tp.topic})
			}
			t := &res.Topics[len(res.Topics)-1]
			t.Partitions = append(t.Partitions, kmsg.ListOffsetsResponseTopicPartition{Partition: tp.partition, Offset: int64(n)})
		}
		model := map[topicPartition]int64{}
		for _, t := range res.Topics {
			for _, p := range t.Partitions {
				model[topicPartition{t.Topic, p.Partition}] = p.Offset
			}
		}
		got := answersInOrder(res, tps, idx)
		if len(got) != len(idx) {
			t.Fatalf("round %d: %d answers for %d partitions", round, len(got), len(idx))
		}
		for j, i := range idx {
			want, ok := model[tps[i]]
			switch {
			case !ok && got[j] != nil:
				t.Fatalf("round %d: %v unanswered, found %+v (answer %v)", round, tps[i], got[j], mangled)
			case ok && (got[j] == nil || got[j].Offset != want):
				t.Fatalf("round %d: %v answered %d, found %+v (answer %v)", round, tps[i], want, got[j], mangled)
			}
		}
	}
}
