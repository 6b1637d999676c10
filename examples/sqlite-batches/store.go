package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/url"
	"sync/atomic"
	"time"

	"github.com/segmentio/kafka-go"

	_ "modernc.org/sqlite" // the "sqlite" database/sql driver, pure Go

	"github.com/tidemark/tidemark/handler"
)

// schema is the database the Store writes. events has one row per message,
// keyed by where Kafka put it. orders has one row per order (the message
// key): its last status and how many messages changed it, an update that
// is not idempotent on its own (a repeat would count twice). applied is
// the guard: per partition, the offset of the last message whose effect is
// in the tables, written in the same transaction as those effects.
const schema = `
CREATE TABLE IF NOT EXISTS events (
	topic     TEXT    NOT NULL,
	partition INTEGER NOT NULL,
	offset    INTEGER NOT NULL,
	key       TEXT    NOT NULL,
	value     TEXT    NOT NULL,
	PRIMARY KEY (topic, partition, offset)
);
CREATE TABLE IF NOT EXISTS orders (
	key     TEXT    PRIMARY KEY,
	status  TEXT    NOT NULL CHECK (status <> ''),
	updates INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS applied (
	topic       TEXT    NOT NULL,
	partition   INTEGER NOT NULL,
	last_offset INTEGER NOT NULL,
	PRIMARY KEY (topic, partition)
);`

// A Store is the BatchHandler: it writes each batch to SQLite in one
// transaction, together with the offset of the batch's last message, and
// skips the messages of a batch at or below the offset the database
// already holds for their partition. A batch handled twice (a crash
// between the SQLite commit and tidemark's offset file, a restart with a
// lost offset file) thus changes the tables once. It requires
// framework.OrderPartition, the default: the guard is one offset per
// partition, which is right only if a partition's batches are applied in
// offset order.
type Store struct {
	db *sql.DB

	batches, applied, skipped, failed atomic.Int64
}

var _ handler.BatchHandler = (*Store)(nil)

// OpenStore opens (or creates) the database at path. busyTimeout is how
// long a write waits for another process's lock before it fails with
// SQLITE_BUSY, an error tidemark retries.
func OpenStore(ctx context.Context, path string, busyTimeout time.Duration) (*Store, error) {
	q := url.Values{}
	// immediate: a transaction takes the write lock at BEGIN, so that a
	// busy database fails the batch before any of its work is done.
	q.Set("_txlock", "immediate")
	q.Add("_pragma", fmt.Sprintf("busy_timeout(%d)", busyTimeout.Milliseconds()))
	q.Add("_pragma", "journal_mode(WAL)")
	// FULL: a commit is on disk when Commit returns. tidemark moves past a
	// batch once HandleBatch returns nil, so a commit a power cut could
	// undo would be a batch lost.
	q.Add("_pragma", "synchronous(FULL)")
	db, err := sql.Open("sqlite", "file:"+path+"?"+q.Encode())
	if err != nil {
		return nil, fmt.Errorf("opening %s: %w", path, err)
	}
	// SQLite has one writer at a time: with one connection the partitions'
	// transactions queue in database/sql (which honours ctx) instead of
	// failing on each other with SQLITE_BUSY.
	db.SetMaxOpenConns(1)
	if _, err := db.ExecContext(ctx, schema); err != nil {
		db.Close()
		return nil, fmt.Errorf("creating the tables of %s: %w", path, err)
	}
	return &Store{db: db}, nil
}

// Close closes the database.
func (s *Store) Close() error { return s.db.Close() }

// HandleBatch applies msgs, consecutive messages of one partition, in one
// transaction. An error rolls everything back: tidemark then retries the
// batch (split in halves to find the failing message), and nothing of it
// is in the tables until a try commits.
func (s *Store) HandleBatch(ctx context.Context, msgs []kafka.Message) (err error) {
	if len(msgs) == 0 {
		return nil
	}
	first := msgs[0]
	defer func() {
		if err != nil {
			s.failed.Add(1)
			if len(msgs) == 1 {
				err = fmt.Errorf("writing %s/%d offset %d: %w", first.Topic, first.Partition, first.Offset, err)
			} else {
				err = fmt.Errorf("writing %d messages of %s/%d, offsets %d to %d: %w", len(msgs), first.Topic, first.Partition, first.Offset, msgs[len(msgs)-1].Offset, err)
			}
		}
	}()
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback() // a no-op after Commit

	last := int64(-1)
	err = tx.QueryRowContext(ctx, `SELECT last_offset FROM applied WHERE topic = ? AND partition = ?`,
		first.Topic, first.Partition).Scan(&last)
	if err != nil && !errors.Is(err, sql.ErrNoRows) {
		return err
	}
	applied, skipped := 0, 0
	for _, m := range msgs {
		if m.Offset <= last {
			skipped++ // its effect is in the tables already
			continue
		}
		if _, err := tx.ExecContext(ctx, `INSERT INTO events (topic, partition, offset, key, value) VALUES (?, ?, ?, ?, ?)`,
			m.Topic, m.Partition, m.Offset, string(m.Key), string(m.Value)); err != nil {
			return fmt.Errorf("offset %d: %w", m.Offset, err)
		}
		if _, err := tx.ExecContext(ctx, `INSERT INTO orders (key, status, updates) VALUES (?, ?, 1)
			ON CONFLICT (key) DO UPDATE SET status = excluded.status, updates = updates + 1`,
			string(m.Key), string(m.Value)); err != nil {
			return fmt.Errorf("offset %d: %w", m.Offset, err)
		}
		last = m.Offset
		applied++
	}
	if applied > 0 {
		if _, err := tx.ExecContext(ctx, `INSERT INTO applied (topic, partition, last_offset) VALUES (?, ?, ?)
			ON CONFLICT (topic, partition) DO UPDATE SET last_offset = excluded.last_offset`,
			first.Topic, first.Partition, last); err != nil {
			return err
		}
	}
	if err := tx.Commit(); err != nil {
		return err
	}
	s.batches.Add(1)
	s.applied.Add(int64(applied))
	s.skipped.Add(int64(skipped))
	return nil
}

// StoreStats counts what HandleBatch did since the Store was opened.
type StoreStats struct {
	Batches int64 // batches committed
	Applied int64 // messages whose effect the commits wrote
	Skipped int64 // messages at or below their partition's applied offset
	Failed  int64 // calls that returned an error (rolled back)
}

// Stats returns the counts so far.
func (s *Store) Stats() StoreStats {
	return StoreStats{
		Batches: s.batches.Load(),
		Applied: s.applied.Load(),
		Skipped: s.skipped.Load(),
		Failed:  s.failed.Load(),
	}
}

// Tables is what the tables hold: the rows of events and orders, and the
// sum of orders.updates (one per message applied).
type Tables struct {
	Events, Orders, Updates int64
}

// Count reads the tables' counts.
func (s *Store) Count(ctx context.Context) (Tables, error) {
	var t Tables
	err := s.db.QueryRowContext(ctx, `SELECT
		(SELECT count(*) FROM events),
		(SELECT count(*) FROM orders),
		(SELECT coalesce(sum(updates), 0) FROM orders)`).Scan(&t.Events, &t.Orders, &t.Updates)
	if err != nil {
		return t, fmt.Errorf("counting the rows: %w", err)
	}
	return t, nil
}
