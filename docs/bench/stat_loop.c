#include <sys/stat.h>
#include <stdio.h>
#include <time.h>
#include <fcntl.h>
#include <unistd.h>
int main(int c, char**v){struct stat s; int N=atoi(v[2]); struct timespec a,b;
close(open(v[1],O_CREAT|O_WRONLY,0644));
clock_gettime(CLOCK_MONOTONIC,&a);
for(int i=0;i<N;i++) stat(v[1],&s);
clock_gettime(CLOCK_MONOTONIC,&b);
printf("%.2f us per stat\n",((b.tv_sec-a.tv_sec)*1e9+(b.tv_nsec-a.tv_nsec))/N/1000.0);}
