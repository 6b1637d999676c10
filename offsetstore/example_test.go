package offsetstore_test

import (
	"fmt"
	"log"
	"os"
	"path/filepath"

	"github.com/tidemark/tidemark/internal/offsetfile"
	"github.com/tidemark/tidemark/offsetstore"
)

// A program that reads a stopped consumer's progress.
func Example() {
	path := filepath.Join(os.TempDir(), "offsetstore-example.db")
	defer os.Remove(path)
	writeExampleFile(path) // what a consumer of group "billing" left behind

	rep, err := offsetstore.Check(path)
	if err != nil {
		log.Fatal(err)
	}
	if err := rep.Err(); err != nil {
		log.Fatal(err)
	}
	f, err := offsetstore.Open(path)
	if err != nil {
		log.Fatal(err)
	}
	defer f.Close()
	for _, p := range f.Partitions() {
		fmt.Printf("%s %s[%d]: handled up to %d, completed above: %v\n", p.Group, p.Topic, p.Partition, p.Watermark, p.Completed)
	}
	// Output:
	// billing invoices[0]: handled up to 42, completed above: []
	// billing invoices[1]: handled up to 7, completed above: [{9 12}]
}

func writeExampleFile(path string) {
	s, err := offsetfile.Open(path, nil)
	if err != nil {
		log.Fatal(err)
	}
	k := offsetfile.Key{Group: "billing", Topic: "invoices"}
	if err := s.SetWatermark(k, 42, 1, "m"); err != nil {
		log.Fatal(err)
	}
	k.Partition = 1
	if err := s.Put(k, offsetfile.Record{Watermark: 7, Committed: -1, Completed: []offsetfile.Range{{From: 9, To: 12}}}); err != nil {
		log.Fatal(err)
	}
	if err := s.Close(); err != nil {
		log.Fatal(err)
	}
}
