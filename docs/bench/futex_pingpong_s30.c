#include <stdio.h>
#include <pthread.h>
#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <stdatomic.h>
#include <time.h>
static _Atomic int w=0; 
static void fw(int v){ while(atomic_load(&w)!=v) syscall(SYS_futex,&w,FUTEX_WAIT,1-v+ (v==0?0:0),0,0,0);} 
static double now(){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
#define N 20000
static void* th(void*a){ for(int i=0;i<N;i++){ while(atomic_load(&w)!=1) syscall(SYS_futex,&w,FUTEX_WAIT,0,0,0,0); atomic_store(&w,0); syscall(SYS_futex,&w,FUTEX_WAKE,1,0,0,0);} return 0;}
int main(){ pthread_t t; pthread_create(&t,0,th,0); double t0=now(); for(int i=0;i<N;i++){ atomic_store(&w,1); syscall(SYS_futex,&w,FUTEX_WAKE,1,0,0,0); while(atomic_load(&w)!=0) syscall(SYS_futex,&w,FUTEX_WAIT,1,0,0,0);} double t1=now(); printf("round trip %.1f us\n",(t1-t0)/N*1e6); return 0;}
