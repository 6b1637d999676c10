package tidemarkslog

import (
	"log/slog"
	"strconv"
	"time"

	"go.uber.org/zap/zapcore"
)

// addField adds f to enc. An error stays an error (slog.Any), so that a
// handler's ReplaceAttr can unwrap it; every other type is zap's own
// encoding (Field.AddTo) into the attrEncoder below.
func addField(enc *attrEncoder, f zapcore.Field) {
	if f.Type == zapcore.ErrorType {
		if err, ok := f.Interface.(error); ok {
			enc.add(slog.Any(f.Key, err))
			return
		}
	}
	f.AddTo(enc)
}

// attrEncoder is a zapcore.ObjectEncoder that builds slog attrs in the
// order of the fields, each with the Kind of its zap type: strings,
// signed and unsigned integers, floats, bools, durations and times keep
// theirs; an object becomes a group, an array a []any; a namespace opens a
// group that holds the rest of the object.
type attrEncoder struct {
	attrs []slog.Attr
	// open are the namespaces opened, outermost first, with what was
	// added to each.
	open []namespace
}

type namespace struct {
	key   string
	attrs []slog.Attr
}

var _ zapcore.ObjectEncoder = (*attrEncoder)(nil)

func (e *attrEncoder) add(a slog.Attr) {
	if n := len(e.open); n > 0 {
		e.open[n-1].attrs = append(e.open[n-1].attrs, a)
		return
	}
	e.attrs = append(e.attrs, a)
}

// finish closes the open namespaces and returns the attrs.
func (e *attrEncoder) finish() []slog.Attr {
	for n := len(e.open) - 1; n >= 0; n-- {
		ns := e.open[n]
		e.open = e.open[:n]
		e.add(slog.Attr{Key: ns.key, Value: slog.GroupValue(ns.attrs...)})
	}
	return e.attrs
}

func (e *attrEncoder) AddArray(key string, m zapcore.ArrayMarshaler) error {
	var arr arrayEncoder
	err := m.MarshalLogArray(&arr)
	e.add(slog.Any(key, arr.elems))
	return err
}

func (e *attrEncoder) AddObject(key string, m zapcore.ObjectMarshaler) error {
	var obj attrEncoder
	err := m.MarshalLogObject(&obj)
	e.add(slog.Attr{Key: key, Value: slog.GroupValue(obj.finish()...)})
	return err
}

func (e *attrEncoder) AddBinary(key string, v []byte) { e.add(slog.Any(key, v)) }
func (e *attrEncoder) AddByteString(key string, v []byte) {
	e.add(slog.String(key, string(v)))
}
func (e *attrEncoder) AddBool(key string, v bool) { e.add(slog.Bool(key, v)) }

// Complex numbers have no slog kind, and encoding/json refuses them: they
// are written as strings, "(1+2i)".
func (e *attrEncoder) AddComplex128(key string, v complex128) {
	e.add(slog.String(key, strconv.FormatComplex(v, 'g', -1, 128)))
}
func (e *attrEncoder) AddComplex64(key string, v complex64) {
	e.add(slog.String(key, strconv.FormatComplex(complex128(v), 'g', -1, 64)))
}
func (e *attrEncoder) AddDuration(key string, v time.Duration) { e.add(slog.Duration(key, v)) }
func (e *attrEncoder) AddFloat64(key string, v float64)        { e.add(slog.Float64(key, v)) }
func (e *attrEncoder) AddFloat32(key string, v float32)        { e.add(slog.Float64(key, float64(v))) }
func (e *attrEncoder) AddInt(key string, v int)                { e.add(slog.Int64(key, int64(v))) }
func (e *attrEncoder) AddInt64(key string, v int64)            { e.add(slog.Int64(key, v)) }
func (e *attrEncoder) AddInt32(key string, v int32)            { e.add(slog.Int64(key, int64(v))) }
func (e *attrEncoder) AddInt16(key string, v int16)            { e.add(slog.Int64(key, int64(v))) }
func (e *attrEncoder) AddInt8(key string, v int8)              { e.add(slog.Int64(key, int64(v))) }
func (e *attrEncoder) AddString(key, v string)                 { e.add(slog.String(key, v)) }
func (e *attrEncoder) AddTime(key string, v time.Time)         { e.add(slog.Time(key, v)) }
func (e *attrEncoder) AddUint(key string, v uint)              { e.add(slog.Uint64(key, uint64(v))) }
func (e *attrEncoder) AddUint64(key string, v uint64)          { e.add(slog.Uint64(key, v)) }
func (e *attrEncoder) AddUint32(key string, v uint32)          { e.add(slog.Uint64(key, uint64(v))) }
func (e *attrEncoder) AddUint16(key string, v uint16)          { e.add(slog.Uint64(key, uint64(v))) }
func (e *attrEncoder) AddUint8(key string, v uint8)            { e.add(slog.Uint64(key, uint64(v))) }
func (e *attrEncoder) AddUintptr(key string, v uintptr)        { e.add(slog.Uint64(key, uint64(v))) }

