package offsetstore

import (
	"fmt"

	"github.com/tidemark/tidemark/internal/offsetfile"
)

// Severity says how much a Finding matters.
type Severity = offsetfile.Severity

// The severities, least serious first.
const (
	SeverityInfo    = offsetfile.SeverityInfo
	SeverityWarning = offsetfile.SeverityWarning
	SeverityError   = offsetfile.SeverityError
)

// Finding is one thing Check found.
type Finding struct {
	Severity Severity
	// Group, Topic and Partition name the partition the finding is about;
	// Topic is "" (and Partition -1) for the whole file.
	Group     string
	Topic     string
	Partition int
	Message   string
}

func (f Finding) String() string {
	if f.Topic == "" {
		return fmt.Sprintf("%s: %s", f.Severity, f.Message)
	}
	return fmt.Sprintf("%s: group %q topic %q partition %d: %s", f.Severity, f.Group, f.Topic, f.Partition, f.Message)
}

// CheckReport is what Check found in a file.
type CheckReport struct {
	Path string
	// Records counts the partitions' records; Journal the journal entries
	// a crash left for Open to apply.
	Records int
	Journal int
	// Findings, most serious first.
	Findings []Finding
}

// Err is nil when no finding is an error; otherwise it wraps ErrDamaged
// and names the first one.
func (r *CheckReport) Err() error {
	for _, f := range r.Findings {
		if f.Severity >= SeverityError {
			return fmt.Errorf("%s: %w: %s", r.Path, ErrDamaged, f)
		}
	}
	return nil
}

// Check examines the file at path without writing to it: bbolt's page tree,
// the schema, every record, failure entry and state entry, and the journal
// beside it. Unlike Open it reads a damaged file to the end and reports what
// it found. The error is for a file it cannot examine at all: missing, not
// a regular file, not a tidemark file (ErrSchema), or held by a consumer
// (ErrInUse).
func Check(path string) (*CheckReport, error) {
	rep, err := offsetfile.Check(path, nil)
	if err != nil {
		return nil, err
	}
	out := &CheckReport{Path: rep.Path, Journal: rep.JournalEntries}
	for _, n := range rep.Records {
		out.Records += n
	}
	for _, f := range rep.Findings {
		g := Finding{Severity: f.Severity, Partition: -1, Message: f.Message}
		if f.Key != nil {
			g.Group, g.Topic, g.Partition = f.Key.Group, f.Key.Topic, int(f.Key.Partition)
		}
		out.Findings = append(out.Findings, g)
	}
	return out, nil
}
