package analytics

import (
	"testing"

	"github.com/jackc/pglogrepl"
)

// The row decoder reads what pglogrepl reads, and a message cut short at
// any byte is an error, never a panic or a wrong row.
func TestRowDecoder(t *testing.T) {
	tuple := func(p pgout, vals ...string) pgout {
		p = p.u16(uint16(len(vals)))
		for _, v := range vals {
			switch v {
			case "<null>":
				p = p.u8('n')
			case "<toast>":
				p = p.u8('u')
			default:
				p = append(p.u8('t').u32(uint32(len(v))), v...)
			}
		}
		return p
	}
	msgs := map[string][]byte{
		"insert":      tuple(pgout{'I'}.u32(7).u8('N'), "1", "a\tb", "<null>", ""),
		"update":      tuple(pgout{'U'}.u32(7).u8('N'), "1", "x", "<toast>"),
		"update key":  tuple(tuple(pgout{'U'}.u32(7).u8('K'), "1", "<null>").u8('N'), "2", "y", "z"),
		"update full": tuple(tuple(pgout{'U'}.u32(7).u8('O'), "1", "a", "b").u8('N'), "1", "a", "c"),
		"delete key":  tuple(pgout{'D'}.u32(9).u8('K'), "5"),
		"delete full": tuple(pgout{'D'}.u32(9).u8('O'), "5", "<null>"),
	}
	same := func(a, b *pglogrepl.TupleData) bool {
		if a == nil || b == nil {
			return a == nil && b == nil
		}
		if len(a.Columns) != len(b.Columns) {
			return false
		}
		for i := range a.Columns {
			x, y := a.Columns[i], b.Columns[i]
			if x.DataType != y.DataType || string(x.Data) != string(y.Data) {
				return false
			}
		}
		return true
	}
	var d rowDecoder
	for name, msg := range msgs {
		parsed, err := pglogrepl.Parse(msg)
		if err != nil {
			t.Fatalf("%s: pglogrepl: %v", name, err)
		}
		var rel uint32
		var old, new *pglogrepl.TupleData
		switch m := parsed.(type) {
		case *pglogrepl.InsertMessage:
			rel, new = m.RelationID, m.Tuple
		case *pglogrepl.UpdateMessage:
			rel, old, new = m.RelationID, m.OldTuple, m.NewTuple
		case *pglogrepl.DeleteMessage:
			rel, old = m.RelationID, m.OldTuple
		}
		gotRel, gotOld, gotNew, err := d.decode(msg)
		if err != nil || gotRel != rel || !same(gotOld, old) || !same(gotNew, new) {
			t.Errorf("%s: decoded rel %d old %v new %v (%v), pglogrepl rel %d old %v new %v", name, gotRel, gotOld, gotNew, err, rel, old, new)
		}
		for cut := range len(msg) {
			if _, _, _, err := d.decode(msg[:cut]); err == nil {
				t.Errorf("%s cut at %d of %d bytes: no error", name, cut, len(msg))
			}
		}
	}
}
