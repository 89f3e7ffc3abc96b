package cluster

import (
	"bufio"
	"context"
	"io"

	"github.com/jackc/pgx/v5/pgconn"
)

// copyBuffer is how much of a COPY's rows go through CopyOut's pipe at once.
const copyBuffer = 256 << 10

// CopyOut runs sql (a COPY … TO STDOUT) on conn in a goroutine of its own
// and returns the reading end of the pipe it writes the rows into. Its
// error (Classify'd; nil once every row is written) closes the pipe and
// then comes on the channel. through, when not nil, is what the COPY
// writes to, given the pipe's writer (a pacer in front of it).
//
// The server sends a message per row; the pipe gets them through a buffer:
// written one by one, each row would be a goroutine switch, and a message
// of its own for a COPY FROM that reads the pipe (pgconn sends what each
// read returns): the rows of a rewind took twice as long.
func CopyOut(ctx context.Context, conn *pgconn.PgConn, sql string, through func(io.Writer) io.Writer) (*io.PipeReader, <-chan error) {
	pr, pw := io.Pipe()
	bw := bufio.NewWriterSize(pw, copyBuffer)
	var w io.Writer = bw
	if through != nil {
		w = through(bw)
	}
	done := make(chan error, 1)
	go func() {
		_, err := conn.CopyTo(ctx, w, sql)
		if err == nil {
			err = bw.Flush()
		}
		err = Classify(err)
		pw.CloseWithError(err) // nil: the reader sees EOF
		done <- err
	}()
	return pr, done
}
