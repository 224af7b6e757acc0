# Ad hoc diagnostic (not a tierstack bench command): N processes each write MB x 1 MiB into
# a new file under DIR (a mount), fsync and close, three times; prints when the last
# write and the last fsync ended. Usage: writers_fsync.py N MB DIR
import os,time,sys
from multiprocessing import Process, Barrier
N=int(sys.argv[1]); MB=int(sys.argv[2]); D=sys.argv[3]
b=Barrier(N)
def rank(i,r,q):
    buf=os.urandom(1<<20)
    b.wait()
    t0=time.time()
    fd=os.open(f'{D}/f{r}_{i}',os.O_CREAT|os.O_WRONLY|os.O_TRUNC,0o644)
    for _ in range(MB): os.write(fd,buf)
    t1=time.time(); os.fsync(fd); t2=time.time(); os.close(fd)
    q.put((i,t0,t1,t2))
import multiprocessing as mp
for r in range(3):
    q=mp.Queue()
    ps=[Process(target=rank,args=(i,r,q)) for i in range(N)]
    [p.start() for p in ps]; [p.join() for p in ps]
    res=[q.get() for _ in range(N)]
    s=min(x[1] for x in res); w=max(x[2] for x in res); e=max(x[3] for x in res)
    print(f"rep {r}: writes end +{w-s:.3f}s, fsync end +{e-s:.3f}s, {N*MB/(e-s):.0f} MiB/s")
    for i in range(N): os.unlink(f'{D}/f{r}_{i}')
    time.sleep(1.5)
