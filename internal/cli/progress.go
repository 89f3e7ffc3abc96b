package cli

import (
	"context"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/pgtenant/pgtenant/internal/api"
	"github.com/pgtenant/pgtenant/internal/jobs"
)

// progress shows a job's progress: a bar redrawn in place on a terminal,
// one line per change otherwise (logs, CI).
type progress struct {
	w    io.Writer
	tty  bool
	last string
}

func newProgress(w io.Writer) *progress {
	p := &progress{w: w}
	if f, ok := w.(*os.File); ok {
		if fi, err := f.Stat(); err == nil && fi.Mode()&os.ModeCharDevice != 0 {
			p.tty = true
		}
	}
	return p
}

// update draws a job.
func (p *progress) update(j jobs.Job) {
	p.draw(fmt.Sprintf("job %d %s: %s", j.ID, j.State, j.ProgressMsg), j.ProgressDone, j.ProgressTotal)
}

// bytes draws a transfer of total bytes (-1: unknown), done so far; off a
// terminal, one line per tenth.
func (p *progress) bytes(what string, done, total int64) {
	if total <= 0 {
		p.draw(fmt.Sprintf("%s: %s", what, humanBytes(done)), 0, 0)
		return
	}
	shown := done
	if !p.tty {
		shown = total * (10 * done / total) / 10
	}
	p.draw(fmt.Sprintf("%s: %s of %s", what, humanBytes(shown), humanBytes(total)), done, total)
}

// draw shows line with a bar of done against total (none when total is 0).
func (p *progress) draw(line string, done, total int64) {
	if !p.tty {
		if line != p.last {
			fmt.Fprintln(p.w, line)
			p.last = line
		}
		return
	}
	const width = 30
	filled := 0
	pct := ""
	if total > 0 {
		filled = int(float64(width) * float64(done) / float64(total))
		pct = fmt.Sprintf("%3d%% ", 100*done/total)
	}
	filled = min(max(filled, 0), width)
	bar := "[" + strings.Repeat("#", filled) + strings.Repeat("-", width-filled) + "] "
	msg := line
	if len(msg) > 80 {
		msg = msg[:77] + "..."
	}
	fmt.Fprintf(p.w, "\r\033[K%s%s%s", bar, pct, msg)
	p.last = line
}

// done ends the bar's line.
func (p *progress) done() {
	if p.tty && p.last != "" {
		fmt.Fprintln(p.w)
	}
}

// waitJob waits for a job with a progress display on stderr; a job that
// ends failed or cancelled is an error.
func (g *globals) waitJob(ctx context.Context, c *api.Client, id int64) (jobs.Job, error) {
	p := newProgress(g.stderr)
	j, err := c.WaitJob(ctx, id, p.update)
	p.done()
	if err != nil {
		return j, err
	}
	if j.State == jobs.Failed || j.State == jobs.Cancelled {
		return j, fmt.Errorf("job %d %s: %s", j.ID, j.State, j.LastError)
	}
	return j, nil
}

// printJob prints a job a command started, once done when wait (--wait).
func (g *globals) printJob(ctx context.Context, c *api.Client, j jobs.Job, wait bool) error {
	if wait {
		var err error
		if j, err = g.waitJob(ctx, c, j.ID); err != nil {
			return err
		}
	}
	return g.print(j, func(w io.Writer) { jobDetail(w, j) })
}

// waitJobs waits for each of js in turn (waitJob) and returns them as they
// ended.
func (g *globals) waitJobs(ctx context.Context, c *api.Client, js []jobs.Job) ([]jobs.Job, error) {
	for i, j := range js {
		var err error
		if js[i], err = g.waitJob(ctx, c, j.ID); err != nil {
			return js, err
		}
	}
	return js, nil
}
