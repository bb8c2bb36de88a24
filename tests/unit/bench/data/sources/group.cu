// Two kernels' header lines as the inductor writes them into a generated CUDA source.
// kiln_k4: flat bf16[64,256,384], 1 stage; grid 2112, block 256
KILN_KERNEL(256) kiln_k4() {}
// kiln_k5: flat bf16[64,256,1536], 2 stages; grid 2112, block 256
KILN_KERNEL(256) kiln_k5() {}
