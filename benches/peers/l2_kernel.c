/* The 1024-d squared-L2 loop of memwal's AVX2 kernel (four accumulators,
 * 32 floats per step), in C, as a yardstick for the Rust kernel's
 * criterion figure on the same machine. Prints ns per distance.
 *
 *   gcc -O3 -mavx2 -mfma benches/peers/l2_kernel.c -o /tmp/l2_kernel && /tmp/l2_kernel
 */
#include <immintrin.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
__attribute__((noinline)) float l2(const float* a, const float* b, int n) {
  __m256 s0=_mm256_setzero_ps(),s1=s0,s2=s0,s3=s0;
  for (int i=0;i<n;i+=32){
    __m256 d0=_mm256_sub_ps(_mm256_loadu_ps(a+i),_mm256_loadu_ps(b+i)); s0=_mm256_fmadd_ps(d0,d0,s0);
    __m256 d1=_mm256_sub_ps(_mm256_loadu_ps(a+i+8),_mm256_loadu_ps(b+i+8)); s1=_mm256_fmadd_ps(d1,d1,s1);
    __m256 d2=_mm256_sub_ps(_mm256_loadu_ps(a+i+16),_mm256_loadu_ps(b+i+16)); s2=_mm256_fmadd_ps(d2,d2,s2);
    __m256 d3=_mm256_sub_ps(_mm256_loadu_ps(a+i+24),_mm256_loadu_ps(b+i+24)); s3=_mm256_fmadd_ps(d3,d3,s3);
  }
  __m256 s=_mm256_add_ps(_mm256_add_ps(s0,s1),_mm256_add_ps(s2,s3));
  float o[8]; _mm256_storeu_ps(o,s); return o[0]+o[1]+o[2]+o[3]+o[4]+o[5]+o[6]+o[7];
}
int main(){ int n=1024; float*a=aligned_alloc(64,4096),*b=aligned_alloc(64,4096);
 for(int i=0;i<n;i++){a[i]=i*0.001f;b[i]=1.0f-i*0.0005f;}
 struct timespec t0,t1; volatile float sink=0; long it=2000000;
 clock_gettime(CLOCK_MONOTONIC,&t0); for(long k=0;k<it;k++){ sink+=l2(a,b,n); } clock_gettime(CLOCK_MONOTONIC,&t1);
 printf("%.1f ns\n", ((t1.tv_sec-t0.tv_sec)*1e9+(t1.tv_nsec-t0.tv_nsec))/it); }
