package framework

import (
	"errors"
	"slices"
	"testing"

	"github.com/tidemark/tidemark/internal/offsetfile"
)

func TestHandoffRoundTrip(t *testing.T) {
	for _, tc := range []struct {
		offset int64
		in     []offsetfile.Range
		want   []offsetfile.Range
	}{
		{10, nil, nil},
		{10, []offsetfile.Range{{From: 12, To: 20}}, []offsetfile.Range{{From: 12, To: 20}}},
		{10, []offsetfile.Range{{From: 5, To: 9}, {From: 8, To: 15}, {From: 17, To: 18}}, []offsetfile.Range{{From: 11, To: 15}, {From: 17, To: 18}}},
		{0, []offsetfile.Range{{From: 1, To: 3001}}, []offsetfile.Range{{From: 1, To: 3001}}},
	} {
		meta, omitted := encodeHandoff(tc.offset, tc.in)
		if omitted != 0 {
			t.Fatalf("%v: %d omitted", tc.in, omitted)
		}
		if tc.want == nil {
			if meta != "" {
				t.Fatalf("%v: metadata %q, want none", tc.in, meta)
			}
			continue
		}
		got, err := decodeHandoff(tc.offset, meta)
		if err != nil || !slices.Equal(got, tc.want) {
			t.Fatalf("%v at %d: %q decodes to %v, %v; want %v", tc.in, tc.offset, meta, got, err, tc.want)
		}
	}
}

// Ranges beyond Kafka's default metadata bound are left out, lowest kept,
// and counted.
func TestHandoffBound(t *testing.T) {
	var in []offsetfile.Range
	var total int64
	for i := range int64(5000) {
		in = append(in, offsetfile.Range{From: 100 + 3*i, To: 102 + 3*i})
		total += 2
	}
	meta, omitted := encodeHandoff(99, in)
	if len(meta) > maxHandoffMeta {
		t.Fatalf("metadata of %d bytes, the bound is %d", len(meta), maxHandoffMeta)
	}
	got, err := decodeHandoff(99, meta)
	if err != nil {
		t.Fatal(err)
	}
	var carried int64
	for _, r := range got {
		carried += r.To - r.From
	}
	if carried+omitted != total || omitted == 0 || !slices.Equal(got, in[:len(got)]) {
		t.Fatalf("%d carried in %d ranges, %d omitted, of %d", carried, len(got), omitted, total)
	}
}

func TestHandoffRefusesOthers(t *testing.T) {
	if _, err := decodeHandoff(5, ""); !errors.Is(err, errNotHandoff) {
		t.Fatalf("empty metadata: %v", err)
	}
	if _, err := decodeHandoff(5, "some other client's"); !errors.Is(err, errNotHandoff) {
		t.Fatalf("another client's metadata: %v", err)
	}
	for _, bad := range []string{handoffPrefix + "!!", handoffPrefix + "AQ", handoffPrefix + "AQAB", handoffPrefix + "AQEBAQ"} {
		if _, err := decodeHandoff(5, bad); err == nil || errors.Is(err, errNotHandoff) {
			t.Fatalf("%q: %v, want a decode error", bad, err)
		}
	}
}

func FuzzDecodeHandoff(f *testing.F) {
	meta, _ := encodeHandoff(7, []offsetfile.Range{{From: 9, To: 12}, {From: 20, To: 21}})
	f.Add(int64(7), meta)
	f.Add(int64(0), handoffPrefix+"AQEB")
	f.Fuzz(func(t *testing.T, offset int64, meta string) {
		got, err := decodeHandoff(offset, meta)
		if err != nil {
			return
		}
		prev := offset
		for i, r := range got {
			if r.From <= prev || r.To <= r.From || (i > 0 && r.From == got[i-1].To) {
				t.Fatalf("%q at %d decodes to invalid ranges %v", meta, offset, got)
			}
			prev = r.To
		}
		if len(got) == 0 {
			return
		}
		again, omitted := encodeHandoff(offset, got)
		back, err := decodeHandoff(offset, again)
		if omitted == 0 && (err != nil || !slices.Equal(back, got)) {
			t.Fatalf("%v does not round-trip: %q, %v, %v", got, again, back, err)
		}
	})
}
