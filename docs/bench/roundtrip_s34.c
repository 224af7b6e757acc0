#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <fcntl.h>
#include <unistd.h>
#include <time.h>
#include <sys/stat.h>
static double now(){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
int main(int argc,char**argv){
  const char*dir=argv[1]; int n=argc>2?atoi(argv[2]):20000;
  char p[4096]; snprintf(p,sizeof p,"%s/rt_file",dir);
  int fd=open(p,O_WRONLY|O_CREAT|O_TRUNC,0644); if(fd<0){perror("open");return 1;}
  double t=now();
  for(int i=0;i<n;i++) fchmod(fd, (i&1)?0644:0600);
  double a=now(); printf("fchmod %.2f us\n",(a-t)/n*1e6);
  char buf[100]={0};
  t=now(); for(int i=0;i<n;i++) pwrite(fd,buf,100,0); a=now(); printf("pwrite100 %.2f us\n",(a-t)/n*1e6);
  struct timespec ts[2]={{0,UTIME_OMIT},{1600000000,0}};
  t=now(); for(int i=0;i<n;i++) futimens(fd,ts); a=now(); printf("futimens %.2f us\n",(a-t)/n*1e6);
  close(fd);
  t=now(); for(int i=0;i<n/4;i++){ snprintf(p,sizeof p,"%s/c%d",dir,i); int f=open(p,O_WRONLY|O_CREAT|O_EXCL,0600); write(f,buf,100); futimens(f,ts); fchown(f,0,0); fchmod(f,0644); close(f);} a=now();
  printf("tar-like file %.2f us\n",(a-t)/(n/4)*1e6);
  t=now(); for(int i=0;i<n/4;i++){ snprintf(p,sizeof p,"%s/c%d",dir,i); unlink(p);} a=now();
  printf("unlink %.2f us\n",(a-t)/(n/4)*1e6);
  return 0;}
