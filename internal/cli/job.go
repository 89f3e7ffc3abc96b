package cli

import (
	"fmt"
	"io"
	"net/url"
	"strconv"

	"github.com/spf13/cobra"

	"github.com/pgtenant/pgtenant/internal/jobs"
)

func newJobCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{Use: "job", Short: "Inspect, cancel and retry durable jobs"}
	var state, typ, target string
	var limit int
	list := &cobra.Command{
		Use: "list", Short: "List jobs, newest first", Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := oneOf("--state", jobs.State(state), jobs.FilterStates...); err != nil {
				return err
			}
			if err := oneOf("--type", jobs.Type(typ), jobs.Types...); err != nil {
				return err
			}
			c, err := g.client()
			if err != nil {
				return err
			}
			v := url.Values{"limit": {strconv.Itoa(limit)}}
			if state != "" {
				v.Set("state", state)
			}
			if typ != "" {
				v.Set("type", typ)
			}
			if target != "" {
				v.Set("target", target)
			}
			out, err := c.Jobs(cmd.Context(), v)
			if err != nil {
				return err
			}
			return g.print(out, func(w io.Writer) {
				row(w, "ID", "TYPE", "TARGET", "CLUSTER", "STATE", "ATTEMPTS", "PROGRESS", "MESSAGE")
				for _, j := range out {
					row(w, j.ID, j.Type, j.TargetKind+":"+j.Target, j.Cluster, j.State, j.Attempts, fmt.Sprintf("%d/%d", j.ProgressDone, j.ProgressTotal), j.ProgressMsg)
				}
			})
		},
	}
	list.Flags().StringVar(&state, "state", "", "queued, running, waiting, paused, succeeded, failed, cancelled, or active (any unfinished)")
	list.Flags().StringVar(&typ, "type", "", "job type: "+join(jobs.Types))
	list.Flags().StringVar(&target, "target", "", "target as the TARGET column prints it (tenant:ID, template:NAME), or a bare id")
	list.Flags().IntVar(&limit, "limit", 50, "at most this many")

	byID := func(use, short string, do func(cmd *cobra.Command, id int64) (jobs.Job, error)) *cobra.Command {
		return &cobra.Command{Use: use + " ID", Short: short, Args: cobra.ExactArgs(1),
			RunE: func(cmd *cobra.Command, args []string) error {
				id, err := strconv.ParseInt(args[0], 10, 64)
				if err != nil {
					return fmt.Errorf("job id %q: a number", args[0])
				}
				j, err := do(cmd, id)
				if err != nil {
					return err
				}
				return g.print(j, func(w io.Writer) { jobDetail(w, j) })
			}}
	}
	var wait bool
	show := byID("show", "Show a job with its completed steps (--wait follows it)", func(cmd *cobra.Command, id int64) (jobs.Job, error) {
		c, err := g.client()
		if err != nil {
			return jobs.Job{}, err
		}
		if wait {
			if _, err := g.waitJob(cmd.Context(), c, id); err != nil {
				return jobs.Job{}, err
			}
		}
		return c.Job(cmd.Context(), id)
	})
	show.Flags().BoolVar(&wait, "wait", false, "follow the job with a progress bar until it ends")
	cancel := byID("cancel", "Cancel a job (a running one stops at its next step and cleans up)", func(cmd *cobra.Command, id int64) (jobs.Job, error) {
		c, err := g.client()
		if err != nil {
			return jobs.Job{}, err
		}
		return c.CancelJob(cmd.Context(), id)
	})
	retry := byID("retry", "Retry a failed or cancelled job", func(cmd *cobra.Command, id int64) (jobs.Job, error) {
		c, err := g.client()
		if err != nil {
			return jobs.Job{}, err
		}
		return c.RetryJob(cmd.Context(), id)
	})
	cmd.AddCommand(list, show, cancel, retry)
	return cmd
}

func jobDetail(w io.Writer, j jobs.Job) {
	row(w, "id", j.ID)
	row(w, "type", j.Type)
	row(w, "target", j.TargetKind+":"+j.Target)
	row(w, "cluster", j.Cluster)
	row(w, "state", j.State)
	row(w, "attempts", fmt.Sprintf("%d of %d", j.Attempts, j.MaxAttempts))
	row(w, "progress", fmt.Sprintf("%d/%d %s", j.ProgressDone, j.ProgressTotal, j.ProgressMsg))
	if j.LastError != "" {
		row(w, "last_error", j.LastError)
	}
	if j.LeaseOwner != "" {
		row(w, "lease_owner", j.LeaseOwner)
	}
	for _, s := range j.Steps {
		row(w, "step "+s.Step, fmt.Sprintf("done by %s in %s", s.Worker, s.FinishedAt.Sub(s.StartedAt).Round(1e6)))
	}
}
