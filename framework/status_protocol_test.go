package framework_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/tidemark/tidemark/framework"
	"github.com/tidemark/tidemark/internal/inspect"
)

// The status page names the group protocol: with "consumer" (KIP-848) the
// member epoch, with "classic" the generation; a snapshot of a consumer
// from before Stats.GroupProtocol shows the generation and no protocol.
func TestStatusPageGroupProtocol(t *testing.T) {
	at := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		protocol string
		want     []string
		not      []string
	}{
		{framework.GroupProtocolConsumer,
			[]string{`<dd id="group-protocol">consumer (KIP-848)</dd>`, `<dt>member epoch</dt><dd id="generation">7</dd>`},
			[]string{`<dt>generation</dt>`}},
		{framework.GroupProtocolClassic,
			[]string{`<dd id="group-protocol">classic</dd>`, `<dt>generation</dt><dd id="generation">7</dd>`},
			[]string{`member epoch`, `KIP-848`}},
		{"",
			[]string{`<dt>generation</dt><dd id="generation">7</dd>`},
			[]string{`id="group-protocol"`, `member epoch`}},
	} {
		snap := &snapshot{Format: inspect.Format, Version: inspect.SnapshotVersion, Pid: 7, TakenAt: at,
			Stats: framework.Stats{Group: "g", Generation: 7, Member: "m-1", GroupProtocol: tc.protocol}}
		if tc.protocol == framework.GroupProtocolConsumer {
			snap.Stats.MemberEpoch = 7
		}
		h := statusPage(t, func(context.Context, bool) (*snapshot, error) { return snap, nil })
		w := httptest.NewRecorder()
		h.ServeHTTP(w, httptest.NewRequest(http.MethodGet, "/status", nil))
		page := w.Body.String()
		for _, want := range tc.want {
			if !strings.Contains(page, want) {
				t.Errorf("GroupProtocol %q: the page lacks %q", tc.protocol, want)
			}
		}
		for _, not := range tc.not {
			if strings.Contains(page, not) {
				t.Errorf("GroupProtocol %q: the page shows %q", tc.protocol, not)
			}
		}
	}
}
