package framework

import (
	"github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// fetchSession is one broker loop's incremental fetch session (KIP-227):
// the broker remembers the partitions the loop fetches and their
// positions, so a request lists only what changed since the last one
// (a position moved, a partition added) and forgets what the loop no
// longer fetches (its buffer full, paused, moved, revoked), and an answer
// lists only the partitions with news. An idle wide topic then costs a
// request of no partitions, not one of every partition. A backlog wider
// than a request can fill is fetched outside it (backlogFill, fetch.go):
// a broker reads every partition of a session for each request.
//
// Owned by the broker loop, under its mu like its cursors. Each
// cursor records what the broker holds for it (fetchState.sessOffset,
// sessMax, inSession); forget holds the partitions that left the loop's
// set while in the session, until a request tells the broker.
type fetchSession struct {
	id int32
	// epoch is the next request's: 0 asks for a full request that opens a
	// session (closing id's, if any); then 1, 2, ... for incremental ones.
	epoch  int32
	forget []topicPartition
}

// full says whether the next request lists every partition fetched.
func (s *fetchSession) full() bool { return s.epoch == 0 }

// reset ends the session: the next request is full and opens a new one.
// keep says the broker may still hold id (an epoch refused, a request lost):
// the full request then closes it.
func (s *fetchSession) reset(keep bool) {
	if !keep {
		s.id = 0
	}
	s.epoch = 0
	s.forget = s.forget[:0]
}

// answered moves the session on after a response without error: a full
// request's answer opens the session it names (none when the broker
// declined, id 0: the next request is full again).
func (s *fetchSession) answered(id int32) {
	if s.epoch == 0 {
		s.id = id
		if id != 0 {
			s.epoch = 1
		}
		return
	}
	s.epoch++
	if s.epoch <= 0 {
		s.epoch = 1 // wraps past MaxInt32 to 1, as Kafka does
	}
}

// endsSession says whether a response's error code ends the session: the
// broker evicted it, or the epochs went out of step.
func endsSession(code int16) bool {
	return kafka.Error(code) == kafka.FetchSessionIDNotFound || kafka.Error(code) == kafka.InvalidFetchSessionEpoch
}

// left records that fs left the loop's set while the broker held it.
func (s *fetchSession) left(fs *fetchState) {
	if fs.inSession {
		fs.inSession = false
		s.forget = append(s.forget, fs.p.tp)
	}
}

// list says whether ready partition fs must be listed in the next request
// at partMax, and records it as held: a full request lists every one, an
// incremental one those whose position or size changed.
func (s *fetchSession) list(fs *fetchState, partMax int32) bool {
	if !s.full() && fs.inSession && fs.sessOffset == fs.next && fs.sessMax == partMax {
		return false
	}
	fs.inSession, fs.sessOffset, fs.sessMax = true, fs.next, partMax
	return true
}

// skip records that fs, in the loop's set, is not fetched by the next
// request: an incremental request forgets it.
func (s *fetchSession) skip(fs *fetchState) {
	if s.full() {
		fs.inSession = false
		return
	}
	s.left(fs)
}

// stamp sets req's session fields and the partitions it forgets, leaving
// out those it lists again (Kafka applies a request's partitions before
// its forgotten ones, kfake after: one partition in both is read apart).
func (s *fetchSession) stamp(req *kmsg.FetchRequest) {
	req.SessionID = s.id
	req.SessionEpoch = s.epoch
	if s.full() || len(s.forget) == 0 {
		s.forget = s.forget[:0]
		return
	}
	// forget is short: the partitions that left since the last request.
	forgotten := make(map[topicPartition]bool, len(s.forget))
	for _, tp := range s.forget {
		forgotten[tp] = true
	}
	for _, t := range req.Topics {
		for _, p := range t.Partitions {
			delete(forgotten, topicPartition{t.Topic, p.Partition})
		}
	}
	for _, tp := range s.forget {
		if !forgotten[tp] {
			continue // listed again, or named twice
		}
		delete(forgotten, tp)
		i := len(req.ForgottenTopics) - 1
		if i < 0 || req.ForgottenTopics[i].Topic != tp.topic {
			// Grouped by topic as far as forget's order allows; a topic
			// named twice is still one topic to the broker.
			ft := kmsg.NewFetchRequestForgottenTopic()
			ft.Topic = tp.topic
			req.ForgottenTopics = append(req.ForgottenTopics, ft)
			i++
		}
		req.ForgottenTopics[i].Partitions = append(req.ForgottenTopics[i].Partitions, tp.partition)
	}
	s.forget = s.forget[:0]
}
