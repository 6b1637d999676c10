package inspect

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/tidemark/tidemark/internal/offsetfile"
)

// The state sizes round-trip through StateHandler and FetchStateSizes,
// under pinned names; a wrong token is refused, and a consumer without the
// handler is ErrStateNotServed.
func TestStateSizes(t *testing.T) {
	sizes := []offsetfile.StateSize{
		{Key: offsetfile.Key{Group: "g", Topic: "t", Partition: 0}, Keys: 3000, Bytes: 176685, Outbox: -1},
		{Key: offsetfile.Key{Group: "g", Topic: "t", Partition: 1}, Keys: 2, Bytes: 5, Outbox: 3,
			Changelog: &offsetfile.ChangelogPosition{Epoch: 4, Start: 0, Next: 6, Acked: 9, Gap: true,
				Markers: []offsetfile.ChangelogMarker{{Epoch: 4, Start: 0}}}},
	}
	if n := reflect.TypeOf(offsetfile.StateSize{}).NumField(); n != 5 {
		t.Errorf("offsetfile.StateSize has %d fields, this test knows 5: add the new one to the wire format", n)
	}
	if n := reflect.TypeOf(offsetfile.ChangelogPosition{}).NumField(); n != 6 {
		t.Errorf("offsetfile.ChangelogPosition has %d fields, this test knows 6: add the new one to the wire format", n)
	}
	mux := http.NewServeMux()
	mux.Handle("GET "+StatePath, StateHandler("tok", func() ([]offsetfile.StateSize, error) { return sizes, nil }))
	srv := httptest.NewServer(mux)
	defer srv.Close()
	ep := &Endpoint{Network: "tcp", Address: strings.TrimPrefix(srv.URL, "http://"), Token: "tok"}
	ctx := context.Background()
	doc, err := FetchStateSizes(ctx, ep)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(doc.Partitions, sizes) || doc.TakenAt.IsZero() {
		t.Errorf("fetched %+v, want %+v", doc, sizes)
	}

	b, err := json.Marshal(doc)
	if err != nil {
		t.Fatal(err)
	}
	var raw struct {
		Partitions []map[string]any `json:"partitions"`
	}
	if err := json.Unmarshal(b, &raw); err != nil {
		t.Fatal(err)
	}
	keys := func(m map[string]any) string {
		var ks []string
		for k := range m {
			ks = append(ks, k)
		}
		slices.Sort(ks)
		return strings.Join(ks, " ")
	}
	if got, want := keys(raw.Partitions[1]), "bytes changelog_position group keys outbox_entries partition topic"; got != want {
		t.Errorf("partition fields:\n got %s\nwant %s", got, want)
	}
	if got, want := keys(raw.Partitions[1]["changelog_position"].(map[string]any)), "acked epoch gap markers next start"; got != want {
		t.Errorf("changelog position fields:\n got %s\nwant %s", got, want)
	}

	bad := *ep
	bad.Token = "wrong"
	if _, err := FetchStateSizes(ctx, &bad); err == nil || !strings.Contains(err.Error(), "401") {
		t.Errorf("a wrong token: %v, want 401", err)
	}
	old := httptest.NewServer(http.NewServeMux()) // a consumer from before the state sizes
	defer old.Close()
	if _, err := FetchStateSizes(ctx, &Endpoint{Network: "tcp", Address: strings.TrimPrefix(old.URL, "http://")}); !errors.Is(err, ErrStateNotServed) {
		t.Errorf("a consumer without the handler: %v, want ErrStateNotServed", err)
	}
}
