package framework_test

import (
	"encoding/json"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/tidemark/tidemark/framework"
	"github.com/tidemark/tidemark/internal/inspect"
	"github.com/tidemark/tidemark/internal/offsetfile"
)

// The snapshot's JSON names are the protocol of `tidemark inspect`: they are
// pinned here, so that renaming a Go field cannot change them silently.
// Outcomes and actions are strings. Every field survives a round trip.
func TestInspectSnapshotJSONPinned(t *testing.T) {
	at := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	snap := snapshot{
		Format: inspect.Format, Version: inspect.SnapshotVersion, Pid: 42, OffsetFile: "/o.db",
		Topics: []string{"orders"}, Started: at, TakenAt: at.Add(time.Second),
		Stats: framework.Stats{Group: "billing", Generation: 3, Member: "m-1", BufferedBytes: 10, StateChangelog: "-state", StateRebuild: true, FetchRequests: 11, OffsetFileError: "disk full",
			Partitions: []framework.PartitionStats{{Topic: "orders", Partition: 1, State: framework.StateRunning,
				Processed: 9, Durable: 8, Committed: 7, HighWatermark: 12, Lag: 3, Handled: 9, BufferedBytes: 4,
				Attempts: 2, LastError: "e", LastErrorAt: at, CommitError: "ce", LastCommit: "ok", Paused: true, DeadLettered: 1,
				Skipped: 2, UncleanRestarts: 1, Careful: true, LagTime: time.Second, HandlerErrors: 5, Retries: 4,
				BreakerTrips: 1, CarefulEntries: 2, StateRebuilds: 1}},
			Rebalances: 2, RebalanceTime: 3 * time.Second, Rebalancing: true, PartitionsLost: 4, LostUncommitted: 5, RevokedUncommitted: 6, HandoffOmitted: 7,
			JoinError: "refused", JoinFailingSince: at, JoinFailures: 3, MissingTopics: []string{"paymnts"}, DeadLetterError: "dlt", DeadLetterErrorSince: at,
			Commits:        framework.CommitCounts{OK: 1, Fenced: 2, Error: 3, Unknown: 4},
			HandlerLatency: framework.Histogram{Bounds: framework.LatencyBounds, Counts: make([]uint64, len(framework.LatencyBounds)+1), Count: 0},
		},
		Records: []offsetfile.Entry{{Key: offsetfile.Key{Group: "billing", Topic: "orders", Partition: 1},
			Record: offsetfile.Record{Watermark: 8, RecordedAt: at, Generation: 3, Member: "m-1", Committed: 7,
				CommittedAt: at, LastReset: &offsetfile.Reset{At: at, From: 1, To: 2, Reason: "r"},
				Run: &offsetfile.RunState{Open: true, Inflight: 5, Crashes: 1}, Skipped: 2, DeadLettered: 1,
				LastCommit: &offsetfile.CommitAttempt{Offset: 7, Generation: 3, At: at, Outcome: offsetfile.CommitUnknown,
					Latency: time.Millisecond, Error: "timeout"},
				Completed: []offsetfile.Range{{From: 9, To: 12}, {From: 20, To: 21}}}}},
		Failures: []inspect.Failures{{Key: offsetfile.Key{Group: "billing", Topic: "orders", Partition: 1},
			Failures: []offsetfile.Failure{{Offset: 3, At: at, Action: offsetfile.FailureDeadLetter, Attempts: 4,
				Reason: "boom", DeadLetter: "dlt/1@0"}}}},
	}
	// A field added to these types must be added to the wire format.
	for typ, n := range map[reflect.Type]int{
		reflect.TypeOf(snapshot{}): 10, reflect.TypeOf(framework.Stats{}): 28,
		reflect.TypeOf(offsetfile.Record{}): 12, reflect.TypeOf(offsetfile.CommitAttempt{}): 6,
		reflect.TypeOf(offsetfile.Failure{}): 6,
	} {
		if typ.NumField() != n {
			t.Errorf("%v has %d fields, this test knows %d: pin the new one's name below (and, for the offset file's types, add it to internal/inspect's wire format)", typ, typ.NumField(), n)
		}
	}

	b, err := json.Marshal(snap)
	if err != nil {
		t.Fatal(err)
	}
	var doc map[string]any
	if err := json.Unmarshal(b, &doc); err != nil {
		t.Fatal(err)
	}
	keys := func(v any) string {
		m := v.(map[string]any)
		var ks []string
		for k := range m {
			ks = append(ks, k)
		}
		slices.Sort(ks)
		return strings.Join(ks, " ")
	}
	first := func(v any) any { return v.([]any)[0] }
	stats := doc["stats"].(map[string]any)
	rec := first(doc["records"]).(map[string]any)
	fl := first(doc["failures"]).(map[string]any)
	for _, c := range []struct {
		what string
		v    any
		want string
	}{
		{"snapshot", doc, "failures format offset_file pid records started stats taken_at topics version"},
		{"stats", stats, "buffered_bytes commits dead_letter_error dead_letter_error_since fetch_requests fetch_session_resets flush_latency generation group group_protocol handler_latency handoff_omitted join_error join_failing_since join_failures lost_uncommitted member member_epoch missing_topics offset_file_error partitions partitions_lost rebalance_time_ns rebalances rebalancing revoked_uncommitted state_changelog state_rebuild"},
		{"partition stats", first(stats["partitions"]), "aborted attempts breaker_trips buffered_bytes careful careful_entries commit_error committed completed_ahead dead_lettered durable durable_wait handled handler_errors high_watermark in_flight lag lag_time_ns last_commit last_error last_error_at last_stable_offset oldest_age_ns oldest_incomplete partition paused processed restore_remaining restore_total restoring retries skipped state state_rebuilds synced topic transaction_wait_ns unclean_restarts waiting window_full"},
		{"record", rec, "committed committed_at completed_ranges dead_lettered generation group last_commit last_reset member partition recorded_at run skipped topic watermark"},
		{"last_reset", rec["last_reset"], "at from reason to"},
		{"run", rec["run"], "crashes inflight open"},
		{"last_commit", rec["last_commit"], "at error generation latency_ns offset outcome"},
		{"failures", fl, "failures group partition topic"},
		{"failure", first(fl["failures"]), "action at attempts dead_letter offset reason"},
	} {
		if got := keys(c.v); got != c.want {
			t.Errorf("%s fields:\n got %s\nwant %s", c.what, got, c.want)
		}
	}
	if o := rec["last_commit"].(map[string]any)["outcome"]; o != "unknown" {
		t.Errorf("outcome %#v, want \"unknown\"", o)
	}
	if a := first(fl["failures"]).(map[string]any)["action"]; a != "dead-lettered" {
		t.Errorf("action %#v, want \"dead-lettered\"", a)
	}

	var back snapshot
	if err := json.Unmarshal(b, &back); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(back, snap) {
		t.Errorf("round trip:\n got %+v\nwant %+v", back, snap)
	}
}
