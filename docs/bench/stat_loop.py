"""Rate of os.stat on each path given (the smallio loop's stat phase, one file).

Usage: python3 stat_loop.py CALLS PATH [PATH...]; prints one line per path.
"""
import os
import sys
import time

calls = int(sys.argv[1])
for path in sys.argv[2:]:
    os.stat(path)
    t = time.perf_counter()
    for _ in range(calls):
        os.stat(path)
    dt = time.perf_counter() - t
    print(f"python os.stat {path}: {calls / dt:,.0f} /s ({dt / calls * 1e6:.2f} us)")
