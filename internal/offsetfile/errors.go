package offsetfile

import "errors"

// Sentinel errors. They are always returned wrapped in a *FileError that
// names the file, so test for them with errors.Is.
var (
	// ErrClosed is returned by calls made after Close.
	ErrClosed = errors.New("store is closed")

	// ErrReadOnly is returned by the mutating calls of a store opened with
	// Options.ReadOnly.
	ErrReadOnly = errors.New("store is read-only")

	// ErrInUse is wrapped by Open when the file lock could not be taken
	// within Options.Timeout: another process (or another Store in this
	// process) has the file open.
	ErrInUse = errors.New("file is in use by another process")

	// ErrSchema is wrapped by Open when the file is not a tidemark offset
	// store, or was written with a schema version this build does not know.
	ErrSchema = errors.New("unsupported schema")

	// ErrDamaged is wrapped by Open when the file is damaged: Check would
	// report an error (a page of bbolt's tree unreadable, a record or
	// failure entry that does not decode), the file is truncated, or it
	// has 0 bytes. The error names the first finding and how to recover.
	ErrDamaged = errors.New("damaged offset file")
)

// FileError is the error type returned by every function of this package
// that can fail. It names the file and the operation; Err is the cause.
type FileError struct {
	Path string // the store's file
	Op   string // "open", "flush", "set watermark", ...
	Err  error
}

func (e *FileError) Error() string {
	return "offsetstore: " + e.Op + " " + e.Path + ": " + e.Err.Error()
}

func (e *FileError) Unwrap() error { return e.Err }

// detailError carries a message of its own while matching a sentinel under
// errors.Is, so that messages do not repeat the sentinel's text.
type detailError struct {
	sentinel error
	msg      string
	cause    error // optional
}

func (e *detailError) Error() string {
	if e.cause != nil {
		return e.msg + ": " + e.cause.Error()
	}
	return e.msg
}

func (e *detailError) Unwrap() []error {
	if e.cause != nil {
		return []error{e.sentinel, e.cause}
	}
	return []error{e.sentinel}
}

var errNilProgress = errors.New("nil Progress")
