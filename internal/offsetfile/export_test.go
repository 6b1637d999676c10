package offsetfile

import (
	"time"

	bolt "go.etcd.io/bbolt"
)

// SetClock fixes the store's clock, for tests that write a file with the
// same bytes each run; the returned func restores it. Not safe to call
// while a store is open.
func SetClock(f func() time.Time) (restore func()) {
	old := clock
	clock = f
	return func() { clock = old }
}

// OpenUnchecked opens path as Open did before it checked the file (issue
// 27): bbolt's open, the schema version and a decoding of every record
// into a map, but no page walk and no failure entries; then it closes it.
// For BenchmarkOpen's comparison only.
func OpenUnchecked(path string) (records int, err error) {
	recs := make(map[Key]Record)
	db, err := openBolt(path, &Options{Timeout: defaultTimeout})
	if err != nil {
		return 0, err
	}
	defer db.Close()
	err = protect(func() error {
		return db.View(func(tx *bolt.Tx) error {
			if _, err := checkSchema(tx); err != nil {
				return err
			}
			return tx.Bucket(groupsBucket).ForEachBucket(func(g []byte) error {
				gb := tx.Bucket(groupsBucket).Bucket(g)
				return gb.ForEachBucket(func(t []byte) error {
					return gb.Bucket(t).ForEach(func(p, v []byte) error {
						part, err := decodePartitionKey(p)
						if err != nil {
							return err
						}
						rec, err := decodeRecord(v)
						if err != nil {
							return err
						}
						recs[Key{Group: string(g), Topic: string(t), Partition: part}] = rec
						return nil
					})
				})
			})
		})
	})
	return len(recs), err
}

// Written is the length of a journal's bytes up to its unused window's
// zeros (journal.go).
func Written(b []byte) int { return written(b) }