// AddReflected keeps the value as it is: the handler encodes it (the JSON
// handler with encoding/json, as zap's JSON encoder does).
func (e *attrEncoder) AddReflected(key string, v any) error {
	e.add(slog.Any(key, v))
	return nil
}

func (e *attrEncoder) OpenNamespace(key string) {
	e.open = append(e.open, namespace{key: key})
}

// arrayEncoder is a zapcore.ArrayEncoder that collects the elements as Go
// values: an object inside an array becomes a map[string]any (a []any
// cannot hold slog attrs that handlers would encode), a nested array a
// []any.
type arrayEncoder struct {
	elems []any
}

var _ zapcore.ArrayEncoder = (*arrayEncoder)(nil)

func (a *arrayEncoder) append(v any) { a.elems = append(a.elems, v) }

func (a *arrayEncoder) AppendBool(v bool)         { a.append(v) }
func (a *arrayEncoder) AppendByteString(v []byte) { a.append(string(v)) }
func (a *arrayEncoder) AppendComplex128(v complex128) {
	a.append(strconv.FormatComplex(v, 'g', -1, 128))
}
func (a *arrayEncoder) AppendComplex64(v complex64) {
	a.append(strconv.FormatComplex(complex128(v), 'g', -1, 64))
}
func (a *arrayEncoder) AppendFloat64(v float64)        { a.append(v) }
func (a *arrayEncoder) AppendFloat32(v float32)        { a.append(v) }
func (a *arrayEncoder) AppendInt(v int)                { a.append(v) }
func (a *arrayEncoder) AppendInt64(v int64)            { a.append(v) }
func (a *arrayEncoder) AppendInt32(v int32)            { a.append(v) }
func (a *arrayEncoder) AppendInt16(v int16)            { a.append(v) }
func (a *arrayEncoder) AppendInt8(v int8)              { a.append(v) }
func (a *arrayEncoder) AppendString(v string)          { a.append(v) }
func (a *arrayEncoder) AppendUint(v uint)              { a.append(v) }
func (a *arrayEncoder) AppendUint64(v uint64)          { a.append(v) }
func (a *arrayEncoder) AppendUint32(v uint32)          { a.append(v) }
func (a *arrayEncoder) AppendUint16(v uint16)          { a.append(v) }
func (a *arrayEncoder) AppendUint8(v uint8)            { a.append(v) }
func (a *arrayEncoder) AppendUintptr(v uintptr)        { a.append(v) }
func (a *arrayEncoder) AppendDuration(v time.Duration) { a.append(v) }
func (a *arrayEncoder) AppendTime(v time.Time)         { a.append(v) }

func (a *arrayEncoder) AppendArray(m zapcore.ArrayMarshaler) error {
	var inner arrayEncoder
	err := m.MarshalLogArray(&inner)
	a.append(inner.elems)
	return err
}

func (a *arrayEncoder) AppendObject(m zapcore.ObjectMarshaler) error {
	var obj attrEncoder
	err := m.MarshalLogObject(&obj)
	a.append(attrMap(obj.finish()))
	return err
}

func (a *arrayEncoder) AppendReflected(v any) error {
	a.append(v)
	return nil
}

// attrMap turns attrs into a map, groups into nested maps: an object's
// form inside an array.
func attrMap(attrs []slog.Attr) map[string]any {
	m := make(map[string]any, len(attrs))
	for _, at := range attrs {
		v := at.Value.Resolve()
		switch v.Kind() {
		case slog.KindGroup:
			m[at.Key] = attrMap(v.Group())
		case slog.KindAny:
			if err, ok := v.Any().(error); ok {
				m[at.Key] = err.Error()
				continue
			}
			m[at.Key] = v.Any()
		default:
			m[at.Key] = v.Any()
		}
	}
	return m
}
