// where clusters land: SM of every CTA, for 16-CTA clusters (one GPC each) and for v9's launch
#include <cstdio>
#include <cstdlib>
#include <cuda_runtime.h>
#define CK(x) do{cudaError_t e=(x); if(e){printf("err %s line %d\n",cudaGetErrorString(e),__LINE__); exit(1);}}while(0)
__global__ void k(int* out, long long spin){
  extern __shared__ char s[];
  unsigned sm, cid, cr; long long t;
  asm volatile("mov.u32 %0, %%smid;":"=r"(sm));
  asm volatile("mov.u32 %0, %%clusterid.x;":"=r"(cid));
  asm volatile("mov.u32 %0, %%cluster_ctarank;":"=r"(cr));
  asm volatile("mov.u64 %0, %%globaltimer;":"=l"(t));
  if(threadIdx.x==0){ out[blockIdx.x*4]=sm; out[blockIdx.x*4+1]=cid; out[blockIdx.x*4+2]=cr; out[blockIdx.x*4+3]=(int)(t/1000);
    s[0]=1; }
  long long t0=clock64(); while(clock64()-t0<spin);
}
int run(int cs, int grid, int threads, int smem, int reps){
  int* d; CK(cudaMalloc(&d, grid*16)); int* h=(int*)malloc(grid*16);
  CK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  CK(cudaFuncSetAttribute(k, cudaFuncAttributeNonPortableClusterSizeAllowed, 1));
  for(int r=0;r<reps;r++){
    cudaLaunchConfig_t c={}; c.gridDim=dim3(grid); c.blockDim=dim3(threads); c.dynamicSmemBytes=smem;
    cudaLaunchAttribute a[1]; a[0].id=cudaLaunchAttributeClusterDimension; a[0].val.clusterDim.x=cs; a[0].val.clusterDim.y=1; a[0].val.clusterDim.z=1;
    c.attrs=a; c.numAttrs=1;
    CK(cudaLaunchKernelEx(&c, k, d, (long long)2000000)); CK(cudaDeviceSynchronize());
    CK(cudaMemcpy(h, d, grid*16, cudaMemcpyDeviceToHost));
    printf("RUN cs=%d grid=%d rep=%d\n", cs, grid, r);
    for(int b=0;b<grid;b++) printf("%d %d %d %d %d\n", b, h[b*4], h[b*4+1], h[b*4+2], h[b*4+3]);
  }
  return 0;
}
int main(){
  int n; CK(cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, 0)); printf("SMS %d\n", n);
  run(16, 16*8, 128, 200*1024, 12);
  run(2, 132, 384, 225*1024, 4);
  return 0;
}
