#!/bin/bash
#SBATCH --job-name=tierstack-example
#SBATCH --nodes=1
# A 1 GiB tierstack burst buffer: /pfs/me/inputs is staged into it before the job starts,
# everything the job leaves in it goes to /pfs/me/results after the job (the node is free
# by then). mode=async: fsync returns when data is in DRAM (faster checkpoints).
#BB_LUA pool=tierstack capacity=1G stage_in=/pfs/me/inputs stage_out=/pfs/me/results mode=sync

cd "$TIERSTACK_DIR"
ls -l
./my_solver --input mesh.h5 --checkpoint-dir "$TIERSTACK_DIR/ckpt"
