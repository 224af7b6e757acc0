/* One phase of a small-file job, timed: PHASE c (create and write 100 bytes), s (stat),
   r (open, read, close), u (unlink) or m (rename DIR/fI to DIR/gI) on N files DIR/f0.. ; an optional START (epoch
   seconds) waits for that time first, so that several copies start together.
   Usage: ph DIR N PHASE [START]. Twenty-seventh session, by hand (m: twenty-eighth). */
#include <stdio.h>
#include <stdlib.h>
#include <fcntl.h>
#include <unistd.h>
#include <string.h>
#include <time.h>
#include <sys/stat.h>
static double now(){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
int main(int c,char**v){ const char*d=v[1]; int n=atoi(v[2]); char ph=v[3][0]; char p[4096]; char buf[100]; memset(buf,'x',100);
 if(c>4){double at=atof(v[4]); struct timespec r; for(;;){clock_gettime(CLOCK_REALTIME,&r); if(r.tv_sec+r.tv_nsec*1e-9>=at)break; usleep(200);} }
 double t0=now();
 for(int i=0;i<n;i++){snprintf(p,sizeof p,"%s/f%d",d,i);
  if(ph=='c'){ if(i==0) mkdir(d,0755); int fd=open(p,O_CREAT|O_WRONLY|O_TRUNC,0644); if(fd<0){perror("open");return 1;} write(fd,buf,100); close(fd);}
  else if(ph=='s'){struct stat st; stat(p,&st);}
  else if(ph=='r'){int fd=open(p,O_RDONLY); read(fd,buf,100); close(fd);}
  else if(ph=='u'){ if(unlink(p)){perror("unlink");return 1;}}
  else if(ph=='m'){char q[4096]; snprintf(q,sizeof q,"%s/g%d",d,i); if(rename(p,q)){perror("rename");return 1;}}}
 double t1=now();
 printf("%c %.0f %.3f\n", ph, n/(t1-t0), t1-t0);
 return 0;}
