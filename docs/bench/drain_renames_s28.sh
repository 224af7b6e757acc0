#!/bin/bash
# The drain of 5,000 renamed files beside 60,000 kept ones (twenty-eighth session, by hand:
# not a benchmark). Needs docs/bench/phases.c built as /tmp/u/ph (gcc -O2 -o /tmp/u/ph
# docs/bench/phases.c) and tierstack on PATH; BACKING /var/tmp/ub, mount point /var/tmp/um.
rm -rf /var/tmp/ub; mkdir -p /var/tmp/ub; tierstack mount /var/tmp/ub /var/tmp/um | tail -1
for k in 1 2 3; do tierstack exec /var/tmp/um -- /tmp/u/ph /var/tmp/um/keep$k 20000 c; done
tierstack exec /var/tmp/um -- /tmp/u/ph /var/tmp/um/z 5000 c
timeout 600 tierstack drain /var/tmp/um --wait
tierstack exec /var/tmp/um -- /tmp/u/ph /var/tmp/um/z 5000 m
/usr/bin/time -f "drain of the renames %e s" timeout 900 tierstack drain /var/tmp/um --wait
ls /var/tmp/ub/z | grep -c '^g'
tierstack umount /var/tmp/um | tail -1
