#!/bin/sh
# tierstack slurm install: SLURM Prolog (slurm.conf: Prolog=<this file>), written by
# `tierstack slurm install`. On each compute node of a job with `#BB_LUA node_local=SIZE`, it
# mounts a tierstack buffer for the job (the job's $TIERSTACK_DIR) and stages its inputs in.
# Jobs without node_local= are left alone. A failure here drains the node (SLURM's rule for
# Prolog errors); the job's user's access is checked earlier, by the setup hook.
PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
export PATH
exec @TIERSTACK@ slurm prolog --fast-dir @FAST_DIR@ --pool-size @POOL_SIZE@ \
	--timeout @STAGE_TIMEOUT@@DRAIN_RATE@
