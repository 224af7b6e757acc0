#!/bin/sh
# tierstack slurm install: SLURM Epilog (slurm.conf: Epilog=<this file>), written by
# `tierstack slurm install`. On each compute node, it hands the drain of the job's node-local
# buffer to a background process and returns, so the node is released while the outputs
# still go to the stage_out destination; drains that were interrupted are started again.
PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
export PATH
exec @TIERSTACK@ slurm epilog --fast-dir @FAST_DIR@ --pool-size @POOL_SIZE@ \
	--timeout @STAGE_TIMEOUT@@DRAIN_RATE@
