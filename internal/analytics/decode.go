package analytics

import (
	"encoding/binary"
	"errors"

	"github.com/jackc/pglogrepl"
)

// rowDecoder decodes pgoutput's row messages (Insert, Update, Delete)
// without pglogrepl's allocation and copy of every value: the tuples it
// returns point into the message and are reused by the next decode, so
// their values must be copied before then (batch.change turns them into
// strings at once). Most of a busy mirror's messages are these.
type rowDecoder struct {
	tuples [2]tupleBuf
}

type tupleBuf struct {
	t    pglogrepl.TupleData
	cols []pglogrepl.TupleDataColumn
	ptrs []*pglogrepl.TupleDataColumn
}

var errShortMessage = errors.New("pgoutput row message ends early")

// decode decodes a row message: its relation and its old and new tuples
// (nil where the message has none).
func (d *rowDecoder) decode(msg []byte) (rel uint32, old, new *pglogrepl.TupleData, err error) {
	if len(msg) < 6 {
		return 0, nil, nil, errShortMessage
	}
	kind, rel, rest := msg[0], binary.BigEndian.Uint32(msg[1:5]), msg[5:]
	if kind == 'U' || kind == 'D' {
		if rest[0] == 'K' || rest[0] == 'O' {
			if old, rest, err = d.tuples[0].decode(rest[1:]); err != nil {
				return 0, nil, nil, err
			}
		}
		if kind == 'D' {
			return rel, old, nil, nil
		}
	}
	if len(rest) < 1 || rest[0] != 'N' {
		return 0, nil, nil, errors.New("pgoutput row message without its new tuple")
	}
	new, _, err = d.tuples[1].decode(rest[1:])
	return rel, old, new, err
}

// decode reads one TupleData; it returns what follows it.
func (b *tupleBuf) decode(src []byte) (*pglogrepl.TupleData, []byte, error) {
	if len(src) < 2 {
		return nil, nil, errShortMessage
	}
	n := int(binary.BigEndian.Uint16(src))
	src = src[2:]
	if cap(b.cols) < n {
		b.cols = make([]pglogrepl.TupleDataColumn, n)
		b.ptrs = make([]*pglogrepl.TupleDataColumn, n)
		for i := range b.cols {
			b.ptrs[i] = &b.cols[i]
		}
	}
	for i := range n {
		if len(src) < 1 {
			return nil, nil, errShortMessage
		}
		c := &b.cols[i]
		*c = pglogrepl.TupleDataColumn{DataType: src[0]}
		src = src[1:]
		if c.DataType == 't' || c.DataType == 'b' {
			if len(src) < 4 {
				return nil, nil, errShortMessage
			}
			c.Length = binary.BigEndian.Uint32(src)
			if uint64(len(src)-4) < uint64(c.Length) {
				return nil, nil, errShortMessage
			}
			c.Data, src = src[4:4+c.Length], src[4+c.Length:]
		}
	}
	b.t = pglogrepl.TupleData{ColumnNum: uint16(n), Columns: b.ptrs[:n]}
	return &b.t, src, nil
}
