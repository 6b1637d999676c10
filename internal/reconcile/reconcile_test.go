package reconcile_test

import (
	"strings"
	"testing"

	"github.com/tidemark/tidemark/internal/reconcile"
)

// Every case of the decision, with the log [0, 200] (stable 190) unless
// the case says otherwise.
func TestDecide(t *testing.T) {
	in := func(L, K, C int64, p reconcile.Policy) reconcile.Input {
		return reconcile.Input{Local: L, Confirmed: K, Kafka: C, First: 0, Last: 200, Stable: 190, OutOfRange: p}
	}
	type want struct {
		c       reconcile.Case
		start   int64
		resets  int
		stall   bool
		restore bool
		commit  bool
		reason  string
	}
	for _, tc := range []struct {
		name string
		in   reconcile.Input
		want want
	}{
		{"agree", in(100, 100, 100, 0), want{c: reconcile.Agree, start: 100, restore: true}},
		{"late commit", in(120, 100, 100, 0), want{c: reconcile.LocalAhead, start: 120, restore: true, commit: true}},
		{"kafka ahead", in(100, 100, 150, 0), want{c: reconcile.KafkaAhead, start: 150}},
		{"first time", in(-1, -1, 50, 0), want{c: reconcile.FirstTime, start: 50}},
		{"no position", in(-1, -1, -1, 0), want{c: reconcile.NoPosition, start: 0}},
		{"no position, latest", func() reconcile.Input { i := in(-1, -1, -1, 0); i.StartLatest = true; return i }(),
			want{c: reconcile.NoPosition, start: 190, commit: true}},
		// At the end of an empty log: a member that starts later would
		// begin at a later end, so Kafka gets this one at once.
		{"no position, latest, empty log", reconcile.Input{Local: -1, Confirmed: -1, Kafka: -1, StartLatest: true},
			want{c: reconcile.NoPosition, start: 0, commit: true}},
		{"operator reset", in(100, 100, 40, reconcile.ResetToEarliest),
			want{c: reconcile.MovedBack, start: 40, resets: 1, reason: "below the 100 it confirmed before"}},
		{"operator reset, stall", in(100, 100, 40, reconcile.Stall),
			want{c: reconcile.MovedBack, stall: true, reason: "below the 100 it confirmed before"}},
		{"offsets deleted", in(100, 100, -1, reconcile.ResetToEarliest),
			want{c: reconcile.MovedBack, start: 0, resets: 1, commit: true, reason: "no committed offset"}},
		{"offsets deleted, latest", in(100, 100, -1, reconcile.ResetToLatest),
			want{c: reconcile.MovedBack, start: 190, resets: 1, commit: true, reason: "no committed offset"}},
		{"offsets deleted, stall", in(100, 100, -1, reconcile.Stall),
			want{c: reconcile.MovedBack, stall: true, reason: "no committed offset"}},
		// A reset whose target is the old watermark restores nothing.
		{"offsets deleted, log starts at the watermark", reconcile.Input{Local: 100, Confirmed: 100, Kafka: -1, First: 100, Last: 200, Stable: 200},
			want{c: reconcile.MovedBack, start: 100, resets: 1, commit: true}},
		{"reset below the log start", reconcile.Input{Local: 100, Confirmed: 100, Kafka: 40, First: 60, Last: 200, Stable: 200},
			want{c: reconcile.MovedBack, start: 60, resets: 1, commit: true, reason: "outside the log [60, 200]"}},
		{"beyond the log end", in(250, 250, 250, 0),
			want{c: reconcile.Agree, start: 0, resets: 1, commit: true, reason: "outside the log [0, 200]"}},
		{"beyond the log end, stall", in(250, 250, 250, reconcile.Stall),
			want{c: reconcile.Agree, stall: true, reason: "outside the log"}},
		{"no confirmed commit: a late one", in(100, -1, 40, 0), want{c: reconcile.LocalAhead, start: 100, restore: true, commit: true}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := reconcile.Decide(tc.in)
			got := want{c: d.Case, start: d.Start, resets: len(d.Resets), stall: d.Stall != nil, restore: d.Restore, commit: d.Commit}
			reason := ""
			if d.Stall != nil {
				reason = d.Stall.Reason
			} else if len(d.Resets) > 0 {
				reason = d.Resets[len(d.Resets)-1].Reason
			}
			w := tc.want
			w.reason = ""
			if got != w {
				t.Errorf("Decide(%+v) = %+v, want %+v", tc.in, got, w)
			}
			if !strings.Contains(reason, tc.want.reason) {
				t.Errorf("reason %q does not contain %q", reason, tc.want.reason)
			}
			if d.Reset() && (d.Restore || !d.SetWatermark) {
				t.Errorf("a reset that restores the completed ranges: %+v", d)
			}
		})
	}
}
