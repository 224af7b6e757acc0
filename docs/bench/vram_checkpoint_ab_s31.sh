#!/bin/bash
# bench checkpoint --vram 8G: the build with drives sized to the fast tiers, against ce4455e's
# Run on the lent GPU machine with .dev/ holding the stripped release binaries of this
# build (tierstack) and of ce4455e (tierstack_old); output in h200_2026-11-29_checkpoint_*.txt.
set -u
mkdir -p /tmp/bk /tmp/nb /tmp/nm
for r in 1 2; do for b in tierstack tierstack_old; do
  rm -rf /tmp/bk/*
  echo "== $b round $r"
  timeout 60 .dev/$b bench checkpoint --procs 8 --file-size 512M --backing /tmp/bk --dir /tmp --dram 512M --vram 8G --json 2>&1 | tail -1
done; done
echo "== note for explicit small drives"
timeout 30 .dev/tierstack mount /tmp/nb /tmp/nm --dir /tmp/nf --vram 8G --dram 512M --drive-size 2G; timeout 30 .dev/tierstack status /tmp/nm --json | grep -o '"limit_bytes":[0-9]*'; timeout 60 .dev/tierstack umount /tmp/nm
