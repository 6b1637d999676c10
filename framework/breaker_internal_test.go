package framework

import (
	"testing"

	"github.com/tidemark/tidemark/internal/offsetfile"
)

func TestBreakerDispatch(t *testing.T) {
	tests := []struct {
		name        string
		prev        *offsetfile.RunState
		limit       int
		first       int64
		careful     bool
		crashes     int32
		poison      int64
		nextCrashes int32 // after dispatching first+1
	}{
		{"never recorded", nil, 3, 10, false, 0, -1, 0},
		{"clean end", &offsetfile.RunState{Inflight: -1}, 3, 10, false, 0, -1, 0},
		{"unclean end, nothing in flight", &offsetfile.RunState{Open: true, Inflight: -1}, 3, 10, true, 0, -1, 0},
		{"unclean end, another offset in flight", &offsetfile.RunState{Open: true, Inflight: 7, Crashes: 2}, 3, 10, true, 0, -1, 0},
		{"unclean end, this offset in flight", &offsetfile.RunState{Open: true, Inflight: 10, Crashes: 1}, 3, 10, true, 2, -1, 0},
		{"trips at the limit", &offsetfile.RunState{Open: true, Inflight: 10, Crashes: 2}, 3, 10, true, 3, 10, 0},
		{"disabled", &offsetfile.RunState{Open: true, Inflight: 10, Crashes: 99}, 0, 10, true, 100, -1, 0},
		{"closed run with a stale in-flight offset", &offsetfile.RunState{Inflight: 10, Crashes: 2}, 3, 10, false, 0, -1, 0},
	}
	for _, tt := range tests {
		b := newBreaker(tt.prev, tt.limit)
		if b.careful != tt.careful {
			t.Errorf("%s: careful %v, want %v", tt.name, b.careful, tt.careful)
		}
		if !tt.careful {
			// Shared by every clean run: only careful mode judges.
			if b != cleanStart || b.poison != tt.poison || b.crashes != tt.crashes {
				t.Errorf("%s: a clean start's breaker is not the shared one, or it was written: %+v", tt.name, *b)
			}
			continue
		}
		b.judge(tt.first)
		if b.crashes != tt.crashes || b.poison != tt.poison {
			t.Errorf("%s: crashes %d poison %d, want %d and %d", tt.name, b.crashes, b.poison, tt.crashes, tt.poison)
		}
		b.judge(tt.first) // a retry of the same message keeps its count
		if b.crashes != tt.crashes {
			t.Errorf("%s: retry changed crashes to %d", tt.name, b.crashes)
		}
		b.judge(tt.first + 1)
		if b.crashes != tt.nextCrashes {
			t.Errorf("%s: next message crashes %d, want %d", tt.name, b.crashes, tt.nextCrashes)
		}
	}
}
