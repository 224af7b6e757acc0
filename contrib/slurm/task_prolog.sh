#!/bin/sh
# tierstack slurm install: SLURM TaskProlog (slurm.conf: TaskProlog=<this file>), written by
# `tierstack slurm install`. slurmd runs it as the job's user before each task; for a job with
# a tierstack buffer ($TIERSTACK_DIR) it prints the `export` lines that preload tierstack's
# interception client (libtierstack_io.so) for the buffer, as `tierstack exec` does. A job
# turns it off with `#BB_LUA io=off` or TIERSTACK_IO_OFF=1 in its environment. It never fails
# a task: problems go to stderr (slurmd's log) and the task runs without the client.
[ -n "$TIERSTACK_DIR" ] || exit 0
@TIERSTACK@ slurm task-prolog
exit 0
